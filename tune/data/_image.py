"""Loading one image from wherever a dataset row says it is: a file, a URL, or a Hugging Face ``datasets.Image``.

Images are read whole into memory and decoded at once, so a file that is missing, cut short or not an image fails
here, with its path in the message, rather than later inside a model transform or a DataLoader worker. No file
handle stays open after the call, however many rows a run reads.
"""

import io
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# Seconds to wait for an image server before giving up on a URL.
_URL_TIMEOUT_S = 30
_URL_SCHEMES = ("http://", "https://")
_FILE_SCHEME = "file://"


def _pil_image_module():
    try:
        from PIL import Image
    except ImportError as err:
        raise ImportError(
            "Loading images needs the package `pillow`, which is not installed. Run: pip install pillow"
        ) from err
    return Image


def is_url(location: Any) -> bool:
    """Whether ``location`` is a string naming an ``http(s)://`` or ``file://`` URL (never joined to ``image_dir``)."""
    return isinstance(location, str) and location.lower().startswith((*_URL_SCHEMES, _FILE_SCHEME))


def _file_url_path(url: str) -> str:
    # file:///abs/path and file://localhost/abs/path both name /abs/path; %20 and friends are decoded
    parsed = urllib.parse.urlparse(url)
    if parsed.netloc not in ("", "localhost"):
        raise ValueError(f"Image URL {url!r} names host {parsed.netloc!r}; a file:// URL can only name a local file.")
    return urllib.request.url2pathname(parsed.path)


def _download(url: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=_URL_TIMEOUT_S) as response:
            return response.read()
    except (urllib.error.URLError, OSError, ValueError) as err:
        reason = getattr(err, "reason", None) or err
        if isinstance(err, urllib.error.HTTPError):
            reason = f"HTTP {err.code} {reason}"
        raise ValueError(
            f"Could not download image {url}: {reason}. Without network access, download the images beforehand "
            "and point the dataset at the local files (image_dir plus relative paths)."
        ) from err


def _read_file(path: str) -> bytes:
    if not os.path.exists(path):
        where = "" if os.path.isabs(path) else f" (relative to the working directory {os.getcwd()})"
        raise ValueError(
            f"Image file {path}{where} does not exist. Check the path in the data and the dataset's image_dir, or "
            "drop the row with filter_fn."
        )
    if os.path.isdir(path):
        raise ValueError(f"Image path {path} is a directory, not an image file.")
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as err:
        raise ValueError(f"Could not read image file {path}: {err.strerror or err}.") from err


def _decode(data: bytes, name: str):
    Image = _pil_image_module()
    try:
        image = Image.open(io.BytesIO(data))
        image.load()  # decode now: a truncated file fails here, naming the file
    except (Image.UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError) as err:
        raise ValueError(
            f"Image {name} is not a readable image ({type(err).__name__}: {err}). Replace the file, or drop its row "
            "with filter_fn."
        ) from err
    return image


def load_image(image_loc: "str | Path | Mapping[str, Any] | Any"):
    """Loads an image into a ``PIL.Image.Image``, decoded in memory.

    Args:
        image_loc (str | Path | Mapping[str, Any] | PIL.Image.Image): a local path (absolute, or relative to the
            working directory), a ``file://`` URL, an ``http://`` or ``https://`` URL (downloaded with ``urllib``,
            30 s timeout), a ``{"bytes": ..., "path": ...}`` dict as an undecoded Hugging Face ``datasets.Image``
            column gives (``bytes`` may be None, then ``path`` is read), or an image already loaded (returned as
            it is).

    Returns:
        PIL.Image.Image: the image, in the mode the file stores (convert it with ``.convert("RGB")`` if needed).

    Raises:
        ValueError: when the file does not exist, cannot be read or is not an image (the message names the path
            or URL), or a URL cannot be fetched (no network, HTTP error).
        TypeError: for a value of another type (a number, a list).
        ImportError: when ``pillow`` is not installed.

    Example:
        >>> image = load_image("images/cat.png")
        >>> image = load_image({"bytes": png_bytes, "path": "cat.png"})
    """
    Image = _pil_image_module()
    if isinstance(image_loc, Image.Image):
        return image_loc
    if isinstance(image_loc, Mapping):
        data, path = image_loc.get("bytes"), image_loc.get("path")
        if data is not None:
            return _decode(bytes(data), repr(path) if path else "given as bytes")
        if path:
            return load_image(path)
        raise ValueError(f"Image {dict(image_loc)!r:.120} has neither 'bytes' nor 'path'; expected one of them.")
    if isinstance(image_loc, os.PathLike):
        image_loc = os.fspath(image_loc)
    if not isinstance(image_loc, str):
        raise TypeError(
            f"An image must be a path, a URL, a {{'bytes': ..., 'path': ...}} dict or a PIL image; got "
            f"{type(image_loc).__name__} ({image_loc!r:.60})."
        )
    if not image_loc:
        raise ValueError("An image path is empty; fill it in or drop the row with filter_fn.")
    if image_loc.lower().startswith(_URL_SCHEMES):
        return _decode(_download(image_loc), image_loc)
    path = _file_url_path(image_loc) if image_loc.lower().startswith(_FILE_SCHEME) else image_loc
    return _decode(_read_file(path), path)
