"""edgehub.store: durable queues of message references over RocksDB (rocksdict) or memory.

See ``edgehub.store.store`` for the API the hub and the executors call, and its invariants.
"""

from edgehub.store.backend import Backend, MemoryBackend
from edgehub.store.group_commit import GroupCommitter
from edgehub.store.queues import QueueId, dead_letter_name
from edgehub.store.store import (
    Checkpoint,
    DeadLetter,
    EnqueueReceipt,
    FsyncPolicy,
    RemovalReason,
    Store,
    StoredItem,
)

__all__ = [
    "Backend",
    "Checkpoint",
    "DeadLetter",
    "EnqueueReceipt",
    "FsyncPolicy",
    "GroupCommitter",
    "MemoryBackend",
    "QueueId",
    "RemovalReason",
    "Store",
    "StoredItem",
    "dead_letter_name",
]
