"""`make bench`: figures and ratios on the embedded stack, printed and saved as JSON.

Every key of `bench/results/latest.json` comes from this run: the store path, the agent loop in
this process (bench.run_bench), memory, retrieval, sealing and live event streams
(bench.stream_bench), then the services in processes of their own (bench.fleet_bench: idle CPU,
200 sessions, scaling, toolset isolation). A figure that could not be measured is printed as
such, with the reason, and removed from the file. One part alone: `python -m bench.run_bench`,
`python -m bench.stream_bench`, `python -m bench.fleet_bench [idle load scaling planner executor
isolation]` (`make bench-fleet`).

Everything stays in `make bench`, so that one run writes every key: about 13 minutes on a shared
2-core box (load 3-14), of which the fleet part is about 4 (its 200 sessions stop at a 120 s
deadline, so a collapsing system cannot stretch it). The rest is the agent loop's sequential runs
and 50 sessions, which grow with the box's load.
"""

from __future__ import annotations

import asyncio

from bench.fleet_bench import measure_fleet
from bench.memory_bench import measure_memory
from bench.report import Figures, print_table, save
from bench.retrieval_bench import measure_retrieval
from bench.run_bench import measure_runs
from bench.sealing_bench import measure_sealing
from bench.store_bench import measure_store
from bench.stream_bench import measure_streams


async def main() -> None:
    """Run every benchmark and write `bench/results/latest.json`."""
    figures: Figures = {}
    figures |= await measure_store()
    figures |= await measure_runs()
    figures |= await measure_memory()
    figures |= await measure_retrieval()
    figures |= await measure_sealing()
    figures |= await measure_streams()
    figures |= await measure_fleet()
    print_table(figures)
    path = save(figures)
    print(f"\nwritten to {path}")


if __name__ == "__main__":
    asyncio.run(main())
