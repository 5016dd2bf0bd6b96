"""edgehub's own sections of the ``$edgeHub`` desired properties: every setting of the store and the executors
that Azure IoT Edge's schema has no key for (``docs/manifest.md`` and the generated JSON Schema in
``deployment/schema/`` document each).

* ``storeAndForwardConfiguration`` keeps Azure's ``timeToLiveSecs`` and adds the store-wide quota
  (``maxStoreBytes``, ``maxStoreMessages``, ``identityShare``), the fsync policy (``fsync``: ``always``,
  ``interval`` or ``none``, with ``fsyncIntervalMs``) and cleanup (``cleanupIntervalSecs``, ``cleanupMode``:
  ``headOnly`` or ``entireQueue``);
* ``delivery``: the hub-wide ``retryPolicy`` (with ``ignoreEndpointOverride``), ``maxDeliveryAttempts``, the
  ``queuePolicy`` every endpoint starts from, and the ``moduleDeliveryWindow`` (deliveries in flight per module);
* ``endpoints``: per endpoint id (``$upstream``, ``$upstream/{i}``, ``/modules/{m}/inputs/{i}``) its own
  ``queuePolicy`` (each key overrides the hub's), ``retryPolicy`` and ``maxDeliveryAttempts``; ``drop``: once no
  route names the endpoint, what it holds is deleted (counted) rather than drained.

Invariants: every model forbids keys it does not know (a typo is an error naming its path, never a setting left at
its default in silence); numbers are strict JSON numbers of their type, each bounded; a key left out is None and
means "the hub's value" (the runtime fills it from the one home of each default: ``QueuePolicy``,
``RetryPolicy``, ``ExecutorSettings``), so a default is never written twice.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, field_validator

from edgehub.core.endpoints import is_upstream_endpoint, parse_module_endpoint
from edgehub.core.message_size import MAX_MESSAGE_SIZE_BYTES

__all__ = [
    "DeliveryConfiguration",
    "EndpointConfiguration",
    "EndpointId",
    "QueuePolicyConfiguration",
    "RetryPolicyConfiguration",
    "StoreAndForwardConfiguration",
]

DEFAULT_TTL_SECS = 7200
MAX_TTL_SECS = 4_294_967_295
Number = StrictInt | StrictFloat


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StoreAndForwardConfiguration(_Strict):
    """Azure's ``timeToLiveSecs``; the rest is edgehub's (None: the command line's value, then the default)."""

    timeToLiveSecs: StrictInt = Field(default=DEFAULT_TTL_SECS, ge=0, le=MAX_TTL_SECS)
    maxStoreBytes: StrictInt | None = Field(default=None, ge=1, description="store-wide byte quota")
    maxStoreMessages: StrictInt | None = Field(default=None, ge=1, description="store-wide message quota")
    identityShare: Number | None = Field(
        default=None, gt=0, le=1, description="the part of maxStoreBytes one device or module may hold"
    )
    fsync: Literal["always", "interval", "none"] | None = None
    fsyncIntervalMs: StrictInt | None = Field(default=None, ge=1, le=10_000, description="with fsync 'interval'")
    cleanupIntervalSecs: StrictInt | None = Field(default=None, ge=1, le=86_400)
    cleanupMode: Literal["headOnly", "entireQueue"] | None = None


class QueuePolicyConfiguration(_Strict):
    """A queue policy (per endpoint, all its priorities together); each key left out is inherited."""

    # The hard cap the store and the heads share (edgehub.core.message_size): above it, refused with its path.
    maxMessageSizeBytes: StrictInt | None = Field(default=None, ge=1, le=MAX_MESSAGE_SIZE_BYTES)
    maxQueueBytes: StrictInt | None = Field(default=None, ge=0)
    maxQueueMessages: StrictInt | None = Field(default=None, ge=0)
    overflow: Literal["rejectIncoming", "discardIncoming", "discardOldest"] | None = None
    enqueueTimeoutSecs: Number | None = Field(default=None, ge=0, le=60)


class RetryPolicyConfiguration(_Strict):
    """The executor's retry schedule (``edgehub.delivery.retry``); each key left out keeps its default."""

    retriesWithNoDelay: StrictInt | None = Field(default=None, ge=0, le=1_000_000)
    minimumDelayRetries: StrictInt | None = Field(default=None, ge=0, le=1_000_000)
    minimumDelaySecs: Number | None = Field(default=None, ge=0, le=86_400)
    maximumDelaySecs: Number | None = Field(default=None, ge=0, le=86_400)
    backoffRetries: StrictInt | None = Field(default=None, ge=0, le=1_000)
    backoffFunction: Literal["linear", "arithmetic", "geometric", "exponential"] | None = None
    maximumDelayRetries: StrictInt | None = Field(default=None, ge=0, le=1_000_000)
    jitter: Number | None = Field(default=None, ge=0, lt=1)
    ignoreEndpointOverride: StrictBool | None = Field(
        default=None, description="hub-wide only: every endpoint uses the hub's policy"
    )


class DeliveryConfiguration(_Strict):
    retryPolicy: RetryPolicyConfiguration = Field(default_factory=RetryPolicyConfiguration)
    maxDeliveryAttempts: StrictInt | None = Field(default=None, ge=1, le=1_000_000)
    queuePolicy: QueuePolicyConfiguration = Field(default_factory=QueuePolicyConfiguration)
    moduleDeliveryWindow: StrictInt | None = Field(default=None, ge=1, le=65_535)


class EndpointConfiguration(_Strict):
    queuePolicy: QueuePolicyConfiguration = Field(default_factory=QueuePolicyConfiguration)
    retryPolicy: RetryPolicyConfiguration | None = None
    maxDeliveryAttempts: StrictInt | None = Field(default=None, ge=1, le=1_000_000)
    drop: StrictBool = Field(
        default=False, description="when no route names this endpoint, delete what it holds instead of draining it"
    )

    @field_validator("retryPolicy")
    @classmethod
    def _no_hub_only_keys(cls, v: RetryPolicyConfiguration | None) -> RetryPolicyConfiguration | None:
        if v is not None and v.ignoreEndpointOverride is not None:
            raise ValueError("ignoreEndpointOverride is the hub's (delivery.retryPolicy), not an endpoint's")
        return v


def _endpoint_id(endpoint: str) -> str:
    if not is_upstream_endpoint(endpoint) and parse_module_endpoint(endpoint) is None:
        raise ValueError("not an endpoint id: '$upstream', '$upstream/<i>' or '/modules/<module>/inputs/<input>'")
    return endpoint


EndpointId = Annotated[str, AfterValidator(_endpoint_id)]
