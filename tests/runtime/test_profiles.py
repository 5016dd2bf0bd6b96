"""Hardware profiles: the shipped ones load and bound the store's memory, a bad profile is refused with the file and
the key, the flags given on the command line win over the profile, and the RocksDB the hub opens runs with the
profile's budget (read back from the OPTIONS file RocksDB writes)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from edgehub.core import ConfigurationError, Message, RouteResult
from edgehub.manifest import load_desired_file
from edgehub.runtime.cli.profile import profile_options
from edgehub.runtime.compose.config import HubConfig, UploadUpstreamSettings
from edgehub.runtime.compose.store import open_store
from edgehub.runtime.compose.upstream import transport_settings
from edgehub.runtime.profiles import PROFILES_DIR, Profile, available_profiles, load_profile
from edgehub.store import FsyncPolicy
from edgehub.store.rocks import RocksBackend
from edgehub.store.tuning import RocksTuning
from edgehub.upstream.mqtt.settings import MqttUpstreamSettings
from tests.e2e.hub_process import start, stop

MIB = 1 << 20


def rocks_options(store_dir: Path) -> str:
    """The newest OPTIONS file RocksDB wrote in ``store_dir``: the options the database really runs with."""
    files = sorted(store_dir.glob("OPTIONS-*"), key=lambda p: int(p.name.split("-")[1]))
    assert files, f"no OPTIONS file in {store_dir}"
    return files[-1].read_text()


def option_values(options: str, name: str) -> set[str]:
    return set(re.findall(rf"^\s*{name}=(\S+)$", options, re.MULTILINE))


def test_every_shipped_profile_loads_and_the_pi_zero_budget_is_the_smallest() -> None:
    names = available_profiles()
    assert {"pi-zero2w", "pi4", "pi5", "generic-arm64"} <= set(names)
    profiles = {name: load_profile(name) for name in names}
    zero = profiles["pi-zero2w"]
    assert zero.name == "pi-zero2w"
    assert zero.rocks.db_write_buffer_bytes == 8 * MIB
    assert zero.rocks.block_cache_bytes == 4 * MIB
    assert zero.fsync is FsyncPolicy.INTERVAL
    for name, profile in profiles.items():
        assert profile.description, name
        if name != "pi-zero2w":
            assert profile.rocks.db_write_buffer_bytes > zero.rocks.db_write_buffer_bytes, name


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('[rocksdb]\nblock_cache = "4MiB"\n', "[rocksdb]: unknown key 'block_cache'"),
        ('[store]\nfsync = "sometimes"\n', "[store] fsync: 'sometimes' is not one of always, interval, none"),
        ("[rocksdb]\nmax_open_files = 3\n", "max_open_files must be -1 (no limit) or within 16"),
        ('[rocksdb]\nwrite_buffer_bytes = "64MiB"\ndb_write_buffer_bytes = "8MiB"\n', "must not exceed"),
        ('[rocksdb]\nblock_cache_bytes = "lots"\n', "[rocksdb] block_cache_bytes: expected an integer or a size"),
        ("[upstream]\nmax_batch_messages = 0\n", "max_batch_messages must be within 1 and 100000"),
        ("store = 3\n", "[store] must be a table"),
        ('[runtime]\nevent_loop = "trio"\n', "event_loop must be one of uvloop, asyncio, not 'trio'"),
        ('[runtime]\nloop = "asyncio"\n', "[runtime]: unknown key 'loop'"),
        ("[store\n", "not TOML"),
    ],
)
def test_a_bad_profile_is_refused_naming_the_file_and_the_key(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "board.toml"
    path.write_text(text)
    with pytest.raises(ConfigurationError) as err:
        load_profile(str(path))
    assert str(path) in str(err.value)
    assert says in str(err.value)


def test_an_unknown_profile_name_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ConfigurationError, match=r"'pi-zero3': no such profile \(known: generic-arm64, pi-zero2w"):
        load_profile("pi-zero3")


def test_sizes_take_units_and_plain_bytes(tmp_path: Path) -> None:
    path = tmp_path / "b.toml"
    path.write_text('[rocksdb]\nblock_cache_bytes = "512KiB"\nwrite_buffer_bytes = 1048576\n')
    rocks = load_profile(str(path)).rocks
    assert (rocks.block_cache_bytes, rocks.write_buffer_bytes) == (512 << 10, MIB)
    assert rocks.db_write_buffer_bytes == RocksTuning().db_write_buffer_bytes  # left out: the built-in default


def _captured(args: list[str]) -> Profile:
    seen: list[Profile] = []

    @click.command()
    @profile_options
    def command(profile: Profile) -> None:
        seen.append(profile)

    result = CliRunner().invoke(command, args)
    assert result.exit_code == 0, result.output
    return seen[0]


def test_flags_given_override_the_profile_and_the_rest_comes_from_it() -> None:
    profile = _captured(["--profile", "pi-zero2w", "--fsync", "always"])
    assert profile.fsync is FsyncPolicy.ALWAYS
    assert profile.rocks == load_profile("pi-zero2w").rocks
    assert profile.fsync_interval_ms == 100
    assert _captured(["--profile", "pi-zero2w", "--fsync-interval-ms", "250"]).fsync_interval_ms == 250
    assert _captured([]) == Profile()


def test_the_event_loop_comes_from_the_profile_unless_the_flag_names_one(tmp_path: Path) -> None:
    path = tmp_path / "small.toml"
    path.write_text('[runtime]\nevent_loop = "asyncio"\n')
    assert Profile().event_loop == "uvloop"
    assert _captured(["--profile", str(path)]).event_loop == "asyncio"
    assert _captured(["--profile", str(path), "--event-loop", "uvloop"]).event_loop == "uvloop"
    assert _captured(["--event-loop", "asyncio"]).event_loop == "asyncio"


def test_a_bad_profile_flag_is_a_usage_error_not_a_traceback() -> None:
    @click.command()
    @profile_options
    def command(profile: Profile) -> None:
        raise AssertionError("not reached")

    result = CliRunner().invoke(command, ["--profile", "nope"])
    assert result.exit_code == 2
    assert "Invalid value for --profile: profile 'nope': no such profile" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_the_profile_batch_size_reaches_both_transports_under_the_manifest(tmp_path: Path) -> None:
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps({"schemaVersion": "1.1", "routes": {"r": "FROM /* INTO $upstream"}}))
    desired = load_desired_file(manifest)
    profile = Profile(max_batch_messages=700)
    mqtt = MqttUpstreamSettings(host="h", client_id="gw", hub_id="gw")
    got = transport_settings(
        desired.upstream.model_dump(), HubConfig(manifest=manifest, data_dir=tmp_path, upstream=mqtt, profile=profile)
    )
    assert isinstance(got, MqttUpstreamSettings)
    assert got.max_batch_messages == 700 != mqtt.max_batch_messages
    upload = UploadUpstreamSettings(url=str(tmp_path / "landing"))
    got = transport_settings(
        desired.upstream.model_dump(), HubConfig(manifest=manifest, data_dir=tmp_path, upstream=upload, profile=profile)
    )
    assert isinstance(got, UploadUpstreamSettings)
    assert got.max_batch_messages == 700 != upload.max_batch_messages


def test_rocks_backend_runs_with_the_budget_it_is_given_for_every_column_family(tmp_path: Path) -> None:
    tuning = load_profile("pi-zero2w").rocks
    backend = RocksBackend(tmp_path / "db", tuning=tuning)
    backend.ensure_family("upstream/p0")
    backend.write([("upstream/p0", b"k", b"v")], sync=True)
    usage = backend.memory_usage()
    assert set(usage) == {"memtables", "table_readers", "block_cache"}
    backend.close()
    options = rocks_options(tmp_path / "db")
    assert option_values(options, "db_write_buffer_size") == {str(8 * MIB)}
    assert option_values(options, "max_open_files") == {"128"}
    assert option_values(options, "max_background_jobs") == {"1"}
    assert option_values(options, "write_buffer_size") == {str(2 * MIB)}  # every family, the one made later too
    assert option_values(options, "cache_index_and_filter_blocks") == {"true"}


def test_rocks_backend_without_a_budget_keeps_rocksdb_defaults_and_the_memtable_cap(tmp_path: Path) -> None:
    RocksBackend(tmp_path / "db").close()
    options = rocks_options(tmp_path / "db")
    assert option_values(options, "db_write_buffer_size") == {str(32 * MIB)}
    assert option_values(options, "write_buffer_size") == {str(64 * MIB)}  # RocksDB's own
    assert option_values(options, "max_open_files") == {"-1"}


@pytest.mark.timeout(60)
async def test_edgehub_run_with_a_profile_opens_its_store_with_the_profile_budget(tmp_path: Path) -> None:
    data = tmp_path / "data"
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps({"schemaVersion": "1.1", "routes": {"r": "FROM /* INTO $upstream"}}))
    proc, _, lines = await start(data, manifest, "--profile", "pi-zero2w", "--fsync-interval-ms", "40")
    assert (await stop(proc)).rstrip().endswith("stopped")
    assert any(
        line.startswith("profile: pi-zero2w fsync=interval 40 ms group<=256 memtables<=8 MiB") for line in lines
    ), lines
    assert "event loop: uvloop" in lines, lines  # asyncio's TLS costs 256 KiB a connection (docs/install.md)
    options = rocks_options(data / "store")
    assert option_values(options, "db_write_buffer_size") == {str(8 * MIB)}
    assert option_values(options, "write_buffer_size") == {str(2 * MIB)}
    assert PROFILES_DIR.is_dir()


async def test_open_store_keeps_the_profile_bound_on_messages_held_in_memory(tmp_path: Path) -> None:
    profile = load_profile("pi-zero2w")
    assert profile.held_max_bytes == 2 * MIB
    store = open_store(tmp_path, profile=profile)
    try:
        route = [RouteResult("$upstream", 5)]
        for _ in range(20):
            await store.enqueue_many([(Message(body=b"x" * 2000), route) for _ in range(100)])
        held, charged = store.held_in_memory
        assert 0 < held < 2000
        assert charged <= 2 * MIB
    finally:
        await store.close()
