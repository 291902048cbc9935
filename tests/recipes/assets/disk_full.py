"""Makes a recipe's writes fail as on a full disk, from a chosen moment of the run on (tests/recipes/test_bad_input.py).

A run imports it through its config (``imports=[disk_full]``), so every process of a distributed run does too. The
environment variable ``TUNE_TEST_DISK_FULL`` says when and how, as ``EVENT PATTERN LIMIT``: once this process raises
the audit event EVENT (``open``, or ``os.rename``) for a path matching the regular expression PATTERN (the file
opened, or the target of the rename), the file-size limit (RLIMIT_FSIZE) becomes LIMIT bytes. From then on the OS
refuses any write that would extend a file past LIMIT bytes (EFBIG, "File too large"), as a full disk refuses any
write. LIMIT is a number, or ``PATH+N``: the size of the file PATH at that moment plus N bytes (so the next write to
PATH fails part-way). SIGXFSZ is ignored, so the write fails instead of killing the process.
"""

import os
import re
import resource
import signal
import sys

_EVENT, _rest = os.environ["TUNE_TEST_DISK_FULL"].split(" ", 1)
_PATTERN, _LIMIT = _rest.rsplit(" ", 1)
_armed = True


def _file_size_limit() -> int:
    path, _, extra = _LIMIT.rpartition("+")
    return (os.path.getsize(path) if path else 0) + int(extra)


def _fill_disk_on(event: str, args: tuple) -> None:
    global _armed
    if not _armed or event != _EVENT:
        return
    path = args[1] if event == "os.rename" else args[0]
    if isinstance(path, (str, bytes, os.PathLike)) and re.search(_PATTERN, os.fsdecode(path)):
        _armed = False
        hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
        resource.setrlimit(resource.RLIMIT_FSIZE, (_file_size_limit(), hard))


signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
sys.addaudithook(_fill_disk_on)
