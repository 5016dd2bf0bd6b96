"""python -m bench.fuzz [--minutes N] [--target codec|routes|manifest|all]: the fuzz properties of tests/fuzz, for
minutes instead of seconds.

The same checks and inputs as ``make test`` runs briefly (tests/fuzz/*_checks.py and *_inputs.py):

* ``codec``: the MQTT decoder gives only its declared errors, however the bytes are split; every packet type
  round-trips at both levels; the server connection never raises and ends a broken client in ProtocolFailed.
* ``routes``: any text is a RouteError with a position or compiles; compiled conditions and routers never raise
  on any message.
* ``manifest``: any document or file is desired properties or a ManifestError, and what loads is usable.

Hypothesis runs each property in chunks of examples until the target's share of the time is up. Where atheris
is importable (``pip install -e '.[fuzz]'``; it has wheels for CPython 3.11 on Linux x86-64), each target also
gets half its time under atheris (libFuzzer's coverage-guided mutation of seed inputs: valid packets, the
example routes and manifests), in a child process, since libFuzzer ends the process it runs in.

Every failure is printed with its falsifying input. Last line: one JSON object with the examples run per target
and engine, and the failures found.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

__all__ = ["main"]

TARGETS = ("codec", "routes", "manifest")
_FIRST_CHUNK, _MAX_CHUNK = 50, 2000  # examples per Hypothesis run; the time is checked between runs


@dataclass
class TargetReport:
    hypothesis_examples: int = 0
    atheris_runs: int = 0
    failures: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------------------------- Hypothesis


def _properties(target: str, scratch: Path) -> list[tuple[str, SearchStrategy[Any], Callable[[Any], object]]]:
    """(name, strategy, check) for each property of ``target``. Imported here: the atheris child must import
    the code under test only inside its instrumentation."""
    from hypothesis import strategies as st

    if target == "codec":
        from edgehub.mqtt.encoder import encode
        from edgehub.mqtt.packets import Connect
        from tests.fuzz.mqtt_checks import check_connection, check_decoder, check_round_trip
        from tests.fuzz.mqtt_inputs import levels, mutated, packets, session_bytes, split

        level_or_none = st.sampled_from([None, 4, 5])

        @st.composite
        def mutated_packet(draw: st.DrawFn) -> tuple[list[bytes], int | None]:
            level = draw(levels)
            packet = draw(packets(level))
            wire = draw(mutated(encode(packet, level)))
            return draw(split(wire)), None if isinstance(packet, Connect) else level

        @st.composite
        def session(draw: st.DrawFn) -> list[bytes]:
            wire = draw(session_bytes())
            return draw(split(draw(mutated(wire)) if draw(st.booleans()) else wire))

        return [
            (
                "random_bytes",
                st.tuples(st.lists(st.binary(max_size=256), max_size=6), level_or_none, st.integers(2, 1 << 20)),
                lambda a: check_decoder(*a),
            ),
            (
                "round_trip",
                levels.flatmap(lambda lv: st.tuples(packets(lv), st.just(lv))),
                lambda a: check_round_trip(*a),
            ),
            ("mutated_packets", mutated_packet(), lambda a: check_decoder(*a)),
            ("connection", session(), check_connection),
        ]
    if target == "routes":
        from tests.fuzz.route_checks import check_condition, check_route, check_route_text
        from tests.fuzz.route_inputs import conditions, messages, route_texts, routes

        batch = st.lists(messages(), min_size=1, max_size=4)
        return [
            ("text", route_texts(), check_route_text),
            ("conditions", st.tuples(conditions(), batch), lambda a: check_condition(*a)),
            ("routes", st.tuples(routes(), batch), lambda a: check_route(*a)),
        ]
    from tests.fuzz.manifest_checks import check_manifest_bytes, check_manifest_document
    from tests.fuzz.manifest_inputs import documents, mutated_documents, mutated_texts, nested_texts

    path = scratch / "manifest.json"
    return [
        ("documents", documents(), check_manifest_document),
        ("mutated_documents", mutated_documents(), check_manifest_document),
        ("mutated_bytes", mutated_texts(), lambda raw: check_manifest_bytes(raw, path)),
        ("nesting", nested_texts(), lambda raw: check_manifest_bytes(raw, path)),
    ]


def _counted(check: Callable[[Any], object], count: list[int]) -> Callable[[Any], None]:
    def counted(value: Any) -> None:
        count[0] += 1
        check(value)

    return counted


def run_hypothesis(target: str, seconds: float, report: TargetReport) -> None:
    from hypothesis import HealthCheck, Phase, given, settings

    with tempfile.TemporaryDirectory(prefix="edgehub-fuzz-") as scratch:
        props = _properties(target, Path(scratch))
        per_property = seconds / len(props)
        for name, strategy, check in props:
            count = [0]

            counted = _counted(check, count)
            until = time.monotonic() + per_property
            chunk = _FIRST_CHUNK
            while (left := until - time.monotonic()) > 0:
                # A fresh test each chunk: a new random seed, and no example database (nothing is replayed).
                before, chunk_started = count[0], time.monotonic()
                run: Callable[[], None] = settings(
                    max_examples=chunk,
                    deadline=None,
                    database=None,
                    phases=[Phase.generate, Phase.shrink],
                    suppress_health_check=list(HealthCheck),
                )(given(strategy)(counted))
                try:
                    run()
                except Exception as exc:  # a property failed: Hypothesis raised it with the shrunk input
                    report.failures.append(f"hypothesis {target}/{name}: {type(exc).__name__}: {exc}"[:2000])
                    print(f"FAILED hypothesis {target}/{name}: {type(exc).__name__}: {exc}", flush=True)
                    break
                # The next chunk sized to end near the deadline (some properties take 100 times as long as others).
                per_example = (time.monotonic() - chunk_started) / max(1, count[0] - before)
                chunk = max(1, min(_MAX_CHUNK, int((left - (time.monotonic() - chunk_started)) / per_example)))
            report.hypothesis_examples += count[0]
            print(f"hypothesis {target}/{name}: {count[0]} examples", flush=True)


# --------------------------------------------------------------------------------------------- atheris


def atheris_available() -> bool:
    try:
        import atheris  # noqa: F401
    except ImportError:
        return False
    return True


def _seeds(target: str) -> list[bytes]:
    root = Path(__file__).resolve().parents[1]
    if target == "codec":
        from edgehub.mqtt.encoder import encode
        from edgehub.mqtt.packets import Connect, Properties, PropertyId, Publish, Subscribe, Subscription

        props = Properties({PropertyId.CONTENT_TYPE: "json", PropertyId.TOPIC_ALIAS: 1}, (("k", "v"),))
        seeds = []
        for level in (4, 5):
            hello = encode(Connect("c", level, keepalive_s=30, username="u", password=b"p"), level)
            seeds.append(
                hello
                + encode(
                    Publish("a/b", b"x" * 10, 1, packet_id=1, properties=props if level == 5 else Properties()), level
                )
                + encode(Subscribe(2, (Subscription("a/#", 1),)), level)
                + b"\xc0\x00\xe0\x00"
            )
        return seeds
    if target == "routes":
        from tests.fuzz.route_inputs import SEED_ROUTES

        return [r.encode() for r in SEED_ROUTES]
    return [p.read_bytes() for p in sorted((root / "deployment" / "examples").glob("*.json"))]


def _atheris_child(target: str, seconds: int, corpus: Path, artifacts: Path) -> None:
    """Runs in its own process (``--atheris-child``): libFuzzer exits the process when it is done."""
    import atheris
    import pytest  # noqa: F401 (the checks use it; imported before instrumentation, which it does not need)

    with atheris.instrument_imports():
        from edgehub import Message
        from tests.fuzz.manifest_checks import check_manifest_bytes
        from tests.fuzz.mqtt_checks import check_connection, check_decoder
        from tests.fuzz.route_checks import check_condition, check_route_text

    scratch = Path(tempfile.mkdtemp(prefix="edgehub-atheris-")) / "manifest.json"
    json_sys = {"contentType": "application/json", "contentEncoding": "utf-8"}
    messages = [
        Message(b'{"t": 31, "a": {"b": "x"}, "arr": [1]}', {"a": "x", "n": "5"}, json_sys),
        Message(b"\xff\xfe not json", {}, {"connectionDeviceId": "gw-1"}),
        Message(b'{"t": 1' + b"0" * 400 + b"}", {"temp": None}, json_sys),
    ]

    def one_input(data: bytes) -> None:
        if target == "codec":
            level = (None, 4, 5)[data[0] % 3] if data else None
            cut = data[1] % (len(data) + 1) if len(data) > 1 else 0
            check_decoder([data[2:cut], data[cut:]], level)
            check_connection([data[:cut], data[cut:]])
        elif target == "routes":
            text = data.decode("utf-8", "replace")
            check_route_text(text)
            check_condition(text, messages)
        else:
            check_manifest_bytes(data, scratch)

    max_len = {"codec": 4096, "routes": 2048, "manifest": 16384}[target]
    argv = [
        sys.argv[0],
        str(corpus),
        f"-max_total_time={seconds}",
        f"-max_len={max_len}",
        "-timeout=60",
        "-rss_limit_mb=2048",
        "-print_final_stats=1",
        f"-artifact_prefix={artifacts}/",
    ]
    atheris.Setup(argv, one_input)
    atheris.Fuzz()


def run_atheris(target: str, seconds: float, report: TargetReport) -> None:
    with tempfile.TemporaryDirectory(prefix="edgehub-atheris-") as tmp:
        corpus, artifacts = Path(tmp) / "corpus", Path(tmp) / "artifacts"
        corpus.mkdir()
        artifacts.mkdir()
        for i, seed in enumerate(_seeds(target)):
            (corpus / f"seed-{i}").write_bytes(seed)
        cmd = [sys.executable, "-m", "bench.fuzz", "--atheris-child", target, "--seconds", str(max(1, int(seconds)))]
        cmd += ["--corpus", str(corpus), "--artifacts", str(artifacts)]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[1]), *sys.path]))
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=seconds + 300, check=False)
        runs = re.findall(r"stat::number_of_executed_units:\s*(\d+)", proc.stderr)
        report.atheris_runs += int(runs[-1]) if runs else 0
        crashes = sorted(artifacts.glob("*"))
        if proc.returncode != 0 or crashes:
            tail = "\n".join(proc.stderr.splitlines()[-25:])
            inputs = ", ".join(repr(c.read_bytes()[:200]) for c in crashes)
            report.failures.append(f"atheris {target}: exit {proc.returncode}; inputs: {inputs}\n{tail}"[:4000])
            print(f"FAILED atheris {target} (exit {proc.returncode}), inputs {inputs}\n{tail}", flush=True)
        print(f"atheris {target}: {report.atheris_runs} runs", flush=True)


# --------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--minutes", type=float, default=5.0, help="total time over all targets (default 5)")
    parser.add_argument("--target", choices=[*TARGETS, "all"], default="all")
    parser.add_argument("--no-atheris", action="store_true", help="Hypothesis only, even where atheris is there")
    parser.add_argument("--atheris-child", choices=TARGETS, help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=int, default=60, help=argparse.SUPPRESS)
    parser.add_argument("--corpus", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--artifacts", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.atheris_child:
        _atheris_child(args.atheris_child, args.seconds, args.corpus, args.artifacts)
        return 0

    targets = TARGETS if args.target == "all" else (args.target,)
    use_atheris = atheris_available() and not args.no_atheris
    share = args.minutes * 60 / len(targets)
    reports: dict[str, TargetReport] = {}
    started = time.monotonic()
    for target in targets:
        report = reports[target] = TargetReport()
        if use_atheris:
            run_atheris(target, share / 2, report)
        run_hypothesis(target, share / 2 if use_atheris else share, report)
    summary = {
        "bench": "fuzz",
        "minutes": round((time.monotonic() - started) / 60, 2),
        "atheris": use_atheris,
        "targets": {
            t: {
                "hypothesis_examples": r.hypothesis_examples,
                "atheris_runs": r.atheris_runs,
                "failures": len(r.failures),
            }
            for t, r in reports.items()
        },
        "failures": [f.splitlines()[0] for r in reports.values() for f in r.failures],
    }
    print(json.dumps(summary), flush=True)
    return 1 if summary["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
