"""Fact retrieval on the labelled set, through the real storage owner (Kafka → owner → MongoDB).

The labelled facts (tests/data/retrieval_labelled.json) are recorded through the owner and the
index is built by a reindex (the same entries the enricher writes); then every labelled query is
searched `ROUNDS` times with `search_index`, one at a time, as the context builder would:

- `fact_retrieval_p50_ms`: median latency of one search_index call, end to end (the client's
  Kafka hop to the owner, the owner's MongoDB transaction, BM25 and rehydration, the reply);
- `retrieval_recall_at_5` / `retrieval_mrr`: quality of the method chosen (BM25 over the index),
  identical on every backend because the scoring is shared (`services/domain/memory/ranking.py`).
"""

from __future__ import annotations

import statistics
import uuid
from pathlib import Path

from quipu.deploy.local.stack import EmbeddedStack, create_topics
from quipu.services.domain.memory.reindex import Principal, reindex
from quipu.services.domain.memory.retrieval_eval import evaluate, load_labelled, record_facts
from quipu.services.kit.memory_client import KafkaMemoryStore
from quipu.services.kit.settings import MongoSettings
from quipu.services.kit.store_client import KafkaStore
from quipu.services.storage_owner.app import create_app

LABELLED = Path(__file__).parents[1] / "tests" / "data" / "retrieval_labelled.json"
ROUNDS = 5


async def measure_retrieval() -> dict[str, float]:
    """The retrieval figures of `bench/results/latest.json`."""
    labelled = load_labelled(LABELLED)
    principals = list(
        dict.fromkeys(
            Principal(tenant_id=fact.tenant_id, principal_id=fact.principal_id) for fact in labelled.facts
        )
    )
    with EmbeddedStack() as stack:
        prefix = f"bench{uuid.uuid4().hex[:6]}."
        kafka = stack.kafka_settings(topic_prefix=prefix)
        await create_topics(stack.bootstrap, prefix)
        owner = create_app(
            kafka, MongoSettings(uri=stack.mongo_uri, database=f"bench_memory_{uuid.uuid4().hex[:8]}")
        )
        await owner.start()
        try:
            async with KafkaStore(kafka) as transport:
                memory = KafkaMemoryStore(transport)
                await record_facts(memory, labelled)
                await reindex(memory, principals)
                await evaluate("warm-up", memory.search_index, labelled)
                rounds = [await evaluate("bm25 index", memory.search_index, labelled) for _ in range(ROUNDS)]
        finally:
            await owner.stop()
    latencies = [outcome.latency_ms for result in rounds for outcome in result.outcomes]
    return {
        "fact_retrieval_p50_ms": statistics.median(latencies),
        "retrieval_recall_at_5": rounds[0].recall_at_k,
        "retrieval_mrr": rounds[0].mrr,
    }
