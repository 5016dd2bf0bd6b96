"""``edgehub store check`` and ``edgehub store repair``: what to do when ``edgehub run`` refuses a damaged store.

``check`` opens the store read-only (it writes nothing, so the damage stays as found), replays its WAL and reads
every record with its checksum verified; it prints ``ok`` and what the store holds (exit 0), or the damage
(exit 1). ``repair`` moves the store aside to ``store.damaged-<UTC time>`` (kept whole: what a later, better
recovery would start from) and builds a new store from every record that can still be read
(``edgehub.store.salvage``); it prints what it found, what was recovered and what may be lost (exit 0).

Both hold the store's LOCK while they run: they refuse a store a running hub holds, and a hub cannot start on
the store meanwhile. Exit 2 when they cannot run (the store in use, no store, no room).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import NoReturn

import click

from edgehub.core import StoreCorruptionError, StoreError
from edgehub.runtime.compose.store import store_path
from edgehub.store import QueueId
from edgehub.store.salvage import check_store, exclusive, repair_store
from edgehub.store.store import CHECKPOINTS, MESSAGES

__all__ = ["store"]

# What a repair cannot bring back, said after every repair that skipped something.
_MAY_BE_LOST = (
    "lost: the records in the damaged parts; of those, a lost deletion brings a delivered message back (sent again: "
    "at least once), a lost checkpoint sends its queue again from an older offset, a lost message body leaves a "
    "reference the hub skips (logged as store.missing_body)"
)


@click.group()
def store() -> None:
    """Check or repair the hub's store (stop the hub first)."""


def _data_dir_option(f: click.decorators.FC) -> click.decorators.FC:
    return click.option(
        "--data-dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=Path("data"),
        show_default=True,
        help="The hub's data folder (the store is its store/ folder).",
    )(f)


def _summary(counts: dict[str, int]) -> str:
    queues = sum(n for name, n in counts.items() if QueueId.is_queue_name(name))
    return (
        f"{sum(counts.values())} records in {len(counts)} column families: {counts.get(MESSAGES, 0)} message "
        f"bodies, {queues} queue entries, {counts.get(CHECKPOINTS, 0)} checkpoints"
    )


def _fail(text: str, code: int) -> NoReturn:
    click.echo(f"edgehub: {text}", err=True)
    raise SystemExit(code)


@store.command()
@_data_dir_option
def check(data_dir: Path) -> None:
    """Read every record of the store with its checksum verified; report ok or the damage (exit 0 or 1)."""
    path = store_path(data_dir)
    try:
        with exclusive(path):
            counts = check_store(path)
    except StoreCorruptionError as exc:
        click.echo(f"damaged: {exc}")
        click.echo(f"repair with: edgehub store repair --data-dir {data_dir}")
        raise SystemExit(1) from None
    except StoreError as exc:
        _fail(str(exc), 2)
    click.echo(f"ok: {path}: {_summary(counts)}")


@store.command()
@_data_dir_option
def repair(data_dir: Path) -> None:
    """Move the store aside to store.damaged-<time> and build a new one from every record that can be read."""
    path = store_path(data_dir)
    aside = path.with_name(f"{path.name}.damaged-{datetime.now(UTC):%Y%m%dT%H%M%SZ}")
    try:
        with exclusive(path):
            report = repair_store(path, aside)
    except (StoreError, OSError) as exc:
        _fail(f"{exc} (the store is as it was)", 2)
    click.echo(f"found: {report.found}")
    click.echo(f"moved the store as found to {aside} (delete it once the hub runs well again)")
    if report.manifest_rebuilt:
        click.echo("the MANIFEST was rebuilt from the table files (RocksDB's repair)")
    click.echo(f"recovered into {path}: {_summary(report.recovered)}")
    for spot in report.skipped:
        click.echo(f"skipped damaged records: {spot}")
    if report.lost_files:
        click.echo(f"unreadable table files, none of their records recovered: {', '.join(report.lost_files)}")
    if report.skipped or report.lost_files:
        click.echo(_MAY_BE_LOST)
    elif not report.found.startswith("ok"):
        click.echo(
            "every readable record was copied; what the damage itself held (a write-ahead log record that failed "
            "its checksum, the missing end of a truncated log) is lost, and RocksDB does not say which records"
        )
