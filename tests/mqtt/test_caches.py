"""BudgetDict: a per-connection memo bounded in bytes."""

from __future__ import annotations

from edgehub.mqtt.caches import BudgetDict
from edgehub.mqtt.decoder import Decoder
from edgehub.mqtt.encoder import encode
from edgehub.mqtt.packets import Publish


def test_what_is_kept_never_passes_the_budget_and_huge_entries_are_not_kept() -> None:
    cache: BudgetDict[str, int] = BudgetDict(1000)
    cache.remember("huge", 1, 251)  # over a quarter of the budget
    assert "huge" not in cache
    for i in range(100):
        cache.remember(f"k{i}", i, 100)
        assert cache.used <= 1000
        assert cache[f"k{i}"] == i
    assert len(cache) <= 10


def test_a_decoder_keeps_a_bounded_number_of_bytes_of_topics_however_many_it_sees() -> None:
    d = Decoder(protocol_level=4, topic_cache_bytes=8192)
    for i in range(2000):
        topic = f"devices/d/messages/events/{i:05d}" + "x" * 900
        assert d.receive_data(encode(Publish(topic, b"p"), 4)) == [Publish(topic, b"p")]
    assert d._topics.used <= 8192
