"""Printing and saving benchmark figures."""

from __future__ import annotations

import json
import platform
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console
from rich.table import Table

RESULTS = Path(__file__).parent / "results" / "latest.json"

Figures = dict[str, float | None]
"""Figures by key; None is a figure that could not be measured in this run (the bench prints why)."""


def print_table(figures: Mapping[str, float | None]) -> None:
    """One row per figure."""
    table = Table(title="Quipu benchmark")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for name, value in figures.items():
        table.add_row(name, "not measured" if value is None else f"{value:,.2f}")
    Console().print(table)


def save(figures: Mapping[str, float | None], path: Path = RESULTS) -> Path:
    """Merge `figures` into the results file, so each benchmark keeps the others' keys; a figure
    not measured this time is removed (an old value would pass for a new one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    previous = json.loads(path.read_text()) if path.exists() else {}
    merged = {
        **{name: value for name, value in previous.items() if figures.get(name, 0) is not None},
        **{name: value for name, value in figures.items() if value is not None},
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()} {platform.python_implementation()} {platform.python_version()}",
    }
    path.write_text(json.dumps(merged, indent=2, sort_keys=True) + "\n")
    return path
