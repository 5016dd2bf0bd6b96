"""``edgehub status [--json]`` and ``edgehub deadletter list|requeue|purge [--endpoint E]``: watching a hub and
handling its dead letters, the same whether it runs (through its admin API) or not (on its data directory).

A stopped hub's status has no rates, executor states, in-flight counts, upstream or clients (nothing runs to
have them), and its quota is the one ``edgehub run`` would take by default (``--store-quota`` is a flag of the
run, not kept in the store). Its links are what ``DATA_DIR/links/budget.json`` last held (``link_ledger``: bytes,
cost and budget left per link and period, a period that has since ended said so), or one line saying why there
are none (no such file, or one that cannot be read).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import click

from edgehub.runtime.admin.client import AdminClient
from edgehub.runtime.admin.deadletters import MAX_LIST, DeadLetterAdmin, DeadLetterError
from edgehub.runtime.admin.links import stopped_links_document
from edgehub.runtime.admin.status import collect_status, format_status
from edgehub.runtime.cli.identity import data_dir_option, on_hub
from edgehub.runtime.compose.config import HubLimits
from edgehub.runtime.compose.links import BUDGET_FILE
from edgehub.runtime.compose.store import open_store, store_path, store_quota

__all__ = ["deadletter", "status"]


def _query(endpoint: str | None) -> dict[str, str] | None:
    return {"endpoint": endpoint} if endpoint else None


@click.command()
@data_dir_option
@click.option("--json", "as_json", is_flag=True, default=False, help="One JSON document, for scripts.")
def status(data_dir: Path, as_json: bool) -> None:
    """Queues per endpoint and priority, dead letters, uplink, store use against its quota, time until full."""

    def online(client: AdminClient) -> dict[str, Any]:
        _, answer = client.request("GET", "/status")
        assert isinstance(answer, dict)
        return answer

    async def offline(path: Path) -> dict[str, Any]:
        store = open_store(path)
        try:
            store.store_quota = store_quota(store, store_path(path), HubLimits())
            doc = collect_status(store)
        finally:
            await store.close()
        doc["link_ledger"] = stopped_links_document(path / BUDGET_FILE, time.time())
        return doc

    doc = on_hub(data_dir, online, offline)
    if as_json:
        click.echo(json.dumps(doc, indent=2, sort_keys=True))
    else:
        for line in format_status(doc):
            click.echo(line)


@click.group()
def deadletter() -> None:
    """List, requeue or purge dead letters (the hub may be running)."""


endpoint_option = click.option("--endpoint", default=None, help="One endpoint (default: all).")


async def _on_store(path: Path, act: Any) -> Any:
    store = open_store(path)
    try:
        return await act(DeadLetterAdmin(store))
    finally:
        await store.close()


def _run(data_dir: Path, method: str, path: str, endpoint: str | None, act: Any, **query: str) -> Any:
    def online(client: AdminClient) -> Any:
        _, answer = client.request(method, path, query=(_query(endpoint) or {}) | query)
        return answer

    async def offline(p: Path) -> Any:
        return await _on_store(p, act)

    try:
        return on_hub(data_dir, online, offline)
    except DeadLetterError as exc:
        click.echo(f"edgehub: {exc}", err=True)
        raise SystemExit(1) from None


@deadletter.command("list")
@endpoint_option
@click.option("--limit", type=click.IntRange(1, MAX_LIST), default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True, default=False)
@data_dir_option
def list_dead(endpoint: str | None, limit: int, as_json: bool, data_dir: Path) -> None:
    """The dead letters, oldest first, with why each died."""

    async def act(admin: DeadLetterAdmin) -> dict[str, Any]:
        return {"dead_letters": admin.list(endpoint, limit)}

    answer = _run(data_dir, "GET", "/deadletters", endpoint, act, limit=str(limit))
    letters = answer["dead_letters"]
    if as_json:
        click.echo(json.dumps(answer, indent=2))
        return
    for d in letters:
        click.echo(
            f"{d['endpoint']} #{d['dlq_offset']} p{d['priority']} reason={d['reason']} attempts={d['attempts']} "
            f"bytes={d['body_bytes']} id={d['message_id'] or '-'} error={d['error'] or '-'}"
        )
    click.echo(f"{len(letters)} dead letter(s)")


@deadletter.command("requeue")
@endpoint_option
@data_dir_option
def requeue(endpoint: str | None, data_dir: Path) -> None:
    """Put dead letters back at the tail of their queues (enqueued now, original TTL)."""

    async def act(admin: DeadLetterAdmin) -> dict[str, Any]:
        return {"requeued": await admin.requeue(endpoint)}

    done = _run(data_dir, "POST", "/deadletters/requeue", endpoint, act)["requeued"]
    click.echo(f"requeued {sum(done.values())}" + "".join(f"\n  {k}: {v}" for k, v in sorted(done.items())))


@deadletter.command("purge")
@endpoint_option
@data_dir_option
def purge(endpoint: str | None, data_dir: Path) -> None:
    """Delete dead letters for good."""

    async def act(admin: DeadLetterAdmin) -> dict[str, Any]:
        return {"purged": await admin.purge(endpoint)}

    done = _run(data_dir, "POST", "/deadletters/purge", endpoint, act)["purged"]
    click.echo(f"purged {sum(done.values())}" + "".join(f"\n  {k}: {v}" for k, v in sorted(done.items())))
