"""EdgeHub's identities and twins over a real store (in memory; the e2e tests use RocksDB), with a manual clock."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from edgehub.core import AuthenticationError, Identity, Message
from edgehub.core.sas import generate_sas_token, resource_uri
from edgehub.hub import Credentials, Rejected, Stored
from edgehub.hub.facade import EdgeHub
from edgehub.routing import Router
from edgehub.store import MemoryBackend, QueuePolicy, Store
from edgehub.store.rocks import open_rocks_store
from edgehub.testing import ManualClock

pytestmark = pytest.mark.timeout(30)

HOST = "hub.test"
DEV = Identity.parse("dev1")
KEY = base64.b64encode(b"k" * 32).decode()


def hub_over(store: Store, clock: ManualClock | None = None) -> EdgeHub:
    return EdgeHub(store=store, router=Router({"all": "FROM /* INTO $upstream"}), host_name=HOST, clock=clock)


async def test_sas_tokens_are_checked_for_key_resource_and_expiry_against_the_clock() -> None:
    clock = ManualClock(1_000.0)
    async with hub_over(Store.in_memory(), clock) as hub:
        await hub.identities.add_symmetric_key(DEV, KEY)
        token = generate_sas_token(resource_uri(HOST, DEV), KEY, 2_000).encode()
        assert (await hub.authenticate(Credentials(DEV, password=token))).auth_method == "sas"
        other = generate_sas_token(resource_uri("elsewhere", DEV), KEY, 2_000).encode()
        with pytest.raises(AuthenticationError):
            await hub.authenticate(Credentials(DEV, password=other))
        clock.advance(1_000.0)
        with pytest.raises(AuthenticationError, match="expired"):
            await hub.authenticate(Credentials(DEV, password=token))


async def test_passwords_are_stored_hashed_and_verified() -> None:
    store = Store.in_memory()
    async with hub_over(store) as hub:
        await hub.identities.set_password(DEV, b"s3cret")
        raw = store.get_metadata("identity/dev1")
        assert raw is not None
        assert b"s3cret" not in raw
        assert b"scrypt$" in raw
        assert (await hub.authenticate(Credentials(DEV, password=b"s3cret"))).auth_method == "password"
        with pytest.raises(AuthenticationError):
            await hub.authenticate(Credentials(DEV, password=b"wrong"))


async def test_certificates_authenticate_by_thumbprint_or_by_a_verified_chain_naming_the_identity() -> None:
    async with hub_over(Store.in_memory()) as hub:
        await hub.identities.set_thumbprint(DEV, "AB" * 32)
        creds = Credentials(DEV, cert_thumbprint="ab" * 32)
        assert (await hub.authenticate(creds)).auth_method == "x509"
        with pytest.raises(AuthenticationError):
            await hub.authenticate(Credentials(DEV, cert_thumbprint="cd" * 32))
        mod = Identity.parse("dev1/m")
        await hub.identities.allow_ca_signed(mod)
        ok = Credentials(mod, cert_thumbprint="ef" * 32, cert_subject_cn="dev1/m", cert_chain_verified=True)
        assert (await hub.authenticate(ok)).auth_method == "x509"
        for bad in (
            Credentials(mod, cert_thumbprint="ef" * 32, cert_subject_cn="dev1/other", cert_chain_verified=True),
            Credentials(mod, cert_thumbprint="ef" * 32, cert_subject_cn="dev1/m", cert_chain_verified=False),
        ):
            with pytest.raises(AuthenticationError):
                await hub.authenticate(bad)


async def test_unknown_identities_are_refused() -> None:
    async with hub_over(Store.in_memory()) as hub:
        with pytest.raises(AuthenticationError, match="unknown"):
            await hub.authenticate(Credentials(DEV, password=b"x"))


async def test_reported_patches_merge_and_survive_a_restart(tmp_path: Path) -> None:
    store = open_rocks_store(tmp_path / "s")
    async with hub_over(store) as hub:
        assert await hub.get_twin(DEV) == {"desired": {"$version": 1}, "reported": {"$version": 1}}
        assert await hub.update_reported(DEV, {"fw": "1.0", "net": {"rssi": -60, "ssid": "ship"}}) == 2
        assert await hub.update_reported(DEV, {"net": {"rssi": -70, "ssid": None}}) == 3
    await store.close()
    store = open_rocks_store(tmp_path / "s")
    async with hub_over(store) as hub:
        twin = await hub.get_twin(DEV)
        assert twin["reported"] == {"$version": 3, "fw": "1.0", "net": {"rssi": -70}}
    await store.close()


async def test_ingest_stamps_the_identity_and_answers_each_message_of_a_group() -> None:
    store = Store(
        MemoryBackend(),
        endpoint_policies={"$upstream": QueuePolicy(max_messages=2, enqueue_timeout_s=0)},
    )
    async with hub_over(store) as hub:
        spoofed = Message(b"x", {}, {"connectionDeviceId": "someone-else", "connectionModuleId": "fake"})
        outcomes = await hub.ingest(DEV, [spoofed, Message(b"y"), Message(b"z")])
        assert [type(o) for o in outcomes] == [Stored, Stored, Rejected]
        assert isinstance(outcomes[2], Rejected)
        assert outcomes[2].reason == "quota_exceeded"
        [q] = store.queues("$upstream")
        first = store.read(q, 0, 10)[0].message
        assert first.system_properties["connectionDeviceId"] == "dev1"
        assert "connectionModuleId" not in first.system_properties
        assert store.groups_written == 1  # the group was committed together


async def test_a_group_without_policies_is_one_write_with_each_refusal_in_its_place() -> None:
    store = Store(MemoryBackend())  # no quota, no endpoint policy: the group goes to the store in one piece
    async with hub_over(store) as hub:
        conflict = Message(b"c", {}, {"sessionId": "s1", "partitionKey": "other"})
        too_large = Message(b"L" * 262_145)
        outcomes = await hub.ingest(DEV, [Message(b"a"), conflict, too_large, Message(b"b")])
        assert [type(o) for o in outcomes] == [Stored, Rejected, Rejected, Stored]
        assert [o.reason for o in outcomes if isinstance(o, Rejected)] == ["partition_key_mismatch", "too_large"]
        assert store.groups_written == 1
        [q] = store.queues("$upstream")
        stored = store.read(q, 0, 10)
        assert [it.message.body for it in stored] == [b"a", b"b"]
        assert [it.message.edge_message_id for it in stored] == [
            o.edge_message_id for o in outcomes if isinstance(o, Stored)
        ]
        assert all(it.message.system_properties["connectionDeviceId"] == "dev1" for it in stored)


async def test_a_message_is_charged_as_sent_not_with_the_hubs_id_and_time_stamps() -> None:
    # maxMessageSizeBytes and quotas count the body and properties; the identity the hub vouches for counts
    # (connectionDeviceId=dev1), its edgeMessageId and enqueuedTime do not, also on the grouped path.
    limit = 200
    charged_extra = len("connectionDeviceId") + len("dev1")
    store = Store(MemoryBackend(), default_policy=QueuePolicy(max_message_size_bytes=limit, enqueue_timeout_s=0))
    async with hub_over(store) as hub:
        at_limit = Message(b"a" * (limit - charged_extra))
        over = Message(b"b" * (limit - charged_extra + 1))
        for group in ([at_limit], [at_limit, over]):
            outcomes = await hub.ingest(DEV, group)
            assert isinstance(outcomes[0], Stored)
            if len(group) == 2:
                assert isinstance(outcomes[1], Rejected)
                assert outcomes[1].reason == "too_large"
        assert store.usage("$upstream") == (2, 2 * limit)
