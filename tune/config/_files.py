"""What the config tools cache per version of a file."""

import hashlib
from pathlib import Path


def file_version(path: Path) -> tuple[str, str]:
    """A key that changes when the file does: its resolved path and a hash of its bytes (modification times can be
    too coarse to tell two edits within a second apart).

    Args:
        path (Path): an existing file.

    Returns:
        tuple[str, str]: the resolved path and the SHA-1 of the file's bytes.
    """
    return (str(path.resolve()), hashlib.sha1(path.read_bytes(), usedforsecurity=False).hexdigest())
