"""edgehub.store: durable queues of message references over RocksDB (rocksdict) or memory.

``edgehub.store.rocks.open_rocks_store(path, ...)`` opens the RocksDB store; that module is the only one that
imports rocksdict, and this package does not import it (so layers above never load rocksdict through it).

See ``edgehub.store.store`` for the API the hub and the executors call, and its invariants; the store's parts
(quotas, usage, held, ingest, maintenance, dead_letters, metadata, queue_state) open with theirs.
"""

from edgehub.store.backend import Backend, DeleteTo, MemoryBackend
from edgehub.store.group_commit import GroupCommitter
from edgehub.store.policy import DEFAULT_MAX_MESSAGE_SIZE_BYTES, Overflow, QueuePolicy, StoreQuota
from edgehub.store.queues import QueueId, dead_letter_name
from edgehub.store.records import (
    Checkpoint,
    DeadLetter,
    EnqueueReceipt,
    FsyncPolicy,
    Reference,
    RemovalReason,
    StoredItem,
)
from edgehub.store.store import Store

__all__ = [
    "DEFAULT_MAX_MESSAGE_SIZE_BYTES",
    "Backend",
    "Checkpoint",
    "DeadLetter",
    "DeleteTo",
    "EnqueueReceipt",
    "FsyncPolicy",
    "GroupCommitter",
    "MemoryBackend",
    "Overflow",
    "QueueId",
    "QueuePolicy",
    "Reference",
    "RemovalReason",
    "Store",
    "StoreQuota",
    "StoredItem",
    "dead_letter_name",
]
