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


class IntermixedArgumentParser(argparse.ArgumentParser):
    """Lets overrides follow options: ``tune validate my.yaml --recipe R key=value`` (validate, estimate).

    A plain ``ArgumentParser`` takes every positional (CONFIG and the overrides) from the first run of them, so
    ``key=value`` after ``--recipe R`` would be an unrecognized argument. The subcommand's parser is called with
    ``parse_known_args`` by the top-level one; this parses intermixed instead.
    """

    _intermixing = False

    def parse_known_args(self, args=None, namespace=None):  # noqa: ANN001, ANN201 - argparse's signature
        if self._intermixing:  # the two passes of parse_known_intermixed_args call back here
            return super().parse_known_args(args, namespace)
        self._intermixing = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixing = False
