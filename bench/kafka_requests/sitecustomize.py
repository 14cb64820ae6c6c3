"""Counts a process's Kafka requests by kind, for the benches' request figures.

`bench.fleet` puts this folder first on a child's PYTHONPATH, so Python imports this module at
start-up, before the service. Every request aiokafka sends (`AIOKafkaConnection.send`) is
counted by its kind (`Fetch`, `Heartbeat`, ...); on SIGUSR1 the counts so far are written to
`$BENCH_KAFKA_REQUESTS_DIR/<pid>.json`. Nothing else runs: counting is a dictionary increment,
and no thread or timer is added to the process whose CPU is measured. The run bench, whose
services share its process, counts its own requests with `count_requests()`.
"""

from __future__ import annotations

import collections
import json
import os
import signal
from pathlib import Path
from typing import Any

from aiokafka.conn import AIOKafkaConnection

DIRECTORY_ENV = "BENCH_KAFKA_REQUESTS_DIR"


def count_requests() -> collections.Counter[str]:
    """From now on, every Kafka request this process sends is counted by kind in the counter
    returned (its request class's name without `Request...`: `Fetch`, `Heartbeat`, `Produce`)."""
    counts: collections.Counter[str] = collections.Counter()
    send = AIOKafkaConnection.send

    def counted(self: AIOKafkaConnection, request: Any, *args: Any, **kwargs: Any) -> Any:
        counts[type(request).__name__.split("Request")[0]] += 1
        return send(self, request, *args, **kwargs)

    AIOKafkaConnection.send = counted
    return counts


def _install(directory: Path) -> None:
    counts = count_requests()

    def dump(*_: object) -> None:
        path = directory / f"{os.getpid()}.json"
        path.with_suffix(".tmp").write_text(json.dumps(counts))
        path.with_suffix(".tmp").replace(path)

    signal.signal(signal.SIGUSR1, dump)


if os.environ.get(DIRECTORY_ENV):
    _install(Path(os.environ[DIRECTORY_ENV]))
