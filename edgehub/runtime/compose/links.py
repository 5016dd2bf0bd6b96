"""From the manifest's ``upstream.links`` to one ``LinkedUpstream`` per upstream lane: each link's transport
settings, its secrets read from the environment or a file, its ``LinkSpec``, and the budget ledger in the data
directory (``DATA_DIR/links/budget.json``) all lanes share.

Each MQTT link's settings are the hub's upstream settings (``--upstream-mqtt`` with the manifest's ``upstream``
keys and the flags applied: whatever those carry, TLS, WebSockets or a proxy included, flows through unchanged) with
the link's own keys over them: address, client id, credentials, TLS files, keepalive, ack timeout and link hints.
With no ``--upstream-mqtt`` they start from the transport's defaults. The first link connects as the hub's client
id, each other as ``{client id}-{link name}`` unless it names its own (links are connected at the same time, and a
broker keeps one connection per client id).

Invariants: a secret the manifest names but the environment or file does not hold stops the start with the link's
name (``ConfigurationError``), never a link that connects without it; secrets never leave this module but in the
transport settings.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from edgehub.core import ConfigurationError
from edgehub.core.priorities import format_priorities, parse_priorities
from edgehub.delivery import Endpoint
from edgehub.runtime.compose.config import UploadUpstreamSettings
from edgehub.runtime.compose.upstream import lane_settings, upload_dictionary_lane, upload_lane
from edgehub.store import Store
from edgehub.upstream.budget import Budget, BudgetLedger, Period, describe_budgets
from edgehub.upstream.dictionary import LaneDictionary
from edgehub.upstream.landing import shown_url
from edgehub.upstream.links import LinkedUpstream, LinkSpec
from edgehub.upstream.mqtt.settings import MqttProtocol, MqttUpstreamSettings, TlsSettings
from edgehub.upstream.mqtt.transport import MqttUpstream

__all__ = [
    "BUDGET_FILE",
    "budget_ledger",
    "build_linked_lanes",
    "link_spec",
    "link_transport_settings",
    "linked_lanes",
    "missing_secrets",
    "read_secret",
]

log = logging.getLogger(__name__)

BUDGET_FILE = Path("links") / "budget.json"
MAX_SECRET_BYTES = 64 * 1024


def read_secret(link: str, what: str, env_name: str | None, file: str | None, env: Mapping[str, str]) -> str | None:
    """The secret named by ``env_name`` or ``file`` (None when neither is given); ``ConfigurationError`` naming the
    link when it is not there. A file's trailing newline is not part of the secret."""
    if env_name is not None:
        value = env.get(env_name)
        if not value:
            raise ConfigurationError(f"upstream.links {link!r}: {what} environment variable {env_name} is not set")
        return value
    if file is not None:
        try:
            with open(file, "rb") as f:
                data = f.read(MAX_SECRET_BYTES + 1)
        except OSError as exc:
            raise ConfigurationError(f"upstream.links {link!r}: {what} file {file}: {exc.strerror}") from exc
        if len(data) > MAX_SECRET_BYTES:
            raise ConfigurationError(f"upstream.links {link!r}: {what} file {file} is over {MAX_SECRET_BYTES} bytes")
        try:
            return data.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError as exc:
            raise ConfigurationError(f"upstream.links {link!r}: {what} file {file} is not UTF-8") from exc
    return None


def missing_secrets(links: Sequence[Mapping[str, Any]], env: Mapping[str, str]) -> list[str]:
    """Each secret the checked ``links`` name that ``env`` or its file does not hold, with its path in the manifest
    (``upstream.links.0.passwordEnv: ...``): a deployment naming one would stop the next start."""
    out = []
    for i, link in enumerate(links):
        for what, env_key, file_key in (
            ("password", "passwordEnv", "passwordFile"),
            ("SAS token", "sasTokenEnv", "sasTokenFile"),
        ):
            try:
                read_secret(link["name"], what, link.get(env_key), link.get(file_key), env)
            except ConfigurationError as exc:
                key = env_key if link.get(env_key) is not None else file_key
                out.append(f"upstream.links.{i}.{key}: {exc}")
    return out


def link_spec(link: Mapping[str, Any]) -> LinkSpec:
    """The ``LinkSpec`` of one checked ``upstream.links`` entry (its ``budget`` one object or a list of them)."""
    budget = link.get("budget")
    over = link.get("allowedOverBudget")
    budgets = budget if isinstance(budget, list) else [budget] if budget else []
    return LinkSpec(
        name=link["name"],
        cost_per_mib=float(link.get("costPerMiB", 0)),
        budgets=tuple(Budget(int(b["bytes"]), Period(b["period"]), int(b.get("startHourUtc", 0))) for b in budgets),
        priorities=parse_priorities(link.get("priorities") or "0-10"),
        over_budget=parse_priorities(over) if over else frozenset(),
        settle_s=float(link.get("settleSecs", 10)),
        tls=bool(link.get("tls")) or link.get("caFile") is not None or link.get("certFile") is not None,
    )


