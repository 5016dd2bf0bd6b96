"""The manifest check: a deployment document in, its ``DeploymentPlan`` or every error out.

Usage: python -m edgehub.runtime.deployment.check < DOCUMENT.json > ANSWER.json

The serving hub runs this as a short-lived child process for every deployment it applies
(``edgehub.runtime.deployment.plan.check_deployment``), so that pydantic, the manifest's models and lark are
loaded here and never in the hub. ``plan_of`` is the same check in process, for the commands that only check.

It reads at most ``MAX_DOCUMENT_BYTES`` of JSON from stdin and writes one ``CheckAnswer`` as JSON on stdout, exit
code 0, whether the document is accepted (``plan``) or refused (``errors``: every problem with its location, as
``parse_deployment`` and the settings' own checks give them). Anything else (exit code not 0, a traceback on
stderr) is a bug of the check, and the hub refuses the deployment for it.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from edgehub.manifest import ManifestError, parse_deployment
from edgehub.routing.parser import parse_route_ast
from edgehub.routing.wire import route_to_wire
from edgehub.runtime.deployment.answer import (
    MAX_DOCUMENT_BYTES,
    CheckAnswer,
    DeploymentPlan,
    PlannedRoute,
    encode_answer,
)
from edgehub.runtime.deployment.wants import desired_settings

__all__ = ["answer_for", "main", "plan_of"]


def plan_of(document: Any) -> DeploymentPlan:
    """``document`` checked in process: its plan, or ``ManifestError`` listing every problem."""
    deployment = parse_deployment(document)
    wanted = desired_settings(deployment.desired)
    # The values' own checks (a retry policy's order) run where they are filled in (settings_of: in the hub, and
    # in runtime.deployment.plan.runnable for the commands that check): the store and the executors' types are
    # not loaded here, so the check starts sooner.
    routes = [
        PlannedRoute(
            name, spec.route, spec.priority, spec.time_to_live_secs, route_to_wire(parse_route_ast(spec.route))
        )
        for name, spec in deployment.desired.route_specs().items()
    ]
    section = deployment.desired.unsupported()
    return DeploymentPlan(
        routes=routes,
        settings=wanted,
        module_twins={k: dict(v) for k, v in deployment.module_twins.items()},
        unsupported=section,
        module_unsupported=[u for u in deployment.unsupported if u not in section],
        grants=list(deployment.grants),
    )


def answer_for(raw: bytes) -> CheckAnswer:
    """The answer to ``raw`` (the document's JSON)."""
    if len(raw) > MAX_DOCUMENT_BYTES:
        return CheckAnswer([f"(top): over the limit of {MAX_DOCUMENT_BYTES} bytes for a document"])
    try:
        document = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        return CheckAnswer([f"(top): not JSON: {exc}"])
    try:
        return CheckAnswer([], plan_of(document))
    except ManifestError as exc:
        return CheckAnswer(list(exc.errors))


def main() -> None:
    raw = sys.stdin.buffer.read(MAX_DOCUMENT_BYTES + 1)
    sys.stdout.buffer.write(encode_answer(answer_for(raw)))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
