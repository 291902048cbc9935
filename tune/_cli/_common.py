import argparse
import sys
from collections.abc import Sequence


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the hand-written line breaks of descriptions and epilogs (the examples)."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=32)


def examples(*lines: str) -> str:
    """An ``examples:`` epilog, one command per line."""
    return "examples:\n" + "\n".join(f"  {line}" if line else "" for line in lines)


def print_table(header: Sequence[str], rows: Sequence[Sequence[str]], file=None) -> None:
    """Prints left-aligned columns; the last column is never padded."""
    file = file or sys.stdout
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header) - 1)]
    for row in [header, *rows]:
        cells = [str(c).ljust(w) for c, w in zip(row, widths, strict=False)] + [str(row[-1])]
        print("  ".join(cells).rstrip(), file=file)
