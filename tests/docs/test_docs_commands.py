"""The commands the README and docs/ show, against what the code does: the marked blocks run as written and print
what the page says; the landing receiver's topic filter takes every topic the MQTT upstream publishes on; the
README's first-device commands are the ones ``edgehub run`` prints under ``make run``."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from edgehub import Message
from edgehub.core import DEFAULT_PRIORITY
from edgehub.core.endpoints import lane_name
from edgehub.delivery.endpoint import QueuedMessage
from edgehub.runtime.cli.app import DEFAULT_MANIFEST, main
from edgehub.runtime.cli.firstrun import connect_help_for, default_landing
from edgehub.runtime.compose.config import HubConfig, UploadUpstreamSettings
from edgehub.upstream.mqtt.settings import MqttUpstreamSettings
from edgehub.upstream.mqtt.wire import dictionary_unit, publish_units
from edgehub.upstream.segment import Codec
from protocol_heads.mqtt.iothub import topic_matches
from spark_upload.receiver import DEFAULT_TOPIC
from tests.docs.pages import DOCS, REPO, Block, RunnableBlock, blocks, pages, runnable_blocks

RUNNABLE = runnable_blocks()


def test_the_pages_mark_command_blocks_to_run() -> None:
    assert {r.block.page.name for r in RUNNABLE} >= {"routes.md", "manifest.md", "operating.md", "devices.md"}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("runnable", RUNNABLE, ids=[r.block.where for r in RUNNABLE])
def test_a_marked_block_runs_as_written_and_prints_what_the_page_shows(runnable: RunnableBlock, tmp_path: Path) -> None:
    # Run where the pages say: a folder of one's own beside the repository's deployment/ (its example manifests).
    (tmp_path / "deployment").symlink_to(REPO / "deployment")
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    block = runnable.block
    if block.lang == "sh":
        argv = ["bash", "-e", "-o", "pipefail", "-c", block.text]
    else:
        assert block.lang == "python", f"{block.where}: a run block is sh or python, not {block.lang!r}"
        argv = [sys.executable, "-c", block.text]
    done = subprocess.run(
        argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=50, check=False
    )
    out = done.stdout.decode()
    assert done.returncode == (1 if "routes check bad.json" in block.text else 0), f"{block.where}:\n{out}"
    if runnable.output is not None:
        assert [x.rstrip() for x in out.splitlines()] == [x.rstrip() for x in runnable.output.text.splitlines()]


def commands(block: Block) -> list[str]:
    """The block's shell commands, a backslash-continued line joined to the next, comments dropped."""
    joined = block.text.replace("\\\n", " ")
    return [line.split(" #", 1)[0].strip() for line in joined.splitlines() if line.strip()]


def receiver_filters() -> list[tuple[str, str]]:
    """``(where, topic filter)`` of every ``spark_upload.receiver`` command on the pages."""
    out = []
    for page in pages():
        for block in blocks(page):
            for command in commands(block):
                if "spark_upload.receiver" not in command:
                    continue
                argv = shlex.split(command)
                topic = argv[argv.index("--topic") + 1] if "--topic" in argv else DEFAULT_TOPIC
                out.append((block.where, topic))
    return out


def published_topics() -> list[str]:
    """Every topic the MQTT upstream publishes on in batch mode: segments of each priority, lane and codec, and a
    lane's zstd dictionary."""
    message = Message(body=b'{"temperature": 21.5}', system_properties={"connectionDeviceId": "dev1"})
    topics = []
    for partitions in (1, 4):
        for i in range(partitions):
            for codec in Codec:
                s = MqttUpstreamSettings(
                    host="broker", client_id="gw-17", hub_id="gw-17", lane=lane_name(i, partitions), compression=codec
                )
                for priority in (0, 5, DEFAULT_PRIORITY):
                    queued = QueuedMessage(message=message, offset=1, priority=priority, enqueued_at_s=0.0, ttl_s=60.0)
                    topics += [unit.topic for unit in publish_units(s, [queued])]
                topics.append(dictionary_unit(s, b"dictionary", 7).topic)
    return topics


def test_the_receiver_examples_subscribe_to_every_topic_the_upstream_publishes_on() -> None:
    filters = receiver_filters()
    assert filters, "no page shows the landing receiver"
    topics = published_topics()
    for where, topic_filter in filters:
        missed = [t for t in topics if not topic_matches(topic_filter, t)]
        assert missed == [], f"{where}: --topic {topic_filter!r} misses what the hub publishes"


def test_the_upstream_page_writes_the_segment_topic_as_the_upstream_builds_it() -> None:
    text = (DOCS / "upstream.md").read_text(encoding="utf-8")
    [pattern] = set(re.findall(r"edgehub/segments/\{hub\}/\{lane\}/p\{NN\}", text))
    message = Message(body=b"{}", system_properties={"connectionDeviceId": "dev1"})
    s = MqttUpstreamSettings(host="broker", client_id="gw-17", hub_id="gw-17", lane=lane_name(2, 4))
    queued = QueuedMessage(message=message, offset=1, priority=3, enqueued_at_s=0.0, ttl_s=60.0)
    [unit] = publish_units(s, [queued])
    assert pattern.format(hub="gw-17", lane=lane_name(2, 4), NN="03") == unit.topic


def option_default(name: str) -> object:
    [param] = [p for p in main.commands["run"].params if p.name == name]
    return param.default


def test_the_readme_shows_the_first_run_commands_edgehub_run_prints_under_make_run() -> None:
    # make run is `.venv/bin/edgehub run --data-dir data`: the defaults of edgehub run otherwise.
    data_dir = Path("data")
    assert option_default("data_dir") == data_dir
    config = HubConfig(
        manifest=DEFAULT_MANIFEST,
        data_dir=data_dir,
        host_name=str(option_default("host_name")),
        upstream=UploadUpstreamSettings(url=str(default_landing(data_dir))),
    )
    port = option_default("mqtts_port")
    assert isinstance(port, int)
    printed = connect_help_for(config, {"tls": port}, data_dir / "certs" / "ca.pem", edgehub=".venv/bin/edgehub")
    # The hub names its venv's Python by the full path it has; the README writes it relative, and says so.
    printed = [line.replace(f" {shlex.quote(sys.executable)} -c ", " .venv/bin/python -c ") for line in printed]
    readme = [b for b in blocks(REPO / "README.md") if b.lang == "text" and "first run: connect a device" in b.text]
    assert len(readme) == 1, "the README shows the first-run commands once"
    assert readme[0].text.splitlines() == printed
