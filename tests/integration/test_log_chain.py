"""A run's log chain on the real database: a step that names the log it follows (`LogBasis.chain`)
is checked against the chain the run keeps, with no read of the records, and only while every
record of that log still reads as written (services/storage_owner/mongo_transaction.py,
`SEALED_BY`). Runs written before chains, and bases that name none, are checked by their records.
"""

from __future__ import annotations

from quipu.contracts.errors import ErrorCode
from quipu.contracts.store import LogBasis, RunStart
from quipu.deploy.local.stack import EmbeddedStack
from quipu.services.storage_owner.mongo import TransactionPolicy
from quipu.services.storage_owner.mongo_memory_store import MongoMemoryStore
from quipu.services.storage_owner.mongo_store import MongoStore
from quipu.services.storage_owner.mongo_transaction import RECORDS, RUNS, SEALED_BY
from tests.conformance.builders import all_run_records, open_session, ordinary, principals_root, refused
from tests.owner_support import CommandLog, owner_copy

TENANT = "t1"


async def _run_of(store: MongoStore, principal_id: str) -> RunStart:
    return await principals_root(store, await open_session(store), TENANT, principal_id)


async def test_a_step_behind_its_start_reads_no_record(logged: tuple[MongoStore, CommandLog]) -> None:
    store, log = logged
    run = await _run_of(store, "ana")
    basis = LogBasis.of(await all_run_records(store, run.run_id))
    log.commands.clear()
    [result] = await store.append_run_records([ordinary(run, "step")], follows=basis)
    assert result.inserted and log.finds_of(RECORDS) == []


async def test_a_step_following_a_log_since_forgotten_is_refused(
    stores: tuple[MongoStore, MongoMemoryStore],
) -> None:
    # The chain still matches the words the planner saw, but they are erased now: the step must
    # be told its log moved (the planner then finds the run erased), not land under a new key.
    store, memory = stores
    run = await _run_of(store, "ana")
    basis = LogBasis.of(await all_run_records(store, run.run_id))
    await memory.forget_principal(TENANT, "ana")
    await refused(ErrorCode.RUN_LOG_MOVED, store.append_run_records([ordinary(run, "step")], follows=basis))
    # A later write lies under a fresh key beside the erased ones: the run keeps no chain from then on.
    await store.append_run_record(ordinary(run, "later"))
    document = await store.database[RUNS].find_one({"_id": run.run_id})
    assert document is not None and document["log_chain"] is None
    await refused(ErrorCode.RUN_LOG_MOVED, store.append_run_records([ordinary(run, "step")], follows=basis))


async def test_a_run_written_before_chains_is_checked_by_its_records(
    stack: EmbeddedStack, database: str, elsewhere: MongoStore
) -> None:
    run = await _run_of(elsewhere, "bo")
    records = await all_run_records(elsewhere, run.run_id)
    async with owner_copy(stack.mongo_uri, database, TransactionPolicy(document_hints=0)) as store:
        await store.database[RUNS].update_one(
            {"_id": run.run_id}, {"$unset": {"log_chain": "", SEALED_BY: ""}}
        )
        other = LogBasis.of([ordinary(run, records[0].event_key, payload=b'{"said":"other"}')])
        await refused(
            ErrorCode.RUN_LOG_MOVED, store.append_run_records([ordinary(run, "step")], follows=other)
        )
        [result] = await store.append_run_records([ordinary(run, "step")], follows=LogBasis.of(records))
        assert result.inserted
        document = await store.database[RUNS].find_one({"_id": run.run_id})
        assert document is not None and document["log_chain"] is None  # it cannot start one midway