def link_transport_settings(
    link: Mapping[str, Any],
    base: MqttUpstreamSettings | UploadUpstreamSettings | None,
    *,
    first: bool,
    env: Mapping[str, str],
) -> MqttUpstreamSettings | UploadUpstreamSettings:
    """One link's transport settings over ``base`` (see the module docstring)."""
    name = link["name"]
    hub_id = base.hub_id if base is not None else "edgehub"
    if link.get("transport", "mqtt") == "upload":
        upload = base if isinstance(base, UploadUpstreamSettings) else UploadUpstreamSettings(url=link["url"])
        cap = link.get("maxUplinkBps")
        return replace(
            upload, url=link["url"], hub_id=hub_id, max_uplink_bps=float(cap) if cap else upload.max_uplink_bps
        )
    host, _, port = str(link["address"]).rpartition(":")
    mqtt = (
        base
        if isinstance(base, MqttUpstreamSettings)
        else MqttUpstreamSettings(host=host, client_id=hub_id, hub_id=hub_id)
    )
    client_id = link.get("clientId") or (mqtt.client_id if first else f"{mqtt.client_id}-{name}")
    changes: dict[str, Any] = {"host": host, "port": int(port), "client_id": client_id}
    if link.get("username") is not None:
        changes["username"] = link["username"]
    password = read_secret(name, "password", link.get("passwordEnv"), link.get("passwordFile"), env)
    if password is not None:
        changes["password"] = password
    sas = read_secret(name, "SAS token", link.get("sasTokenEnv"), link.get("sasTokenFile"), env)
    if sas is not None:
        changes["sas_token"] = sas
    if link.get("tls") or link.get("caFile") or link.get("certFile"):
        changes["tls"] = TlsSettings(
            ca_certs=link.get("caFile"), certfile=link.get("certFile"), keyfile=link.get("keyFile")
        )
    for key, field_name, per in (
        ("keepaliveSecs", "keepalive_s", None),
        ("ackTimeoutSecs", "ack_timeout_s", 1),
        ("linkRateBps", "link_rate_bps", 1),
        ("linkRttMs", "link_rtt_s", 1000),
        ("maxUplinkBps", "max_uplink_bps", 1),
    ):
        value = link.get(key)
        if value is not None:
            changes[field_name] = int(value) if per is None else float(value) / per
    if link.get("protocol") is not None:
        changes["protocol"] = MqttProtocol(link["protocol"])
    try:
        return replace(mqtt, **changes)
    except ValueError as exc:
        raise ConfigurationError(f"upstream.links {name!r}: {exc}") from exc


def budget_ledger(data_dir: Path | None, specs: Sequence[LinkSpec]) -> BudgetLedger:
    """The ledger of ``specs`` in ``data_dir`` (None: in memory)."""
    path = data_dir / BUDGET_FILE if data_dir is not None else None
    return BudgetLedger(path, {s.name: (s.budgets, s.cost_per_mib) for s in specs})


def build_linked_lanes(
    links: Sequence[Mapping[str, Any]],
    base: MqttUpstreamSettings | UploadUpstreamSettings | None,
    lane_ids: Sequence[str],
    *,
    store: Store | None,
    data_dir: Path | None,
    env: Mapping[str, str] | None = None,
) -> list[LinkedUpstream]:
    """One ``LinkedUpstream`` per lane in ``lane_ids``, every link's transport inside it, none started yet (nothing
    connects or writes before ``start``: what a start would run can be read first)."""
    env = os.environ if env is None else env
    specs = [link_spec(link) for link in links]
    settings = [link_transport_settings(link, base, first=i == 0, env=env) for i, link in enumerate(links)]
    ledger = budget_ledger(data_dir, specs)
    for spec, s in zip(specs, settings, strict=True):
        if isinstance(s, UploadUpstreamSettings):
            where = shown_url(s.url)
        else:
            where = f"{s.host}:{s.port} client_id={s.client_id}"
        log.info(
            "runtime.link link=%s to=%s cost_per_mib=%s priorities=%s budget=%s used_bytes=%d",
            spec.name,
            where,
            spec.cost_per_mib,
            format_priorities(spec.priorities),
            describe_budgets(spec.budgets),
            ledger.used_bytes(spec.name),
        )
    lanes: list[LinkedUpstream] = []
    for lane_id in lane_ids:
        dictionary = _lane_dictionary(settings[0], lane_id, store)
        transports: list[tuple[LinkSpec, Endpoint]] = []
        for i, (spec, s) in enumerate(zip(specs, settings, strict=True)):
            side = None if i == 0 else spec.name  # the first link is the far side a single upstream always had
            if isinstance(s, UploadUpstreamSettings):
                transports.append((spec, upload_lane(s, lane_id, dictionary=dictionary, side=side)))
                continue
            transport = MqttUpstream(lane_settings(s, lane_id), keeper=store, dictionary=dictionary, side=side)
            transports.append((spec, transport))
        lanes.append(LinkedUpstream(transports, ledger, endpoint_id=lane_id))
    return lanes


def _lane_dictionary(
    first: MqttUpstreamSettings | UploadUpstreamSettings, lane_id: str, store: Store | None
) -> LaneDictionary:
    """The zstd dictionary all links of a lane share (each link uses it if its codec is zstd), kept in the store
    under the name the first link's transport alone would give it: a hub that gets links keeps its dictionary."""
    if isinstance(first, UploadUpstreamSettings):
        name = upload_dictionary_lane(lane_id)
    else:
        name = lane_settings(first, lane_id).lane
    return LaneDictionary(lane=name, keeper=store)


async def linked_lanes(
    links: Sequence[Mapping[str, Any]],
    base: MqttUpstreamSettings | UploadUpstreamSettings | None,
    lane_ids: Sequence[str],
    *,
    store: Store | None,
    data_dir: Path | None,
    env: Mapping[str, str] | None = None,
) -> list[Endpoint]:
    """``build_linked_lanes``, each lane started."""
    lanes = build_linked_lanes(links, base, lane_ids, store=store, data_dir=data_dir, env=env)
    for lane in lanes:
        await lane.start()
    return list(lanes)
