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


def get_logger(name: str = "tune", level: str | int | None = None) -> logging.Logger:
    """Returns a logger that writes ``LEVEL:name: message`` lines to stderr.

    The handler is attached once to the ``tune`` root logger, so every ``tune.*`` logger shares it and the
    user's own logging configuration of other libraries is left alone.

    Args:
        name (str): logger name, normally ``__name__`` of the calling module.
        level (str | int | None): level to set on the ``tune`` root logger (``"INFO"``, ``logging.DEBUG``, ...).
            ``None`` keeps the current one (``INFO`` unless ``TUNE_LOG_LEVEL`` says otherwise).

    Returns:
        logging.Logger: the logger.
    """
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


def log_rank_zero(logger: logging.Logger, message: str, level: int = logging.INFO) -> None:
    """Logs ``message`` only on rank 0 of a distributed run (always when not distributed)."""
    from tune.utils._device import get_rank

    if get_rank() == 0:
        logger.log(level, message)
