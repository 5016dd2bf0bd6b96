"""Every benchmark at a smoke size, run as a user runs it (``python -m bench.NAME``): the same code and the same
correctness checks as a full run, in seconds. Each test asserts that the run ended well (exit code 0, one JSON
object last), that the JSON has the figures the benchmark documents, and whatever correctness figure it reports;
never a speed, which a smoke size could not tell anyway.

The Spark benchmark is in ``test_smoke_spark.py``; ``bench.wear`` on its loop device (root) in
``tests/privileged/bench/``; ``bench.chaos`` in ``tests/e2e/test_chaos.py``; ``bench.demo`` in
``test_demo_run.py``. ``bench.rabbitmq`` is not a benchmark but the RabbitMQ peer of ``bench.ingest`` and its AMQP
run, used by them where ``rabbitmq-server`` is installed (it is not among the Makefile's Debian packages).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import rabbitmq
from bench.fuzz import TARGETS
from bench.routing import ROUTES
from bench.wear import RATES
from edgehub.store import FsyncPolicy
from tests.bench.bench_process import need_program, run_bench

pytestmark = [pytest.mark.slow]


def test_routing_gives_the_same_verdicts_as_its_hand_written_reference() -> None:
    # The run stops with "verdicts differ" before timing anything when the two sides disagree on a message.
    figures = run_bench("routing", "--messages", "2000", "--repeats", "1", timeout_s=60)
    assert {"messages", "routes", "results_per_message", "compiled_msgs_per_s", "hand_msgs_per_s", "ratio"} <= set(
        figures
    )
    assert (figures["messages"], figures["routes"]) == (2000, len(ROUTES))
    assert figures["results_per_message"] > 0


def test_store_ingests_drains_cleans_up_and_recovers_every_message(tmp_path: Path) -> None:
    # Its own checks: cleanup removes every reference and leaves the store empty; the reopened store holds
    # every message built.
    figures = run_bench(
        "store", "--messages", "800", "--rounds", "1", "--queued", "2000", "--dir", str(tmp_path), timeout_s=90
    )
    assert {
        "ingest_msgs_per_s",
        "ingest_vs_raw_ratio",
        "drain_msgs_per_s",
        "cleanup_us_per_ref",
        "cleanup_max_stall_ms",
        "recovery_s",
        "rss_mb_1m",
    } <= set(figures)


def test_store_sync_measures_both_ways_of_syncing_a_write(tmp_path: Path) -> None:
    figures = run_bench("store_sync", "--writes", "50", "--dir", str(tmp_path), timeout_s=60)
    assert {
        "flush_wal_writes_per_s",
        "sync_option_writes_per_s",
        "flush_wal_stall_ms_per_write",
        "sync_option_stall_ms_per_write",
        "stall_ratio",
    } <= set(figures)
    assert not list(tmp_path.iterdir())  # its databases removed


def test_wear_stores_messages_under_every_fsync_policy_and_syncs_only_where_the_policy_says(tmp_path: Path) -> None:
    figures = run_bench("wear", "--seconds", "0.5", "--no-loop", "--dir", str(tmp_path), timeout_s=90)
    by_policy = {label.split("_")[0]: cases for label, cases in figures.items()}
    assert set(by_policy) == {policy.value for policy in FsyncPolicy}
    for cases in by_policy.values():
        assert set(cases) == {f"{rate}/s" for rate in RATES}
        for case in cases.values():
            assert {"msgs", "page_bytes", "device_bytes", "flush_device_bytes", "syncs"} <= set(case)
            assert case["msgs"] > 0
            assert case["device_bytes"] is None  # no loop device with --no-loop
    assert all(case["syncs"] > 0 for case in by_policy[FsyncPolicy.ALWAYS.value].values())
    assert all(case["syncs"] == 0 for case in by_policy[FsyncPolicy.NONE.value].values())


@pytest.mark.interop
def test_mqtt_head_takes_every_message_as_mosquitto_does() -> None:
    # The run fails when a publisher's message is not acknowledged, on either broker.
    need_program("mosquitto", "mosquitto")
    figures = run_bench("mqtt_head", "--messages", "200", "--publishers", "2", timeout_s=90)
    assert {
        "publishers",
        "messages",
        "edgehub_head_msgs_per_s",
        "mosquitto_msgs_per_s",
        "edgehub_head_cpu_us_per_msg",
        "mosquitto_cpu_us_per_msg",
        "cpu_ratio",
    } <= set(figures)
    assert figures["messages"] == 400


@pytest.mark.interop
def test_ingest_delivers_every_message_through_the_hub_and_mosquitto_module_to_module_too() -> None:
    # The run fails when a message does not reach its subscriber, in either phase, on either broker.
    need_program("mosquitto", "mosquitto")
    figures = run_bench("ingest", "--publishers", "2", "--messages", "200", "--m2m", "200", timeout_s=90)
    assert {
        "edgehub_msgs_per_s",
        "mosquitto_msgs_per_s",
        "edgehub_cpu_us_per_msg",
        "mosquitto_cpu_us_per_msg",
        "cpu_ratio",
        "m2m_msgs_per_s",
        "m2m_p50_ms",
        "m2m_p99_ms",
        "mosquitto_m2m_msgs_per_s",
        "m2m_cpu_us_per_msg",
        "rabbitmq_mqtt_msgs_per_s",
        "rabbitmq_mqtt_cpu_us_per_msg",
        "rounds",
    } <= set(figures)
    # RabbitMQ's figures are there exactly where it is installed.
    assert (figures["rabbitmq_mqtt_msgs_per_s"] is not None) == rabbitmq.available()


@pytest.mark.interop
def test_ingest_over_amqp_delivers_every_message_over_both_heads() -> None:
    # The run fails when a publisher's message is refused or a message does not reach the module.
    need_program("mosquitto", "mosquitto")
    figures = run_bench("ingest", "--protocol", "amqp", "--publishers", "2", "--messages", "200", timeout_s=90)
    assert {
        "amqp_msgs_per_s",
        "amqp_cpu_us_per_msg",
        "mqtt_msgs_per_s",
        "mqtt_cpu_us_per_msg",
        "amqp_to_mqtt_cpu_ratio",
        "rabbitmq_msgs_per_s",
        "rabbitmq_cpu_us_per_msg",
        "rounds",
        "message_ids",
    } <= set(figures)
    assert (figures["rabbitmq_msgs_per_s"] is not None) == rabbitmq.available()


@pytest.mark.interop
def test_floor_relay_mosquitto_and_the_hub_each_deliver_every_message() -> None:
    need_program("mosquitto", "mosquitto")
    figures = run_bench("floor", "--publishers", "2", "--messages", "200", "--rounds", "1", timeout_s=90)
    assert {
        "floor_cpu_us_per_msg",
        "mosquitto_cpu_us_per_msg",
        "edgehub_cpu_us_per_msg",
        "floor_ratio",
        "hub_over_floor",
        "rounds",
    } <= set(figures)


@pytest.mark.interop
@pytest.mark.timeout(180)
def test_instructions_counts_both_brokers_under_callgrind_once_every_message_arrived() -> None:
    need_program("mosquitto", "mosquitto")
    need_program("valgrind", "valgrind")
    figures = run_bench("instructions", "--publishers", "1", "--messages", "50", timeout_s=170)
    assert {"edgehub_ir_per_msg", "mosquitto_ir_per_msg", "ir_ratio", "messages"} <= set(figures)
    assert figures["messages"] == 50
    assert figures["edgehub_ir_per_msg"] > 0
    assert figures["mosquitto_ir_per_msg"] > 0


@pytest.mark.interop
def test_uplink_delivers_the_whole_backlog_and_every_alert_through_an_outage_and_a_cut() -> None:
    # A link at half the default rate, so that the backlog outlasts the first drain and the hard cut both
    # find some left: every step of the scenario, and the resume figures, are exercised.
    need_program("mosquitto", "mosquitto")
    backlog = 400
    figures = run_bench(
        "uplink",
        *("--backlog", str(backlog), "--rate-bps", "32000", "--alert-every-s", "1", "--keepalive-s", "2"),
        *("--drain-s", "3", "--outage-s", "4", "--after-s", "3", "--cut-s", "2", "--after-cut-s", "8"),
        timeout_s=100,
    )
    assert {
        "p0_p50_s",
        "p0_p99_s",
        "bridge_p0_p99_s",
        "wire_bytes_per_msg",
        "bridge_wire_bytes_per_msg",
        "utilisation",
        "resume_s",
        "resume_cut_s",
        "delivered",
        "bridge_delivered",
    } <= set(figures)
    assert figures["backlog"] == backlog
    assert figures["backlog_delivered"] == backlog
    assert figures["p0_missing"] == 0
    assert figures["delivered"] > backlog  # the alerts too
    assert figures["bridge_delivered"] > 0  # the peer ran beside it


def test_footprint_queues_every_message_and_restarts_with_them(tmp_path: Path) -> None:
    # ``queued`` is what the publishers had acknowledged; a message never acknowledged leaves the run waiting.
    figures = run_bench("footprint", "--queued", "400", "--devices", "2", "--dir", str(tmp_path), timeout_s=90)
    assert {
        "rss_idle_mb",
        "rss_1m_mb",
        "rss_peak_mb",
        "startup_s",
        "queued",
        "restart_s",
        "rss_restart_mb",
        "rss_restart_peak_mb",
    } <= set(figures)
    assert figures["queued"] == 400


def test_fuzz_runs_every_target_and_finds_nothing() -> None:
    figures = run_bench("fuzz", "--minutes", "0.1", "--no-atheris", timeout_s=60)
    assert set(figures["targets"]) == set(TARGETS)
    assert all(target["hypothesis_examples"] > 0 for target in figures["targets"].values())
    assert figures["failures"] == []


def test_links_fail_over_and_back_and_the_lake_holds_every_message_once() -> None:
    # Outages of 4 s and a settle time (2 s) the "up" spans outlast: the cut, the silence and both returns are
    # exercised. The lake is counted from the landed records, deduplicated as the Spark job does (the job itself
    # runs in test_smoke_spark.py).
    need_program("mosquitto", "mosquitto")
    figures = run_bench(
        "links",
        *("--warm-s", "4", "--cut-s", "4", "--silent-s", "4", "--after-s", "6", "--settle-s", "2", "--lake", "records"),
        *("--telemetry-per-s", "10", "--drain-max-s", "40"),
        timeout_s=150,
    )
    assert {
        "p0_p99_s",
        "failover_cut_s",
        "failover_silent_s",
        "failover_silent_delivered_s",
        "expensive_bytes",
        "bridge_expensive_bytes",
        "expensive_bytes_ratio",
        "lost",
        "duplicates",
    } <= set(figures)
    assert figures["lost"] == 0
    assert figures["duplicates"] == 0
    assert figures["arrived"] == figures["published"]
    assert figures["p0_count"] > 0
    assert figures["failover_cut_s"] is not None  # the metered link took over after the cut
    assert figures["failover_silent_s"] is not None  # and after the silence
    assert figures["failover_silent_delivered_s"] >= figures["failover_silent_s"]  # the far end hears it later
    assert figures["bridge_published"] > 0  # the peer ran beside it


def test_upload_codec_lands_every_message_once_under_each_codec_and_the_dictionary_is_used() -> None:
    # Its own checks: each landing zone decodes back to exactly the messages sent (zstd with the landed dictionary).
    figures = run_bench("upload_codec", "--messages", "800", "--batch", "50", timeout_s=120)
    assert {f"{run}_bytes_per_msg" for run in ("gzip", "zstd", "zstd_dict")} <= set(figures)
    assert {"zstd_over_gzip", "zstd_dict_over_gzip", "dictionary_bytes"} <= set(figures)
    assert figures["messages"] == 800
    # Trained from the first four batches, landed once, used by every later segment.
    assert figures["dictionary_bytes"] > 0
    assert 0 < figures["segments_with_dictionary"] < 800 // 50
