"""The figures a store reads at open (usage per endpoint, per identity and store-wide; each queue's next
offset), found again by a full scan of its data, for the tests that check the two agree."""

from __future__ import annotations

from edgehub.store import QueueId, Store
from edgehub.store.backend import Backend
from edgehub.store.codec import decode_message, decode_ref, pack_u64, unpack_u64
from edgehub.store.records import MESSAGES, charged_size
from edgehub.store.usage import OWNER, STORE_WIDE, Usage, add, owner_of


def scanned(backend: Backend) -> tuple[Usage, dict[QueueId, int]]:
    """The figures a full scan finds: each body once store-wide and for its sender, each reference for its
    endpoint (its body's charged size); and each queue's last offset."""
    usage: Usage = {}
    sizes: dict[int, int] = {}
    for k, raw in backend.scan(MESSAGES, pack_u64(0), 1 << 30):
        message = decode_message(raw).to_message()
        sizes[unpack_u64(k)] = size = charged_size(message)
        add(usage, STORE_WIDE, 1, size)
        owner = owner_of(message.system_properties)
        if owner is not None:
            add(usage, owner, 1, size)
    last: dict[QueueId, int] = {}
    for name in backend.families():
        if not QueueId.is_queue_name(name):
            continue
        q = QueueId.parse(name)
        for k, raw in backend.scan(name, pack_u64(0), 1 << 30):
            add(usage, q.endpoint, 1, sizes[decode_ref(raw).message_key])
            last[q] = unpack_u64(k)
    return usage, last


def assert_open_figures_match_a_scan(store: Store, backend: Backend) -> None:
    usage, last = scanned(backend)
    assert usage[STORE_WIDE] == store.usage(None)
    for key, figure in usage.items():
        if key.startswith(OWNER):
            assert store.identity_usage(key[len(OWNER) :]) == figure, key
        elif key != STORE_WIDE:
            assert store.usage(key) == figure, key
    for q, offset in last.items():
        assert store.next_offset(q) == offset + 1, q  # these writes remove no queue's tail, so nothing is past it
