import json
from pathlib import Path
from typing import Any

from tune.utils._errors import TuneError


def read_json_file(
    path: str | Path, what: str, *, error: type[TuneError] = TuneError, fix: str = "copy the file again"
) -> Any:
    """Reads a JSON file a user provided (a model's config.json, a tokenizer's tokenizer_config.json, ...).

    Args:
        path (str | Path): the file.
        what (str): what the file is, for the message (``"The Hugging Face config"``).
        error (type[TuneError]): the error to raise (a layer's own TuneError subclass).
        fix (str): what the user should do about a file that does not parse, for the message.

    Returns:
        Any: the parsed JSON.

    Raises:
        TuneError: ``error``, naming the file, and the line and column where it stops parsing.
    """
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise error(
            f"{what} {str(path)!r} is not valid JSON (line {err.lineno}, column {err.colno}: {err.msg}); {fix}."
        ) from err
    except (OSError, UnicodeDecodeError) as err:
        raise error(f"Could not read {what} {str(path)!r}: {err}.") from err
