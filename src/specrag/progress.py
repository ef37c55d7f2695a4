"""The one progress-bar style (rich, on stderr) used by the CLI and the benchmarks."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn


def progress_bar(console: Console, *, transient: bool = False) -> Progress:
    """A bar with description, completed/total and elapsed time."""
    return Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=transient,
    )
