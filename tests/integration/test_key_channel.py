"""The key channel and the owner's sealed topics: words on Kafka open only with their principal's key.

A real owner (in this process) over the embedded broker and database serves its key endpoint on
loopback; a store client fetches keys over HTTP like any service.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import pytest
from pydantic import SecretStr

from quipu.contracts.errors import ErrorCode, StoreRefusedError
from quipu.contracts.memory import FactOperation, FactOperationKind, HistoryTurn, MemoryScope, Provenance
from quipu.contracts.sealed import SealedFor
from quipu.contracts.store import RunStart, SessionOwner
from quipu.contracts.topics import Topic
from quipu.contracts.transcript import TRANSCRIPT_MESSAGES_APPENDED
from quipu.deploy.local.stack import EmbeddedStack, create_topics, delete_topics
from quipu.services.kit.delivery import MessageErasedError
from quipu.services.kit.keys import HttpKeySource, KeyUnavailableError, message_seals
from quipu.services.kit.memory_client import KafkaMemoryStore
from quipu.services.kit.sealing import sealing_for
from quipu.services.kit.settings import KeySettings
from quipu.services.kit.store_client import KafkaStore
from quipu.services.storage_owner.app import create_app as create_owner
from quipu.services.storage_owner.settings import OwnerSettings
from tests.conformance.builders import ms, ordinary, root_start
from tests.integration.test_gateway_support import unique_name
from tests.owner_support import (
    every_record_on_topics,
    free_port,
    opened_with_existing_keys,
    readable_anywhere,
)
from tests.timing import scaled

pytestmark = pytest.mark.slow

TOKEN = "service-token-for-tests"
ANA = MemoryScope(tenant_id="acme", principal_id="ana")
ANA_KEY = SealedFor(tenant_id="acme", principal_id="ana")
ANA_OWNER = SessionOwner(tenant_id="acme", principal_id="ana")
BEA = MemoryScope(tenant_id="acme", principal_id="bea")
WORDS = "keeps her spare key under the blue flowerpot"
BYSTANDER = "collects stamps from the Faroe Islands"


@dataclass
class Sealed:
    prefix: str
    keys: KeySettings
    store: KafkaStore
    memory: KafkaMemoryStore


@asynccontextmanager
async def sealed_deployment(stack: EmbeddedStack) -> AsyncIterator[Sealed]:
    name = unique_name()
    prefix = f"{name}."
    kafka = stack.kafka_settings(topic_prefix=prefix)
    port = free_port()
    keys = KeySettings(url=f"http://127.0.0.1:{port}", token=SecretStr(TOKEN))
    owner = create_owner(kafka, stack.mongo_settings(database=name), OwnerSettings(keys_port=port), keys=keys)
    store = KafkaStore(kafka, reply_timeout_s=scaled(10.0), seals=message_seals(keys))
    await create_topics(stack.bootstrap, prefix)
    await owner.start()
    await store.start()
    try:
        yield Sealed(prefix, keys, store, KafkaMemoryStore(store))
    finally:
        await store.stop()
        await owner.stop()
        with contextlib.suppress(Exception):
            await delete_topics(stack.bootstrap, prefix)


def fact(fact_id: str, text: str) -> FactOperation:
    return FactOperation(
        kind=FactOperationKind.NEW,
        fact_id=fact_id,
        text=text,
        provenance=Provenance(session_id="s", turn_id="t"),
    )


async def ana_run(store: KafkaStore, session_id: str) -> RunStart:
    """A run of ana's in `session_id`, written as the planner writes it, holding WORDS."""
    start = root_start(session_id)
    run = start.run.model_copy(update={"tenant_id": ANA.tenant_id, "principal_id": ANA.principal_id})
    with sealing_for(ANA.tenant_id, ANA.principal_id):
        await store.start_root_run(run, start.started, start.stopped)
        await store.append_run_record(ordinary(run, payload=json.dumps({"text": WORDS}).encode()))
    return run


