"""get_logger and log_rank_zero with torchtune's signatures: the level first, the message as ``msg``."""

import logging

import pytest

from tune.utils import get_logger, log_rank_zero


@pytest.fixture
def restore_level():
    root = get_logger()
    level = root.level
    yield
    root.setLevel(level)


def test_get_logger_takes_the_level_first(restore_level):
    assert get_logger("debug").level == logging.DEBUG  # torchtune's get_logger("DEBUG")
    named = get_logger(name="my_project.train")
    assert named.name == "tune.my_project.train" and named.getEffectiveLevel() == logging.DEBUG
    with pytest.raises(ValueError, match=r"get_logger\(name='tune.foo'\)"):
        get_logger("tune.foo")  # a module name where the level goes


def test_log_rank_zero_logs_on_rank_zero_only(monkeypatch, restore_level):
    logger = get_logger("INFO", name="tune.test_logging")
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger.addHandler(handler)
    try:
        monkeypatch.setenv("RANK", "1")
        log_rank_zero(logger, msg="hidden")
        monkeypatch.setenv("RANK", "0")
        log_rank_zero(logger=logger, msg="shown", level=logging.WARNING)
    finally:
        logger.removeHandler(handler)
    assert [(r.getMessage(), r.levelno) for r in records] == [("shown", logging.WARNING)]
