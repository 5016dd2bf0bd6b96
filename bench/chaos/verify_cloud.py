"""The chaos verifier's cloud side: cloud-to-device messages and direct method calls against what reached the
command device and the module, and what the cloud was answered.

Pure, like ``bench.chaos.verify``: it takes what the run recorded and returns a ``CloudVerdict``; its rules are
tested on small hand-made inputs (``tests/bench/test_chaos_verify_cloud.py``).

The rules, and why:

* **c2d_lost**: a cloud-to-device message the broker acknowledged to the cloud that never reached the device.
  Must be 0: the broker keeps QoS 1 messages for the hub's persistent session, the hub stores one before it
  acknowledges it, and its TTL (an hour) is longer than any run's drain. A second arrival is a redelivery (at
  least once), counted apart, not a failure.
* **methods**: each call gets at most one answer, and the answer's status must be one the call can have had:

  - ``echo`` (the target answers it at once): 200 with the call's own payload; 404 (the target was not connected)
    only if the target, by its own account, was not connected and subscribed for the whole time from the call
    to its answer; 504 (timed out) only if the target never answered it and was not connected for that whole
    time either (a connected target gets the call and answers it);
  - ``ignore`` (never answered): 504, and never before the call's timeout passed; or 404 as above;
  - no answer at all: a call or its answer lost with a hub kill or a link outage (calls are QoS 0 and never
    stored). Counted as ``methods_unanswered`` when a disruption overlaps the call's life (from the call to its
    timeout plus ``margin_s``), otherwise it is wrong. A disruption lasts ``settle_s`` past its end: the hub's
    upstream reconnects and subscribes again after a restart or a restored link, and a call the broker gets
    before those subscriptions are acknowledged has no subscriber (the run also counts, as disruptions, the
    times the link had no connection of the hub's at all, which a silent outage can cause long after it);
  - any other status, a second answer, or an answer to no call of the cloud's is wrong.

  ``methods_wrong`` must be 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from bench.chaos.cloud import Call

__all__ = ["CloudVerdict", "verify_cloud"]

EARLY_SLACK_S = 0.01  # clock reads of one machine: a 504 this much before the timeout is still early


@dataclass
class CloudVerdict:
    c2d_acknowledged: int = 0
    c2d_delivered: int = 0
    c2d_lost: int = 0
    c2d_redeliveries: int = 0
    methods_called: int = 0
    methods_answered: int = 0  # 200 with the call's payload
    methods_not_connected: int = 0  # 404
    methods_timed_out: int = 0  # 504
    methods_unanswered: int = 0  # no answer, with a kill or an outage in the call's life
    methods_wrong: int = 0
    examples: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, object]:
        return {
            "c2d_acknowledged": self.c2d_acknowledged,
            "c2d_delivered": self.c2d_delivered,
            "c2d_lost": self.c2d_lost,
            "c2d_redeliveries": self.c2d_redeliveries,
            "methods_called": self.methods_called,
            "methods_answered": self.methods_answered,
            "methods_not_connected": self.methods_not_connected,
            "methods_timed_out": self.methods_timed_out,
            "methods_unanswered": self.methods_unanswered,
            "methods_wrong": self.methods_wrong,
        }

    def _wrong(self, text: str) -> None:
        self.methods_wrong += 1
        if len(self.examples) < 10:
            self.examples.append(text)


def _covered(spans: Sequence[tuple[float, float]], start: float, end: float) -> bool:
    """Whether one span holds all of ``[start, end]``."""
    return any(a <= start and end <= b for a, b in spans)


def _overlaps(spans: Sequence[tuple[float, float]], start: float, end: float) -> bool:
    return any(a <= end and start <= b for a, b in spans)


def _check_answer(v: CloudVerdict, call: Call, answered: bool, spans: Sequence[tuple[float, float]]) -> None:
    status, payload, at = call.answers[0]
    was = f"call {call.call_id} ({call.name} on {call.target})"
    connected_throughout = _covered(spans, call.sent_at, at)
    if status == 200 and call.name == "echo":
        if payload == call.payload:
            v.methods_answered += 1
        else:
            v._wrong(f"{was} answered 200 with {payload[:60]!r}, not its own payload")
    elif status == 404:
        if connected_throughout:
            v._wrong(f"{was} answered 404 while its target was connected from the call to the answer")
        else:
            v.methods_not_connected += 1
    elif status == 504:
        if call.name == "echo" and (answered or connected_throughout):
            v._wrong(f"{was} answered 504 though its target {'answered it' if answered else 'was connected'}")
        elif at - call.sent_at < call.timeout_s - EARLY_SLACK_S:
            v._wrong(f"{was} answered 504 after {at - call.sent_at:.2f} s, before its {call.timeout_s:g} s timeout")
        else:
            v.methods_timed_out += 1
    else:
        v._wrong(f"{was} answered {status}")


def verify_cloud(
    *,
    c2d_acked: Iterable[int],
    c2d_received: Mapping[int, int],
    calls: Iterable[Call],
    answered: Mapping[str, Iterable[str]],
    connected: Mapping[str, Sequence[tuple[float, float]]],
    disruptions: Sequence[tuple[float, float]],
    stray_answers: Sequence[str] = (),
    margin_s: float = 15.0,
    settle_s: float = 10.0,
) -> CloudVerdict:
    """``c2d_acked``: the numbers of the cloud-to-device messages the broker acknowledged; ``c2d_received``: how
    many times each number reached the device; ``answered``: per target, the ids of the calls it answered;
    ``connected``: per target, its connected-and-subscribed spans; ``disruptions``: the spans of hub kills (to
    the restart) and link outages (to the restore); all times epoch seconds."""
    v = CloudVerdict()
    acked = set(c2d_acked)
    v.c2d_acknowledged = len(acked)
    v.c2d_delivered = sum(1 for n in acked if n in c2d_received)
    v.c2d_lost = v.c2d_acknowledged - v.c2d_delivered
    v.c2d_redeliveries = sum(k - 1 for k in c2d_received.values() if k > 1)
    for n in sorted(acked - set(c2d_received))[:5]:
        v.examples.append(f"cloud-to-device #{n} acknowledged by the broker, never at the device")
    answered_ids = {target: set(ids) for target, ids in answered.items()}
    for call in sorted(calls, key=lambda c: int(c.call_id) if c.call_id.isdigit() else 0):
        v.methods_called += 1
        if len(call.answers) > 1:
            v._wrong(f"call {call.call_id} answered {len(call.answers)} times: {[a[0] for a in call.answers]}")
        elif call.answers:
            _check_answer(v, call, call.call_id in answered_ids.get(call.target, set()), connected.get(call.target, []))
        elif _overlaps(disruptions, call.sent_at - settle_s, call.sent_at + call.timeout_s + margin_s):
            v.methods_unanswered += 1
        else:
            v._wrong(f"call {call.call_id} ({call.name} on {call.target}) never answered, with no kill or outage")
    for topic in stray_answers:
        v._wrong(f"an answer to no call of the cloud's: {topic}")
    return v