async def session_with_ana_run(store: KafkaStore, owner: SessionOwner | None = None) -> tuple[str, RunStart]:
    """A new session (owned by `owner`, else by no one) and a run of ana's in it (`ana_run`)."""
    session_id = f"s-{uuid.uuid4().hex[:8]}"
    await store.create_session(session_id, ms(), owner)
    return session_id, await ana_run(store, session_id)


async def test_the_key_endpoint_hands_a_key_to_a_service_token_only_and_none_after_forget(
    stack: EmbeddedStack,
) -> None:
    async with sealed_deployment(stack) as deployment:
        source = HttpKeySource(deployment.keys)
        stranger = HttpKeySource(KeySettings(url=deployment.keys.url, token=SecretStr("guessed")))
        try:
            assert await source.data_key(ANA_KEY, create=False) is None
            key = await source.data_key(ANA_KEY, create=True)
            assert key is not None and len(key) == 32
            assert await source.data_key(ANA_KEY, create=False) == key
            with pytest.raises(KeyUnavailableError, match="401"):
                await stranger.data_key(ANA_KEY, create=True)
            await deployment.memory.forget_principal(ANA.tenant_id, ANA.principal_id)
            assert await source.data_key(ANA_KEY, create=False) is None
        finally:
            await source.close()
            await stranger.close()


async def test_memory_words_travel_sealed_both_ways_and_are_erased_on_every_topic_by_forget(
    stack: EmbeddedStack,
) -> None:
    async with sealed_deployment(stack) as deployment:
        memory = deployment.memory
        [created] = await memory.apply_fact_operations(ANA, [fact("f-1", WORDS)], "k-1")
        await memory.apply_fact_operations(BEA, [fact("f-2", BYSTANDER)], "k-2")
        assert created.text == WORDS  # the reply opened with the key fetched over HTTP
        assert [found.text for found in await memory.list_facts(ANA)] == [WORDS]

        wire = await every_record_on_topics(stack.bootstrap, deployment.prefix)
        changes = wire[deployment.prefix + Topic.MEMORY_CHANGES.value]
        assert len(changes) == 2
        assert readable_anywhere(wire, WORDS) == []
        assert readable_anywhere(wire, BYSTANDER) == []

        await memory.forget_principal(ANA.tenant_id, ANA.principal_id)
        anyone = message_seals(deployment.keys)  # a consumer with an empty cache: any other process
        opened = []
        for record in changes:
            with contextlib.suppress(MessageErasedError):
                opened.append(await anyone.open(record.value or b""))
        await anyone.close()
        assert len(opened) == 1 and BYSTANDER.encode() in opened[0]


async def test_after_a_forget_through_a_client_what_the_person_says_next_is_sealed_under_the_new_key(
    stack: EmbeddedStack,
) -> None:
    async with sealed_deployment(stack) as deployment:
        memory = deployment.memory
        await memory.apply_fact_operations(ANA, [fact("f-1", WORDS)], "k-1")  # this client caches her key
        await memory.forget_principal(ANA.tenant_id, ANA.principal_id)
        # Sealed under the shredded key, her next words would read as erased at the owner.
        [again] = await memory.apply_fact_operations(ANA, [fact("f-3", BYSTANDER)], "k-3")
        assert again.text == BYSTANDER
        assert [found.text for found in await memory.list_facts(ANA)] == [BYSTANDER]


async def test_a_read_that_names_no_one_is_answered_sealed_for_the_person_whose_words_it_reads(
    stack: EmbeddedStack,
) -> None:
    async with sealed_deployment(stack) as deployment:
        store = deployment.store
        session_id, run = await session_with_ana_run(store, ANA_OWNER)
        await deployment.memory.append_history_turn(
            HistoryTurn(
                session_id=session_id,
                turn_id="t-1",
                scope=ANA,
                user_text=WORDS,
                assistant_text="noted",
                created_at=ms(5),
            )
        )
        # Readers that say nothing of whose words they read (a cancel, a plain client).
        page = await store.list_run_records(run.run_id, "", 10)
        assert any(WORDS.encode() in record.payload for record in page.records)
        session_page = await store.list_session_run_records(session_id, "", 10)
        assert any(WORDS.encode() in record.payload for record in session_page.records)
        history = await deployment.memory.list_history(session_id, 0, 10)
        assert [row.text for row in history][:1] == [WORDS]

        wire = await every_record_on_topics(stack.bootstrap, deployment.prefix)
        assert readable_anywhere(wire, WORDS) == []


