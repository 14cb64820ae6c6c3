"""`make bench`: figures and ratios on the embedded stack, printed and saved as JSON."""

from __future__ import annotations

import asyncio

from bench.memory_bench import measure_memory
from bench.report import print_table, save
from bench.retrieval_bench import measure_retrieval
from bench.run_bench import measure_runs
from bench.sealing_bench import measure_sealing
from bench.store_bench import measure_store


async def main() -> None:
    """Run every benchmark and write `bench/results/latest.json`."""
    figures = await measure_store()
    figures |= await measure_runs()
    figures |= await measure_memory()
    figures |= await measure_retrieval()
    figures |= await measure_sealing()
    print_table(figures)
    path = save(figures)
    print(f"\nwritten to {path}")


if __name__ == "__main__":
    asyncio.run(main())
