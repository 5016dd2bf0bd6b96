"""The first run: where ``$upstream`` goes when nobody said, and how a newcomer connects a device.

A hub started with no upstream flag lands ``$upstream`` as segment files in ``DATA/landing`` (``edgehub run``'s
default; ``--upstream-mqtt`` or ``--upstream-upload`` choose another target, ``--no-upstream`` keeps messages
queued in the store), so the whole path - device, route, store, upstream, landing zone, ``make ingest`` - shows
on a fresh machine without a broker or a cloud account.

At start the hub prints ``connect_help``: the CA file, the ``edgehub identity add`` command that makes a device,
and one ``mosquitto_pub`` line and one paho line that publish a message as printed. The password of both is a SAS
token made from the device's connection string by ``edgehub sas-token`` (no store needed: the token is signed
with the key the connection string holds).

Invariant: the printed commands name the hub's real port, CA file, data directory and host name, quoted for a
POSIX shell, so they work when pasted (``tests/e2e/test_first_run_e2e.py`` runs them).
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path

import click

from edgehub.core.sas import ConnectionString
from edgehub.core.units import parse_duration_s
from edgehub.runtime.compose.config import HubConfig, UploadUpstreamSettings

__all__ = ["DEMO_DEVICE", "connect_help", "connect_help_for", "default_landing", "edgehub_command", "sas_token"]

DEMO_DEVICE = "dev1"
API_VERSION = "2021-04-12"
# A token is a password: an hour is enough to try things out, a year is the hub's own limit.
_MAX_TOKEN_LIFETIME_S = 365 * 86_400


def default_landing(data_dir: Path) -> Path:
    """Where ``$upstream`` lands when no upstream flag is given."""
    return data_dir / "landing"


def edgehub_command(argv0: str | None = None) -> str:
    """How the user started ``edgehub`` (``.venv/bin/edgehub`` under ``make run``), so printed commands run the same
    installation; plain ``edgehub`` when it was started some other way (``python -m``, a test runner)."""
    argv0 = sys.argv[0] if argv0 is None else argv0
    return argv0 if Path(argv0).name == "edgehub" else "edgehub"


def connect_help(
    *,
    ports: dict[str, int],
    data_dir: Path,
    ca_pem: Path,
    host_name: str,
    upstream: str,
    edgehub: str = "edgehub",
    python: str | None = None,
) -> list[str]:
    """The lines that tell a newcomer how to connect a device to a hub serving on ``ports`` (``tls``/``tcp``) and
    where its messages go (``upstream``: a description of the ``$upstream`` target)."""
    q = shlex.quote
    device = DEMO_DEVICE
    cs_file = data_dir / f"{device}.connection"
    tls = "tls" in ports
    port = ports["tls"] if tls else ports.get("tcp")
    if port is None:
        return []
    user = f"{host_name}/{device}/?api-version={API_VERSION}"
    topic = f"devices/{device}/messages/events/"
    token = f'"$({q(edgehub)} sas-token < {q(str(cs_file))})"'
    mosquitto = [
        "mosquitto_pub",
        *(["--cafile", q(str(ca_pem))] if tls else []),
        *["-h", q(host_name), "-p", str(port), "-V", "mqttv311", "-q", "1", "-i", device],
        *["-u", q(user), "-P", token, "-t", q(topic), "-m", q('{"temperature": 21.5}')],
    ]
    # Python literals in double quotes (json.dumps), so that the shell's single quotes around the code stay plain.
    j = json.dumps
    tls_call = f"c.tls_set({j(str(ca_pem))}); " if tls else ""
    paho_code = (
        "import json, sys, paho.mqtt.client as m; "
        f"c = m.Client(m.CallbackAPIVersion.VERSION2, {j(device)}); c.username_pw_set({j(user)}, sys.argv[1]); "
        f"{tls_call}c.connect({j(host_name)}, {port}); c.loop_start(); "
        f"i = c.publish({j(topic)}, json.dumps({{{j('temperature')}: 22.5}}), qos=1); i.wait_for_publish(10); "
        'c.disconnect(); c.loop_stop(); print("published" if i.is_published() else "not acknowledged")'
    )
    paho = [q(python or sys.executable), "-c", q(paho_code), token]
    return [
        "first run: connect a device",
        f"  CA file: {ca_pem}" if tls else "  plain MQTT (no TLS)",
        f"  1. make device {device} (in another terminal; the running hub takes it at once):",
        f"     {q(edgehub)} identity add {device} --data-dir {q(str(data_dir))} > {q(str(cs_file))}",
        "  2. publish one message with mosquitto_pub, or with paho:",
        f"     {' '.join(mosquitto)}",
        f"     {' '.join(paho)}",
        f"  $upstream: {upstream}",
    ]


def connect_help_for(config: HubConfig, ports: dict[str, int], ca_pem: Path, *, edgehub: str) -> list[str]:
    """``connect_help`` for a hub serving ``config`` on ``ports``."""
    upstream = config.upstream
    if isinstance(upstream, UploadUpstreamSettings):
        target = f"lands in {upstream.url} (make ingest turns it into tables)"
    elif upstream is not None:
        target = f"mqtt {upstream.host}:{upstream.port}"
    else:
        target = "stays queued in the store (--no-upstream)"
    return connect_help(
        ports=ports,
        data_dir=config.data_dir,
        ca_pem=ca_pem,
        host_name=config.host_name,
        upstream=target,
        edgehub=edgehub,
    )


@click.command("sas-token")
@click.argument("connection_string", required=False)
@click.option(
    "--expires-in",
    default="1h",
    show_default=True,
    metavar="DURATION",
    help="How long the token is valid, e.g. 1h, 30m, 720h (at most a year).",
)
def sas_token(connection_string: str | None, expires_in: str) -> None:
    """Print a SAS token for the device or module of CONNECTION_STRING (read from stdin when not given), to use
    as the MQTT password."""
    text = connection_string if connection_string is not None else sys.stdin.read(8192)
    try:
        lifetime_s = parse_duration_s(expires_in)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--expires-in") from None
    if not 0 < lifetime_s <= _MAX_TOKEN_LIFETIME_S:
        raise click.BadParameter("must be more than 0 and at most a year", param_hint="--expires-in")
    try:
        cs = ConnectionString.parse(text)
        token = cs.sas_token(int(time.time() + lifetime_s))
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="CONNECTION_STRING") from None
    click.echo(token)
