"""Printing and saving benchmark figures."""

from __future__ import annotations

import json
import platform
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console
from rich.table import Table

RESULTS = Path(__file__).parent / "results" / "latest.json"


def print_table(figures: dict[str, float]) -> None:
    """One row per figure."""
    table = Table(title="Quipu benchmark")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for name, value in figures.items():
        table.add_row(name, f"{value:,.2f}")
    Console().print(table)


def save(figures: dict[str, float], path: Path = RESULTS) -> Path:
    """Merge `figures` into the results file, so each benchmark keeps the others' keys."""
    path.parent.mkdir(parents=True, exist_ok=True)
    previous = json.loads(path.read_text()) if path.exists() else {}
    merged = {
        **previous,
        **figures,
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()} {platform.python_implementation()} {platform.python_version()}",
    }
    path.write_text(json.dumps(merged, indent=2, sort_keys=True) + "\n")
    return path
