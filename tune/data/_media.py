"""Conversations with images, tokenised by a text tokenizer's chat format.

The chat formats render text only. A vision-language family's model transform instead:

1. replaces each image part of the messages by :data:`IMAGE_PLACEHOLDER` in the text (:func:`replace_images`), which
   also collects the images in the order they appear;
2. renders the now text-only messages with the tokenizer's chat format, as any conversation;
3. cuts the text segments at each placeholder and inserts the family's segments for that image there
   (:func:`insert_image_segments`): one special token (``<|image|>``), or a begin marker, N image tokens and an end
   marker. The text either side of an image is encoded on its own, as the Hugging Face processors do: their
   tokenizers split the text at special tokens before encoding it.

:func:`tokenize_with_images` does the three steps with a :class:`~tune.data.ChatTokenizer`.
"""

from collections.abc import Callable, Sequence
from typing import Any

from tune.data._chat_formats import Segment
from tune.data._messages import Message

# A character of Unicode's private use area: no tokenizer gives it a meaning, and text from a dataset does not
# hold it (replace_images refuses text that does).
IMAGE_PLACEHOLDER = "\ue000"


def replace_images(messages: Sequence[Message], *, strip_text: bool = False) -> tuple[list[Message], list[Any]]:
    """Text-only copies of ``messages`` with :data:`IMAGE_PLACEHOLDER` where each image part was.

    Args:
        messages (Sequence[Message]): the conversation; parts of type ``"image"`` hold the images.
        strip_text (bool): strip surrounding whitespace from each text part of a message with several parts, as
            chat templates that ``trim`` each part do (Gemma 3, Llama 3.2 Vision). Default False.

    Returns:
        tuple[list[Message], list[Any]]: the messages (those without images are returned as they are) and the
        images in order of appearance.

    Raises:
        ValueError: for a part of another type than text or image, or text that already holds the placeholder.
    """
    converted, images = [], []
    for index, message in enumerate(messages):
        if not message.contains_media:
            if IMAGE_PLACEHOLDER in message.text_content:
                raise ValueError(_placeholder_error(index, message))
            converted.append(message)
            continue
        pieces = []
        for part in message.content:
            if part["type"] == "image":
                images.append(part["content"])
                pieces.append(IMAGE_PLACEHOLDER)
            elif part["type"] == "text":
                text = part["content"]
                if IMAGE_PLACEHOLDER in text:
                    raise ValueError(_placeholder_error(index, message))
                pieces.append(text.strip() if strip_text else text)
            else:
                raise ValueError(
                    f"message {index} ({message.role}) holds a {part['type']!r} part; only 'text' and 'image' "
                    "parts are supported."
                )
        converted.append(Message(role=message.role, content="".join(pieces), masked=message.masked, eot=message.eot))
    return converted, images


def _placeholder_error(index: int, message: Message) -> str:
    return (
        f"message {index} ({message.role}) contains the character U+E000, which tune uses internally to mark "
        "where an image goes; remove it from the text."
    )


def insert_image_segments(
    segments: Sequence[Segment], image_segments: Callable[[int], Sequence[Segment]]
) -> list[Segment]:
    """``segments`` with each :data:`IMAGE_PLACEHOLDER` replaced by ``image_segments(i)`` for the i-th image.

    The text either side of a placeholder stays in its segment's flags. The inserted segments are never trained
    on: image tokens are inputs, and a model is not taught to predict them.

    Args:
        segments (Sequence[Segment]): a rendered conversation.
        image_segments (Callable[[int], Sequence[Segment]]): the segments of image ``i`` (0-based, in order).

    Returns:
        list[Segment]: the segments with the images in.
    """
    result: list[Segment] = []
    count = 0
    for segment in segments:
        if segment.special or IMAGE_PLACEHOLDER not in segment.text:
            result.append(segment)
            continue
        pieces = segment.text.split(IMAGE_PLACEHOLDER)
        for position, text in enumerate(pieces):
            if position:
                result.extend(image._replace(trainable=False) for image in image_segments(count))
                count += 1
            if text:
                result.append(segment._replace(text=text))
    return result


def tokenize_with_images(
    tokenizer: Any,
    messages: Sequence[Message],
    image_segments: Callable[[int], Sequence[Segment]],
    *,
    add_end_tokens: bool = True,
    strip_text: bool = False,
) -> tuple[list[int], list[bool], list[Any]]:
    """Tokens, loss mask and images of a conversation with images, NOT truncated.

    Args:
        tokenizer (Any): a :class:`~tune.data.ChatTokenizer` (``render`` and ``tokenizer.encode_segments``).
        messages (Sequence[Message]): the conversation.
        image_segments (Callable[[int], Sequence[Segment]]): the segments image ``i`` becomes (see
            :func:`insert_image_segments`).
        add_end_tokens (bool): False leaves the conversation open for generation.
        strip_text (bool): as in :func:`replace_images`.

    Returns:
        tuple[list[int], list[bool], list[Any]]: ``(tokens, mask, images)``; ``mask[i]`` is True where token i gets
        no loss (every image token is masked).

    Raises:
        ValueError: as :func:`replace_images` and the tokenizer's ``tokenize_messages``.
    """
    text_messages, images = replace_images(messages, strip_text=strip_text)
    segments = tokenizer.render(text_messages, add_end_tokens=add_end_tokens)
    tokens, trainable = tokenizer.tokenizer.encode_segments(insert_image_segments(segments, image_segments))
    return tokens, [not flag for flag in trainable], images
