"""A deployment checked in a short-lived child process, and what the serving hub makes of the answer.

The manifest's schema has one home (``edgehub.manifest``, pydantic) and route text one parser (lark); together they
are ~15 MB of a serving hub's memory that it needs only while a manifest is checked. So the serving hub never
imports them: each check (at start, and each live update: the watched file, the admin API, the cloud twin) runs
``python -m edgehub.runtime.deployment.check`` with the same interpreter, the document on its stdin. The child
validates, turns the deployment into plain values (``DeploymentPlan``: the routes as their syntax trees, the
settings a deployment sets, the module twins, the ACL grants) and writes them as JSON on its stdout; the hub
decodes them into their types (msgspec), compiles the trees into closures and fills in the settings
(``runnable``). A refused document comes back as the same list of ``location: what`` errors the check gives in
process (``ManifestError.errors``).

Bounds: a check answers within ``CHECK_TIMEOUT_S``, with at most ``MAX_ANSWER_BYTES`` on stdout (what the child
writes on stderr is kept up to ``MAX_STDERR_BYTES``, for the reason); a child that fails, times out, says too much
or says something that is not an answer is killed if it still runs and the deployment is refused
(``DeploymentCheckFailed``, a ManifestError with that reason), never a crash of the hub. The answer is checked
again here: trees that do not compile or settings whose values refuse them are a refusal too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
from dataclasses import dataclass
from typing import Any

import msgspec

from edgehub.manifest.documents import MAX_MANIFEST_BYTES, ManifestError
from edgehub.manifest.grants import Grant
from edgehub.routing import RouteError, Router, RouteSpec
from edgehub.routing.wire import route_from_wire
from edgehub.runtime.deployment.answer import (
    MAX_DOCUMENT_BYTES,
    CheckAnswer,
    DeploymentPlan,
    PlannedRoute,
    encode_answer,
)
from edgehub.runtime.deployment.settings import RunningSettings, StartSettings, settings_of

__all__ = [
    "CHECK_MODULE",
    "CHECK_TIMEOUT_S",
    "MAX_ANSWER_BYTES",
    "CheckAnswer",
    "DeploymentCheckFailed",
    "DeploymentPlan",
    "PendingCheck",
    "PlannedRoute",
    "Runnable",
    "check_deployment",
    "decode_answer",
    "encode_answer",
    "plan_from_value",
    "runnable",
]

log = logging.getLogger(__name__)

CHECK_MODULE = "edgehub.runtime.deployment.check"
# A Pi Zero 2 W imports pydantic and builds the models in a few seconds; a check that takes this long is stuck.
CHECK_TIMEOUT_S = 60.0
# The module twins are at most the manifest's size; a route's tree as JSON is some ten times its text.
MAX_ANSWER_BYTES = 16 * MAX_MANIFEST_BYTES
MAX_STDERR_BYTES = 4096


class DeploymentCheckFailed(ManifestError):
    """The check itself failed (its process could not start, exited without an answer, timed out or answered
    something that is not an answer): the deployment is refused for that reason, the running one stays."""


def plan_from_value(value: Any) -> DeploymentPlan | None:
    """A plan kept as JSON values (``dataclasses.asdict``), or None when ``value`` is not one."""
    try:
        return msgspec.convert(value, DeploymentPlan)
    except msgspec.ValidationError:
        return None


def decode_answer(raw: bytes) -> CheckAnswer:
    """``raw`` as a ``CheckAnswer`` of the right types; ``DeploymentCheckFailed`` when it is not one."""
    try:
        return msgspec.convert(json.loads(raw), CheckAnswer)
    except (ValueError, RecursionError, msgspec.ValidationError) as exc:
        raise _failed(f"its answer is not one: {exc}") from None


@dataclass(frozen=True, slots=True, eq=False)
class Runnable:
    """A checked deployment as the hub runs it: its routes compiled, its settings filled in."""

    plan: DeploymentPlan
    router: Router
    settings: RunningSettings

    @property
    def unsupported(self) -> tuple[str, ...]:
        return (*self.plan.module_unsupported, *self.plan.unsupported)

    @property
    def grants(self) -> tuple[Grant, ...]:
        return tuple(self.plan.grants)


def runnable(plan: DeploymentPlan, start: StartSettings) -> Runnable:
    """``plan`` compiled and filled in from ``start``; ``ManifestError`` when it cannot run."""
    try:
        trees = {r.name: route_from_wire(r.tree) for r in plan.routes}
    except ValueError as exc:
        raise _failed(f"a route's tree is not one: {exc}") from None
    specs = {r.name: RouteSpec(r.text, r.priority, r.time_to_live_secs) for r in plan.routes}
    try:
        router = Router(specs, trees=trees)
    except (RouteError, ValueError) as exc:
        raise _failed(f"its routes do not compile here: {exc}") from None
    return Runnable(plan, router, settings_of(plan.settings, start))


def _failed(reason: str) -> DeploymentCheckFailed:
    text = f"(check): the manifest check failed: {reason}"
    return DeploymentCheckFailed(text, (text,))


async def check_deployment(document: Any, *, timeout_s: float = CHECK_TIMEOUT_S) -> DeploymentPlan:
    """``document`` (a deployment manifest, or the ``$edgeHub`` desired properties alone) checked in a child
    process: its plan, or ``ManifestError`` listing every problem (``DeploymentCheckFailed`` when the check
    itself failed)."""
    return await (await PendingCheck.start(document, timeout_s=timeout_s)).answer()


class PendingCheck:
    """A check under way: its process started with the document on its way to it, so the caller can do other work
    (a hub's start opens its store meanwhile) before it waits for the answer (``answer``, once). ``close`` ends a
    check whose answer is no longer wanted."""

    def __init__(self, proc: asyncio.subprocess.Process, deadline: float, timeout_s: float) -> None:
        self._proc = proc
        self._deadline = deadline
        self._timeout_s = timeout_s

    @classmethod
    async def start(cls, document: Any, *, timeout_s: float = CHECK_TIMEOUT_S) -> PendingCheck:
        """``ManifestError`` at once for a document that cannot be sent; ``DeploymentCheckFailed`` when the check's
        process cannot start."""
        try:
            data = json.dumps(document).encode("ascii")
        except (TypeError, ValueError, RecursionError) as exc:
            raise ManifestError(f"(top): not a JSON document: {exc}") from None
        if len(data) > MAX_DOCUMENT_BYTES:
            raise ManifestError(f"(top): over the limit of {MAX_MANIFEST_BYTES} bytes for a manifest")
        deadline = asyncio.get_running_loop().time() + timeout_s
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-P",  # the check imports edgehub from where this hub does, never from the working directory
                "-m",
                CHECK_MODULE,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as exc:
            raise _failed(f"cannot start {sys.executable}: {exc.strerror}") from None
        assert proc.stdin is not None
        proc.stdin.write(data)  # buffered: what the pipe does not take now goes while the answer is awaited
        return cls(proc, deadline, timeout_s)

    async def answer(self) -> DeploymentPlan:
        """The plan, or ``ManifestError`` listing every problem (``DeploymentCheckFailed``: the check failed)."""
        try:
            async with asyncio.timeout_at(self._deadline):
                out, err, code = await _talk(self._proc)
        except TimeoutError:
            raise _failed(f"no answer in {self._timeout_s:g} s") from None
        finally:
            await self.close()
        if code != 0 or out is None:
            last = err.decode("utf-8", "replace").strip().splitlines()[-1:] or ["(nothing on stderr)"]
            why = f"over {MAX_ANSWER_BYTES} bytes of answer" if out is None else f"exit code {code}"
            log.warning("deployment.check_failed code=%s stderr=%r", code, err[-MAX_STDERR_BYTES:])
            raise _failed(f"{why}: {last[0][:200]}")
        answer = decode_answer(out)
        if answer.errors or answer.plan is None:
            errors = tuple(answer.errors) or ("(check): refused without a reason",)
            raise ManifestError(f"deployment refused: {'; '.join(errors)}", errors)
        return answer.plan

    async def close(self) -> None:
        """End the check's process if it still runs (idempotent)."""
        if self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()
            await self._proc.wait()


async def _talk(proc: asyncio.subprocess.Process) -> tuple[bytes | None, bytes, int]:
    """Finish sending the document, read the answer (None: over ``MAX_ANSWER_BYTES``) and the tail of stderr, and
    wait for the exit."""
    assert proc.stdin is not None
    assert proc.stdout is not None
    assert proc.stderr is not None
    stdin, stdout, stderr = proc.stdin, proc.stdout, proc.stderr

    async def send() -> None:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # it exited early: its code says why
            await stdin.drain()
            stdin.close()

    async def read(stream: asyncio.StreamReader, limit: int, keep_tail: bool) -> bytes | None:
        got = bytearray()
        while chunk := await stream.read(65536):
            got += chunk
            if len(got) > limit:
                if not keep_tail:
                    proc.kill()  # it says too much: no answer is that long
                    return None
                del got[: len(got) - limit]
        return bytes(got)

    _, out, err = await asyncio.gather(
        send(), read(stdout, MAX_ANSWER_BYTES, False), read(stderr, MAX_STDERR_BYTES, True)
    )
    code = await proc.wait()
    return out, err or b"", code
