"""Where `quipu` writes: the console, the error console, and one-line failures."""

from __future__ import annotations

from typing import NoReturn

import typer
from rich.console import Console
from rich.text import Text

from quipu.contracts.errors import QuipuError

console = Console(highlight=False)
errors = Console(stderr=True, highlight=False)

EXIT_FAILED = 1
EXIT_WAITING = 3


class CliError(QuipuError):
    """Raised by a command for a failure to report in one line (and exit 1), without a traceback."""


def fail(message: str, code: int = EXIT_FAILED) -> NoReturn:
    """Print an error and exit."""
    errors.print(Text(f"error: {message}", style="bold red"), soft_wrap=True)
    raise typer.Exit(code)


def warn(message: str) -> None:
    """Print a warning on the error console."""
    errors.print(Text(f"warning: {message}", style="yellow"), soft_wrap=True)


def note(message: str) -> None:
    """Print a dim line on the error console (what a client talks to, hints)."""
    errors.print(Text(message, style="dim"), soft_wrap=True)
