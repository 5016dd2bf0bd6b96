"""edgehub.delivery: endpoint executors (per-priority checkpointers and state machines), retry policy, the
Endpoint seam."""

from edgehub.delivery.checkpointer import Checkpointer
from edgehub.delivery.endpoint import (
    CarriesPriorities,
    Endpoint,
    PipelinedEndpoint,
    QueuedMessage,
    ReportsUnreachable,
    SendResult,
)
from edgehub.delivery.executor import DeadLetterReason, EndpointExecutor, ExecutorSettings
from edgehub.delivery.fsm import TRANSITIONS, Event, InvalidTransition, State, next_state
from edgehub.delivery.retry import BackoffFunction, RetryPolicy, effective_policy

__all__ = [
    "TRANSITIONS",
    "BackoffFunction",
    "CarriesPriorities",
    "Checkpointer",
    "DeadLetterReason",
    "Endpoint",
    "EndpointExecutor",
    "Event",
    "ExecutorSettings",
    "InvalidTransition",
    "PipelinedEndpoint",
    "QueuedMessage",
    "ReportsUnreachable",
    "RetryPolicy",
    "SendResult",
    "State",
    "effective_policy",
    "next_state",
]
