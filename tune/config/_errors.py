from dataclasses import dataclass
from typing import Any

from tune.utils import TuneError  # re-exported: raised by every layer, caught by the CLI

_MAX_VALUE_CHARS = 80
_NO_VALUE = object()


@dataclass(frozen=True)
class ConfigProblem:
    """One problem found in a config.

    Args:
        key (str): where it is: a key path such as ``dataset.packed`` or ``dataset[1].source``, or ``""`` for the
            file as a whole.
        message (str): what is wrong and, where possible, how to fix it.
        value (Any): the offending value (left out of the message when not given).
        line (int | None): the 1-based line in the YAML file, when known.
    """

    key: str
    message: str
    value: Any = _NO_VALUE
    line: int | None = None

    def __str__(self) -> str:
        where = self.key
        if self.value is not _NO_VALUE:
            where = f"{where or '(value)'} = {_short(self.value)}"
        if self.line is not None:
            where = f"line {self.line}: {where}" if where else f"line {self.line}"
        return f"{where}: {self.message}" if where else self.message


class ConfigError(TuneError, ValueError):
    """A config (or an override of it) that cannot be used; lists every problem found.

    Args:
        problems (str | ConfigProblem | list[ConfigProblem]): what is wrong.
        source (str | None): the config file, named in the message.
    """

    def __init__(self, problems: "str | ConfigProblem | list[ConfigProblem]", source: str | None = None):
        if isinstance(problems, str):
            problems = [ConfigProblem("", problems)]
        elif isinstance(problems, ConfigProblem):
            problems = [problems]
        self.problems: list[ConfigProblem] = list(problems)
        self.source = source
        super().__init__(self._message())

    def _message(self) -> str:
        head = f"{self.source}: " if self.source else ""
        if len(self.problems) == 1:
            return head + str(self.problems[0])
        lines = [f"{head}{len(self.problems)} problems in the config:"]
        lines += [f"  - {p}" for p in self.problems]
        return "\n".join(lines)


class RecipeError(TuneError, ValueError):
    """An unknown recipe, a recipe file that cannot be used, or a recipe used in a way it does not support."""


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _MAX_VALUE_CHARS else text[: _MAX_VALUE_CHARS - 3] + "..."
