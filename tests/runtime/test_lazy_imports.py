"""A hub start loads only what serving needs: cryptography (~14 MB of RSS) only when it makes its certificates
(the first start), fsspec (~15 MB) only for an upload transport, and never the test doubles of edgehub.testing
(~0.9 MB; ``edgehub link-sim`` loads its simulator when it runs), nor python-qpid-proton until the hub serves
AMQP (``--no-amqp`` runs without it: it has no aarch64 wheel). A serving hub never loads pydantic, the manifest's
models or lark (~15 MB): its deployments are checked in a child process, at start and on each live update.
Checked in a fresh interpreter, since this one has loaded them all for other tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from edgehub.runtime.certs import ensure_certs

PROBE = """
import sys
from pathlib import Path
import edgehub.runtime.cli
from edgehub.runtime.certs import ensure_certs, server_ssl_context
server_ssl_context(ensure_certs(Path(sys.argv[1])))
print(sorted(m for m in ("cryptography", "fsspec", "edgehub.testing", "proton") if m in sys.modules))
"""


def loaded_by_a_start(certs: Path) -> str:
    out = subprocess.run([sys.executable, "-c", PROBE, str(certs)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_a_start_with_certificates_in_place_loads_neither_cryptography_nor_fsspec_nor_the_test_doubles(
    tmp_path: Path,
) -> None:
    assert ensure_certs(tmp_path / "certs").created
    assert loaded_by_a_start(tmp_path / "certs") == "[]"


def test_the_first_start_loads_cryptography_to_make_its_certificates(tmp_path: Path) -> None:
    assert loaded_by_a_start(tmp_path / "certs") == "['cryptography']"
    assert (tmp_path / "certs" / "ca.pem").is_file()


SERVING = """
import asyncio, json, sys
from pathlib import Path
import edgehub.runtime.cli  # all that edgehub run imports
from edgehub.runtime.admin_client import AdminClient
from edgehub.runtime.admin_files import read_token
from edgehub.runtime.hub_runtime import HubConfig, serve

HEAVY = ("pydantic", "pydantic_core", "lark", "edgehub.manifest.models", "edgehub.routing.parser")
manifest, data = Path(sys.argv[1]), Path(sys.argv[2])
answers = []


def put(client: AdminClient, routes: dict[str, str]) -> object:
    return client.request("PUT", "/twin/desired", {"schemaVersion": "1.1", "routes": routes}, ok=(200, 400))[1]


async def update(stop: asyncio.Event, port: int) -> None:
    try:
        client = AdminClient(port, read_token(data) or "")
        answers.append(await asyncio.to_thread(put, client, {"b": "FROM /messages/* WHERE a = 'x' INTO $upstream"}))
        answers.append(await asyncio.to_thread(put, client, {"c": "FROM /messages/* WHERE a = INTO $upstream"}))
    finally:
        stop.set()


async def main() -> None:
    stop = asyncio.Event()
    tasks = []
    config = HubConfig(manifest=manifest, data_dir=data, mqtt_port=0, mqtts_port=None, admin_port=0)
    await serve(config, stop=stop, on_ready=lambda p: tasks.append(asyncio.create_task(update(stop, p["admin"]))))
    await asyncio.gather(*tasks)


asyncio.run(main())
print(json.dumps({"loaded": sorted(m for m in HEAVY if m in sys.modules), "answers": answers}))
"""


def test_a_serving_hub_applies_and_refuses_deployments_without_loading_pydantic_or_lark(tmp_path: Path) -> None:
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"schemaVersion": "1.1", "routes": {"a": "FROM /* INTO $upstream"}}))
    args = [sys.executable, "-c", SERVING, str(manifest), str(tmp_path / "data")]
    out = subprocess.run(args, capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    applied, refused = seen["answers"]
    assert applied["code"] == 200, applied
    assert refused["code"] == 400
    assert any(e.startswith("routes.c: ") for e in refused["errors"]), refused
    assert seen["loaded"] == []
