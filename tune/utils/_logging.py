import logging
import os
import sys

_FORMAT = "%(levelname)s:%(name)s: %(message)s"


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at emit time (it may be redirected after the handler is made)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # logging.StreamHandler assigns it in __init__; the property wins
        pass


_LEVEL_NAMES = frozenset(logging.getLevelNamesMapping())


def get_logger(level: str | int | None = None, name: str = "tune") -> logging.Logger:
    """Returns a logger that writes ``LEVEL:name: message`` lines to stderr.

    The handler is attached once to the ``tune`` root logger, so every ``tune.*`` logger shares it and the
    user's own logging configuration of other libraries is left alone. The first argument is the level, as in
    torchtune (``get_logger("DEBUG")``); modules name their logger with ``get_logger(name=__name__)``.

    Args:
        level (str | int | None): level to set on the ``tune`` root logger (``"INFO"``, ``logging.DEBUG``, ...).
            ``None`` keeps the current one (``INFO`` unless ``TUNE_LOG_LEVEL`` says otherwise).
        name (str): logger name, normally ``__name__`` of the calling module; names outside ``tune.`` are put
            under it. Default ``"tune"``.

    Returns:
        logging.Logger: the logger.

    Raises:
        ValueError: if ``level`` is not a logging level name (e.g. a module name passed positionally).
    """
    if isinstance(level, str) and level.upper() not in _LEVEL_NAMES:
        raise ValueError(
            f"get_logger got level={level!r}, which is not a logging level ({', '.join(sorted(_LEVEL_NAMES))}). "
            f"The first argument is the level, as in torchtune; to name the logger, call get_logger(name={level!r})."
        )
    root = logging.getLogger("tune")
    if not getattr(root, "_tune_configured", False):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter(_FORMAT))
        root.addHandler(handler)
        root.setLevel(os.environ.get("TUNE_LOG_LEVEL", "INFO").upper())
        root.propagate = False
        root._tune_configured = True  # type: ignore[attr-defined]
    if level is not None:
        root.setLevel(level.upper() if isinstance(level, str) else level)
    return logging.getLogger(name if name == "tune" or name.startswith("tune.") else f"tune.{name}")


def log_rank_zero(logger: logging.Logger, msg: str, level: int = logging.INFO) -> None:
    """Logs ``msg`` only on rank 0 of a distributed run (always when not distributed).

    Args:
        logger (logging.Logger): the logger to write to.
        msg (str): the message.
        level (int): the logging level. Default ``logging.INFO``.
    """
    from tune.utils._device import get_rank

    if get_rank() == 0:
        logger.log(level, msg)