async def test_the_records_of_a_session_created_without_an_owner_are_answered_sealed_for_their_person(
    stack: EmbeddedStack,
) -> None:
    async with sealed_deployment(stack) as deployment:
        store = deployment.store
        session_id, _ = await session_with_ana_run(store)  # a worker's session: `quipu run --session`
        page = await store.list_session_run_records(session_id, "", 10)  # a reader naming no one
        assert any(WORDS.encode() in record.payload for record in page.records)

        wire = await every_record_on_topics(stack.bootstrap, deployment.prefix)
        assert readable_anywhere(wire, WORDS) == []


async def test_a_read_asked_for_another_person_is_answered_sealed_for_the_person_whose_words_it_reads(
    stack: EmbeddedStack,
) -> None:
    async with sealed_deployment(stack) as deployment:
        store = deployment.store
        session_id, run = await session_with_ana_run(store, ANA_OWNER)
        with sealing_for(BEA.tenant_id, BEA.principal_id):  # whoever asks names the key of the reply
            await store.list_run_records(run.run_id, "", 10)
            await store.list_session_run_records(session_id, "", 10)

        await deployment.memory.forget_principal(ANA.tenant_id, ANA.principal_id)
        wire = await every_record_on_topics(stack.bootstrap, deployment.prefix)
        assert readable_anywhere(await opened_with_existing_keys(wire, deployment.keys), WORDS) == []


async def test_the_events_of_a_write_that_names_no_one_are_sealed_for_the_runs_person(
    stack: EmbeddedStack,
) -> None:
    async with sealed_deployment(stack) as deployment:
        store = deployment.store
        _, run = await session_with_ana_run(store, ANA_OWNER)
        answer = [{"role": "assistant", "content": [{"type": "text", "text": WORDS}]}]
        await store.append_run_record(  # a writer outside any person's run: the command is its own
            ordinary(run, payload=json.dumps(answer).encode(), record_type=TRANSCRIPT_MESSAGES_APPENDED)
        )
        await store.append_run_records(  # a step's records in one command
            [ordinary(run, payload=json.dumps(answer).encode(), record_type=TRANSCRIPT_MESSAGES_APPENDED)]
        )
        wire = await every_record_on_topics(stack.bootstrap, deployment.prefix)
        events = deployment.prefix + Topic.RUNS_EVENTS.value
        assert any(b'"sealed_for"' in (record.value or b"") for record in wire[events])
        assert readable_anywhere({events: wire[events]}, WORDS) == []


async def test_a_session_page_holding_two_peoples_records_is_refused_and_each_run_lists_sealed(
    stack: EmbeddedStack,
) -> None:
    async with sealed_deployment(stack) as deployment:
        store = deployment.store
        session_id, _ = await session_with_ana_run(store)
        start = root_start(session_id)  # a direct writer puts bea's run in the same session
        run = start.run.model_copy(update={"tenant_id": BEA.tenant_id, "principal_id": BEA.principal_id})
        with sealing_for(BEA.tenant_id, BEA.principal_id):
            await store.start_root_run(run, start.started, start.stopped)
        with pytest.raises(StoreRefusedError) as refused:
            await store.list_session_run_records(session_id, "", 10)
        assert refused.value.code is ErrorCode.SESSION_PRINCIPAL_MISMATCH
        first = await store.list_session_run_records(session_id, "", 2)  # ana's records only
        assert any(WORDS.encode() in record.payload for record in first.records)
        assert (await store.list_run_records(run.run_id, "", 10)).records

        wire = await every_record_on_topics(stack.bootstrap, deployment.prefix)
        assert readable_anywhere(wire, WORDS) == []
