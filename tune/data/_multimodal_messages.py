"""Images in conversations: placing loaded images into message content, and The Cauldron's row layout.

The message transforms of ``_message_transforms.py`` read an optional image column through :func:`load_row_images`
and put the images where the text's ``image_tag`` is (:func:`format_content_with_images`) or, without a tag, before
the first user turn's text (:func:`attach_images`). Images are loaded here, as the row is transformed, so a
multimodal dataset reads each image only when its sample is asked for.
"""

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tune.data._image import is_url, load_image
from tune.data._messages import Message


def format_content_with_images(content: str, *, image_tag: str, images: Sequence[Any]) -> list[dict[str, Any]]:
    """Splits ``content`` at each ``image_tag`` and puts the images there, in order, as content parts.

    Args:
        content (str): the text of a message, holding ``image_tag`` once per image.
        image_tag (str): the placeholder, e.g. ``"<image>"``.
        images (Sequence[Any]): the images (``PIL.Image.Image``), one per tag. The sequence is not modified.

    Returns:
        list[dict[str, Any]]: ``{"type": "text", "content": ...}`` and ``{"type": "image", "content": ...}`` parts;
        empty text between tags is left out.

    Raises:
        ValueError: when the number of tags in ``content`` differs from the number of images.

    Example:
        >>> format_content_with_images("<image>What is this?", image_tag="<image>", images=[cat])
        [{'type': 'image', 'content': cat}, {'type': 'text', 'content': 'What is this?'}]
    """
    pieces = content.split(image_tag)
    if len(pieces) - 1 != len(images):
        raise ValueError(
            f"the text holds the image tag {image_tag!r} {len(pieces) - 1} time(s) but {len(images)} image(s) "
            f"were given; there must be one tag per image. Text: {content!r:.120}"
        )
    parts: list[dict[str, Any]] = []
    for position, piece in enumerate(pieces):
        if position:
            parts.append({"type": "image", "content": images[position - 1]})
        if piece:
            parts.append({"type": "text", "content": piece})
    return parts


def resolve_image(location: Any, image_dir: "str | Path | None") -> Any:
    """``location`` with ``image_dir`` in front when it is a relative path (URLs, absolute paths, bytes and loaded
    images are left as they are)."""
    if image_dir is None or not isinstance(location, (str, Path)) or is_url(location):
        return location
    return Path(image_dir) / location


def load_row_images(value: Any, column: str, image_dir: "str | Path | None") -> list[Any]:
    """The images of a row's image column, loaded: one location or a list of them; None (no image) gives []."""
    if value is None:
        return []
    locations = list(value) if isinstance(value, (list, tuple)) else [value]
    images = []
    for number, location in enumerate(locations):
        if location is None:
            raise ValueError(f"column {column!r}: image {number} of the row is null; remove it or drop the row.")
        try:
            images.append(load_image(resolve_image(location, image_dir)))
        except (ValueError, TypeError) as err:
            raise type(err)(f"column {column!r}: {err}") from err
    return images


def attach_images(messages: list[Message], images: Sequence[Any], image_tag: str | None) -> None:
    """Puts ``images`` into the user turns of ``messages`` (in place).

    With ``image_tag`` the images replace the tags of the user turns' text, in order across the conversation;
    without one they all go before the text of the first user turn.

    Raises:
        ValueError: when the user turns hold a different number of tags than there are images, or there is no
            user turn.
    """
    if not images:
        return
    users = [message for message in messages if message.role == "user"]
    if not users:
        raise ValueError(f"the row has {len(images)} image(s) but no user turn to put them in.")
    if image_tag is None:
        users[0].content = [{"type": "image", "content": image} for image in images] + users[0].content
        return
    counts = [message.text_content.count(image_tag) for message in users]
    if sum(counts) != len(images):
        raise ValueError(
            f"the user turns hold the image tag {image_tag!r} {sum(counts)} time(s) but the row has {len(images)} "
            f"image(s); write one tag per image where it belongs (or set image_tag=None to put the images before "
            "the first user turn's text)."
        )
    first = 0
    for message, count in zip(users, counts):
        if count:
            message.content = _split_parts(message.content, image_tag, images[first : first + count])
            first += count


def _split_parts(parts: list[dict[str, Any]], image_tag: str, images: Sequence[Any]) -> list[dict[str, Any]]:
    result, used = [], 0
    for part in parts:
        if part["type"] != "text" or image_tag not in part["content"]:
            result.append(part)
            continue
        count = part["content"].count(image_tag)
        result += format_content_with_images(part["content"], image_tag=image_tag, images=images[used : used + count])
        used += count
    return result


class TheCauldronToMessages:
    """Rows of The Cauldron (``HuggingFaceM4/the_cauldron``): column ``images``, a list of images, and column
    ``texts``, a list of ``{"user": ..., "assistant": ...}`` exchanges.

    Each exchange becomes a user turn (masked) and an assistant turn; all the images go before the text of the
    first user turn.

    Args:
        column_map (Mapping[str, str] | None): ``{"images": ..., "texts": ...}`` to read other columns.
        new_system_prompt (str | None): prepend this system message to every conversation (always masked).
        image_dir (str | Path | None): directory that relative image paths are read from; images stored in the
            dataset (a ``datasets.Image`` column) need none.

    Raises:
        ValueError: for a column_map key other than ``images``/``texts``.
    """

    def __init__(
        self,
        column_map: Mapping[str, str] | None = None,
        new_system_prompt: str | None = None,
        image_dir: "str | Path | None" = None,
    ) -> None:
        column_map = dict(column_map or {})
        unknown = sorted(set(column_map) - {"images", "texts"})
        if unknown:
            raise ValueError(
                f"TheCauldronToMessages: column_map has unknown key(s) {unknown}; the keys it accepts are "
                "['images', 'texts'] (each maps to the name of a column in your data)."
            )
        self.column_map = {"images": column_map.get("images", "images"), "texts": column_map.get("texts", "texts")}
        self.new_system_prompt = new_system_prompt
        self.image_dir = image_dir

    @property
    def required_columns(self) -> list[str]:
        return [self.column_map["texts"], self.column_map["images"]]

    def _exchanges(self, row: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        column = self.column_map["texts"]
        texts = row[column]
        if isinstance(texts, Mapping):  # a datasets Sequence of dicts reads as a dict of lists
            texts = [dict(zip(texts, values)) for values in zip(*texts.values())]
        if not isinstance(texts, list) or not texts:
            raise ValueError(f"column {column!r} must hold a non-empty list of exchanges, got {texts!r:.80}.")
        for number, exchange in enumerate(texts):
            if not isinstance(exchange, Mapping) or not all(
                isinstance(exchange.get(key), str) and exchange[key].strip() for key in ("user", "assistant")
            ):
                raise ValueError(
                    f"column {column!r}, exchange {number}: expected a dict with non-empty 'user' and 'assistant' "
                    f"strings, got {exchange!r:.80}."
                )
        return texts

    def __call__(self, row: Mapping[str, Any]) -> dict[str, list[Message]]:
        exchanges = self._exchanges(row)
        images = load_row_images(row[self.column_map["images"]], self.column_map["images"], self.image_dir)
        messages = []
        if self.new_system_prompt:
            messages.append(Message(role="system", content=self.new_system_prompt, masked=True))
        for exchange in exchanges:
            messages.append(Message(role="user", content=exchange["user"], masked=True))
            messages.append(Message(role="assistant", content=exchange["assistant"], masked=False))
        attach_images(messages, images, image_tag=None)
        return {"messages": messages}
