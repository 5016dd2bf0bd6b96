"""Each head answers every refusal of a message from its one table, and the hub's store-failure outcome is one."""

from __future__ import annotations

import pytest

from edgehub.core.logtext import shown
from edgehub.core.refusals import MESSAGE_REFUSALS, STORE_UNAVAILABLE_TEXT, RefusalReason
from edgehub.hub import STORE_UNAVAILABLE
from edgehub.mqtt.packets import ReasonCode
from protocol_heads.amqp.refusals import REJECT_CONDITIONS, rejection_condition
from protocol_heads.mqtt.refusals import REJECT_REASONS

# MQTT 5.0 section 3.4.2.1: the PUBACK's failure reason codes (0x95, Packet too large, is not one).
PUBACK_FAILURES = {0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99}


@pytest.mark.parametrize("reason", sorted(MESSAGE_REFUSALS))
def test_every_refusal_of_a_message_has_an_mqtt_reason_code_and_an_amqp_condition(reason: RefusalReason) -> None:
    assert REJECT_REASONS[reason] >= 0x80  # a negative PUBACK
    assert REJECT_REASONS[reason] in PUBACK_FAILURES  # one MQTT 5 allows in a PUBACK: a client drops others
    assert REJECT_CONDITIONS[reason].startswith("amqp:")
    assert rejection_condition(reason) == REJECT_CONDITIONS[reason]


def test_a_store_that_cannot_write_is_the_same_refusal_in_both_heads() -> None:
    assert STORE_UNAVAILABLE.reason == RefusalReason.STORE_UNAVAILABLE
    assert STORE_UNAVAILABLE.detail == STORE_UNAVAILABLE_TEXT
    assert REJECT_REASONS[RefusalReason.STORE_UNAVAILABLE] == ReasonCode.QUOTA_EXCEEDED  # retry later
    assert REJECT_CONDITIONS[RefusalReason.STORE_UNAVAILABLE] == "amqp:resource-limit-exceeded"


def test_shown_bounds_a_clients_words_and_quotes_them_unless_plain() -> None:
    assert shown("dev1/mod1") == "dev1/mod1"
    assert shown("a b") == "'a b'"
    assert shown("x\nrefused reason=forged") == repr("x\nrefused reason=forged")
    assert shown("x" * 200) == "x" * 128 + "..."
    assert shown("x" * 300, 200) == "x" * 200 + "..."
