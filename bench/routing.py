"""python -m bench.routing: the compiled router against hand-written Python that computes the same verdicts.

20 realistic routes (property tests, body queries, functions, several endpoints, priorities and TTLs) over
100,000 varied messages. The hand-written functions are what a programmer would write for exactly these 20
routes (exact-case property names, one JSON parse per message): the limit for compiled closures. Both sides
must give the same RouteResults for every message before anything is timed.

Last line: one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from collections.abc import Callable
from typing import Any

from edgehub import Message
from edgehub.core import DEFAULT_PRIORITY, RouteResult
from edgehub.routing import Router, RouteSpec

UP = "$upstream"
HOT, LEVEL, DIAG, FAULT = (
    "/modules/alerter/inputs/hot",
    "/modules/alerter/inputs/level",
    "/modules/diag/inputs/in",
    ("/modules/maint/inputs/faults"),
)
NORTH, BATCH, PRESS, JSONV = (
    "/modules/north/inputs/in",
    "/modules/batch/inputs/in",
    "/modules/press/inputs/in",
    ("/modules/compat/inputs/v1"),
)
ZONE, FRAMES, SERIAL, GEO = (
    "/modules/zone/inputs/in",
    "/modules/vision/inputs/frames",
    "/modules/inv/inputs/serial",
    ("/modules/geo/inputs/in"),
)
DELTA, HB = "/modules/drift/inputs/in", "/modules/monitor/inputs/hb"

ROUTES: dict[str, RouteSpec] = {
    "alerts": RouteSpec("FROM /messages/* WHERE alert = 'true' INTO $upstream", 0, 86400),
    "telemetry": RouteSpec("FROM /messages/* INTO $upstream", 5, 604800),
    "hot": RouteSpec(
        "FROM /messages/modules/sensor/outputs/temperature WHERE $body.temperature > 30 "
        f'INTO BrokeredEndpoint("{HOT}")',
        1,
    ),
    "level": RouteSpec(f'FROM /messages/modules/sensor/* WHERE as_number(level) >= 3 INTO BrokeredEndpoint("{LEVEL}")'),
    "pump": RouteSpec("FROM /messages/* WHERE $connectionDeviceId = 'pump-7' INTO $upstream", 2, 3600),
    "diag": RouteSpec(
        f"FROM /messages/* WHERE starts_with($connectionDeviceId, 'gw-') AND kind = 'diag' "
        f'INTO BrokeredEndpoint("{DIAG}")'
    ),
    "fault": RouteSpec(
        f"FROM /messages/* WHERE $body.status = 'fault' OR $body.errors > 0 INTO BrokeredEndpoint('{FAULT}')", 0
    ),
    "north": RouteSpec(f"FROM /messages/modules/* WHERE lower(site) = 'north' INTO BrokeredEndpoint('{NORTH}')"),
    "batch": RouteSpec(
        f"FROM /messages/* WHERE is_defined(batch) AND as_number(batch) % 10 = 0 INTO BrokeredEndpoint('{BATCH}')"
    ),
    "press": RouteSpec(f"FROM /messages/* WHERE $body.pressure * 0.145 > 100 INTO BrokeredEndpoint('{PRESS}')", 3),
    "critical": RouteSpec("FROM /messages/* WHERE contains(tags, 'critical') INTO $upstream", 1, 7200),
    "jsonv": RouteSpec(
        f"FROM /messages/* WHERE $contentType = 'application/json' AND $body.version <> 2 "
        f"INTO BrokeredEndpoint('{JSONV}')"
    ),
    "high": RouteSpec("FROM /messages/* WHERE priority = 'high' INTO $upstream", 1, 600),
    "zone": RouteSpec(
        f"FROM /messages/* WHERE (zone = 'a' OR zone = 'b') AND NOT (mode = 'test') INTO BrokeredEndpoint('{ZONE}')"
    ),
    "frames": RouteSpec(f"FROM /messages/modules/camera/* INTO BrokeredEndpoint('{FRAMES}')", 6),
    "serial": RouteSpec(f"FROM /messages/* WHERE length(serial) = 12 INTO BrokeredEndpoint('{SERIAL}')"),
    "geo": RouteSpec(
        f"FROM /messages/* WHERE $body.location.lat > 50 AND $body.location.lon < 10 INTO BrokeredEndpoint('{GEO}')"
    ),
    "delta": RouteSpec(f"FROM /messages/* WHERE abs(as_number(delta)) > 5 INTO BrokeredEndpoint('{DELTA}')"),
    "hb": RouteSpec(f"FROM /messages/* WHERE (kind ?? 'none') = 'heartbeat' INTO BrokeredEndpoint('{HB}')", 9),
    "twin": RouteSpec("FROM /twinChangeNotifications INTO $upstream", 4),
}


def make_messages(n: int, seed: int = 7) -> list[Message]:
    rnd = random.Random(seed)
    devices = ["pump-7", "gw-1", "gw-2", "meter-3", "cam-9", "valve-4"]
    out = []
    for i in range(n):
        sys: dict[str, str] = {"connectionDeviceId": rnd.choice(devices), "messageId": f"m{i}"}
        r = rnd.random()
        if r < 0.35:
            sys["connectionModuleId"] = "sensor"
            if rnd.random() < 0.7:
                sys["outputName"] = rnd.choice(["temperature", "level"])
        elif r < 0.45:
            sys["connectionModuleId"] = "camera"
        elif r < 0.5:
            sys["messageType"] = "twinChangeNotification"
        props: dict[str, str | None] = {}
        for key, values, p in [
            ("alert", ["true", "false"], 0.3),
            ("level", ["1", "3", "5", "x"], 0.4),
            ("kind", ["diag", "heartbeat", "data"], 0.5),
            ("site", ["North", "south", "NORTH"], 0.4),
            ("batch", ["10", "20", "7", "abc"], 0.3),
            ("tags", ["critical,temp", "temp", "none"], 0.3),
            ("priority", ["high", "low"], 0.3),
            ("zone", ["a", "b", "c"], 0.5),
            ("mode", ["test", "prod"], 0.5),
            ("serial", ["ABCDEFGHIJKL", "SHORT"], 0.3),
            ("delta", ["-7", "2", "9.5", "n/a"], 0.3),
        ]:
            if rnd.random() < p:
                props[key] = rnd.choice(values)
        if rnd.random() < 0.75:
            body: dict[str, Any] = {
                "temperature": rnd.choice([20, 25, 31, 40, "hot", None]),
                "status": rnd.choice(["ok", "fault", "warn"]),
                "errors": rnd.choice([0, 0, 1, 3]),
                "pressure": rnd.choice([500, 700, 800, 900]),
                "version": rnd.choice([1, 2, 3]),
                "location": {"lat": rnd.uniform(40, 60), "lon": rnd.uniform(0, 20)},
            }
            for k in list(body):
                if rnd.random() < 0.15:
                    del body[k]
            sys["contentType"] = "application/json"
            sys["contentEncoding"] = "utf-8"
            raw = json.dumps(body).encode()
        else:
            raw = b"\x00\x01binary"
        out.append(Message(body=raw, properties=props, system_properties=sys))
    return out


# ------------------------------------------------------------------ the hand-written router


def _num(v: Any) -> float | None:
    return float(v) if type(v) in (int, float) else None


def _as_number(s: str | None) -> float | None:
    if s is None:
        return None
    try:
        v = float(s)
    except ValueError:
        return None
    return None if math.isnan(v) or s.strip().lower() in ("inf", "-inf", "infinity", "nan") else v


def hand_route(m: Message) -> list[RouteResult]:
    p, s = m.properties, m.system_properties
    source = m.source.lower() + "/"
    msgs = source.startswith("/messages/")
    sensor = source.startswith("/messages/modules/sensor/")
    body: Any = None
    if s.get("contentType") == "application/json" and s.get("contentEncoding") == "utf-8":
        try:
            body = json.loads(m.body)
        except ValueError:
            body = None
    b = body if type(body) is dict else {}
    dev = s.get("connectionDeviceId")
    hits: list[tuple[str, int, int | None]] = []
    if msgs:
        if p.get("alert") == "true":
            hits.append((UP, 0, 86400))
        hits.append((UP, 5, 604800))
        if source.startswith("/messages/modules/sensor/outputs/temperature/"):
            t = _num(b.get("temperature"))
            if t is not None and t > 30:
                hits.append((HOT, 1, None))
        if sensor:
            lv = _as_number(p.get("level"))
            if lv is not None and lv >= 3:
                hits.append((LEVEL, DEFAULT_PRIORITY, None))
        if dev == "pump-7":
            hits.append((UP, 2, 3600))
        if dev is not None and dev.startswith("gw-") and p.get("kind") == "diag":
            hits.append((DIAG, DEFAULT_PRIORITY, None))
        errs = _num(b.get("errors"))
        if b.get("status") == "fault" or (errs is not None and errs > 0):
            hits.append((FAULT, 0, None))
        if source.startswith("/messages/modules/"):
            site = p.get("site")
            if site is not None and site.lower() == "north":
                hits.append((NORTH, DEFAULT_PRIORITY, None))
        bt = _as_number(p.get("batch"))
        if bt is not None and math.fmod(bt, 10) == 0:
            hits.append((BATCH, DEFAULT_PRIORITY, None))
        pr = _num(b.get("pressure"))
        if pr is not None and pr * 0.145 > 100:
            hits.append((PRESS, 3, None))
        tags = p.get("tags")
        if tags is not None and "critical" in tags:
            hits.append((UP, 1, 7200))
        # $body.version <> 2 as Azure's BodyQueryTest has it: a missing path is null, and body values of different
        # JSON types compare unequal (TRUE); an object or array is undefined; a body that is no JSON is undefined.
        ver = b.get("version")
        version_is_2 = type(ver) in (int, float) and ver == 2
        json_body = s.get("contentType") == "application/json" and body is not None
        if json_body and type(ver) not in (dict, list) and not version_is_2:
            hits.append((JSONV, DEFAULT_PRIORITY, None))
        if p.get("priority") == "high":
            hits.append((UP, 1, 600))
        # NOT (mode = 'test') is UNDEFINED when mode is missing, and AND with UNDEFINED is not TRUE
        if p.get("zone") in ("a", "b") and "mode" in p and p["mode"] != "test":
            hits.append((ZONE, DEFAULT_PRIORITY, None))
        if source.startswith("/messages/modules/camera/"):
            hits.append((FRAMES, 6, None))
        serial = p.get("serial")
        if serial is not None and len(serial) == 12:
            hits.append((SERIAL, DEFAULT_PRIORITY, None))
        loc = b.get("location")
        if type(loc) is dict:
            lat, lon = _num(loc.get("lat")), _num(loc.get("lon"))
            if lat is not None and lon is not None and lat > 50 and lon < 10:
                hits.append((GEO, DEFAULT_PRIORITY, None))
        d = _as_number(p.get("delta"))
        if d is not None and abs(d) > 5:
            hits.append((DELTA, DEFAULT_PRIORITY, None))
        if p.get("kind", "none") == "heartbeat":
            hits.append((HB, 9, None))
    if source.startswith("/twinchangenotifications/"):
        hits.append((UP, 4, None))
    best: dict[str, RouteResult] = {}
    for endpoint, prio, ttl in hits:
        old = best.get(endpoint)
        if (
            old is None
            or prio < old.priority
            or (prio == old.priority and old.ttl_s is not None and (ttl is None or ttl > old.ttl_s))
        ):
            best[endpoint] = RouteResult(endpoint, prio, ttl)
    return list(best.values())


def _time(fn: Callable[[Message], object], msgs: list[Message], repeats: int) -> float:
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        for m in msgs:
            fn(m)
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    msgs = make_messages(args.messages)
    router = Router(ROUTES)
    mismatches = [
        i for i, m in enumerate(msgs) if sorted(map(repr, router.route(m))) != sorted(map(repr, hand_route(m)))
    ]
    if mismatches:
        i = mismatches[0]
        raise SystemExit(
            f"verdicts differ on {len(mismatches)} messages; first: {msgs[i]}\n"
            f"compiled={router.route(msgs[i])}\nhand={hand_route(msgs[i])}"
        )
    routed = sum(len(router.route(m)) for m in msgs)
    # Interleave the two sides so that machine noise hits both alike.
    t_compiled = t_hand = math.inf
    for _ in range(args.repeats):
        t_compiled = min(t_compiled, _time(router.route, msgs, 1))
        t_hand = min(t_hand, _time(hand_route, msgs, 1))
    n, r = len(msgs), len(ROUTES)
    result = {
        "messages": n,
        "routes": r,
        "results_per_message": round(routed / n, 3),
        "compiled_msgs_per_s": round(n / t_compiled),
        "hand_msgs_per_s": round(n / t_hand),
        "compiled_evals_per_s": round(n * r / t_compiled),
        "hand_evals_per_s": round(n * r / t_hand),
        "ratio": round(t_hand / t_compiled, 3),
    }
    print(
        f"compiled router: {result['compiled_msgs_per_s']:,} msgs/s ({result['compiled_evals_per_s']:,} route evals/s)"
    )
    print(f"hand-written:    {result['hand_msgs_per_s']:,} msgs/s ({result['hand_evals_per_s']:,} route evals/s)")
    print(f"ratio compiled/hand: {result['ratio']} (target >= 0.5); verdicts identical on all {n} messages")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
