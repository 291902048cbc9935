"""Multimodal datasets (tune.datasets.multimodal): tiny data in tmp_path (JSON rows with PNG files, a
``datasets.Image`` column in Parquet and in a ``save_to_disk`` folder), through a small real model transform.

The model transform below is the byte tokenizer of ``_helpers.py`` with one image token (id 264) per image part,
never trained, and each image's pixels as an encoder input. Expected tokens are written out from that definition;
expected pixels are the colours the test painted.
"""

import datasets
import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from tests.tune.datasets._helpers import END_OF_TURN, HEADERS, ByteTokenizer, byte_ids
from tune.data import CROSS_ENTROPY_IGNORE_IDX
from tune.datasets import (
    MultimodalDataset,
    llava_instruct_dataset,
    multimodal_chat_dataset,
    the_cauldron_dataset,
    vqa_dataset,
)

IMAGE_TOKEN = 264
RED, GREEN, BLUE = (255, 0, 0), (0, 255, 0), (0, 0, 255)
IGNORE = CROSS_ENTROPY_IGNORE_IDX


class TinyVisionTransform(ByteTokenizer):
    """A model transform: ``BOS (header parts END)* EOS`` where an image part is IMAGE_TOKEN (masked) and a text part
    its bytes; ``encoder_input["images"]`` holds each image as a [3, h, w] uint8 tensor, in order."""

    def __call__(self, sample):
        messages = sample["messages"]
        tokens, mask, images = [self.bos_id], [messages[0].masked], []
        for message in messages:
            tokens.append(HEADERS[message.role])
            mask.append(message.masked)
            for part in message.content:
                if part["type"] == "image":
                    images.append(part["content"])
                    tokens.append(IMAGE_TOKEN)
                    mask.append(True)
                else:
                    ids = byte_ids(part["content"])
                    tokens += ids
                    mask += [message.masked] * len(ids)
            tokens.append(END_OF_TURN)
            mask.append(message.masked)
        tokens.append(self.eos_id)
        mask.append(messages[-1].masked)
        pixels = [torch.from_numpy(np.array(image.convert("RGB"))).permute(2, 0, 1) for image in images]
        positions = [i for i, t in enumerate(tokens) if t == IMAGE_TOKEN]
        out = {"tokens": tokens, "mask": mask, "encoder_input": {"images": pixels}, "encoder_mask": positions}
        return {**sample, **out}


def _png(path, colour, size=(3, 2)):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, colour).save(path)
    return path


def _colours(sample) -> list[tuple[int, int, int]]:
    return [tuple(int(v) for v in image[:, 0, 0]) for image in sample["encoder_input"]["images"]]


def _turn(role, *pieces, trained=False):
    """Tokens and labels of one turn; a piece is text or IMAGE_TOKEN."""
    tokens = [HEADERS[role]]
    for piece in pieces:
        tokens += [IMAGE_TOKEN] if piece == IMAGE_TOKEN else byte_ids(piece)
    tokens.append(END_OF_TURN)
    labels = [t if trained and t != IMAGE_TOKEN else IGNORE for t in tokens]
    return tokens, labels


def _conversation(*turns):
    tokens, labels = [1], [IGNORE]
    for turn_tokens, turn_labels in turns:
        tokens += turn_tokens
        labels += turn_labels
    last_trained = turns[-1][1][-1] != IGNORE
    return tokens + [2], labels + [2 if last_trained else IGNORE]


def _sharegpt(question, answer):
    return [{"from": "human", "value": question}, {"from": "gpt", "value": answer}]


def test_multimodal_chat_sharegpt_tokens_labels_and_image_order(tmp_path, write_json, cache_dir):
    _png(tmp_path / "imgs" / "r.png", RED)
    _png(tmp_path / "imgs" / "b.png", BLUE)
    _png(tmp_path / "imgs" / "g.png", GREEN)
    rows = [
        {"dialogue": _sharegpt("<image>What colour?", "Red."), "pic": ["r.png"]},
        {"dialogue": _sharegpt("Left <image>, right <image>.", "Blue, green."), "pic": ["b.png", "g.png"]},
    ]
    ds = multimodal_chat_dataset(
        TinyVisionTransform(), source="json", data_files=write_json(rows), cache_dir=cache_dir,
        column_map={"conversations": "dialogue", "image": "pic"}, image_dir=str(tmp_path / "imgs"),
        image_tag="<image>",
    )  # fmt: skip
    assert isinstance(ds, MultimodalDataset) and len(ds) == 2
    first = ds[0]
    tokens, labels = _conversation(_turn("user", IMAGE_TOKEN, "What colour?"), _turn("assistant", "Red.", trained=True))
    assert first["tokens"] == tokens and first["labels"] == labels
    assert _colours(first) == [RED]
    assert first["encoder_mask"] == [2]  # BOS, user header, then the image
    assert set(first) == {"tokens", "labels", "encoder_input", "encoder_mask"}  # no messages, no mask
    second = ds[1]
    tokens, labels = _conversation(
        _turn("user", "Left ", IMAGE_TOKEN, ", right ", IMAGE_TOKEN, "."),
        _turn("assistant", "Blue, green.", trained=True),
    )
    assert second["tokens"] == tokens and second["labels"] == labels
    assert _colours(second) == [BLUE, GREEN]


def test_multimodal_chat_openai_layout_with_image_url_parts(tmp_path, write_json, cache_dir):
    _png(tmp_path / "a.png", GREEN)
    content = [{"type": "image_url", "image_url": {"url": "a.png"}}, {"type": "text", "text": "Colour?"}]
    rows = [{"messages": [{"role": "user", "content": content}, {"role": "assistant", "content": "Green."}]}]
    ds = multimodal_chat_dataset(
        TinyVisionTransform(), source="json", data_files=write_json(rows), cache_dir=cache_dir,
        image_dir=tmp_path, conversation_style="openai",
    )  # fmt: skip
    tokens, labels = _conversation(_turn("user", IMAGE_TOKEN, "Colour?"), _turn("assistant", "Green.", trained=True))
    assert ds[0]["tokens"] == tokens and ds[0]["labels"] == labels
    assert _colours(ds[0]) == [GREEN]
    with pytest.raises(ValueError, match="conversation_style must be 'sharegpt' or 'openai', got 'vicuna'"):
        multimodal_chat_dataset(TinyVisionTransform(), source="json", data_files=write_json(rows),
                                conversation_style="vicuna")  # fmt: skip


def test_llava_instruct_local_copy(tmp_path, write_json, cache_dir):
    # LLaVA-Instruct-150K's layout: id, image (a COCO file name), ShareGPT conversations with an <image> tag
    _png(tmp_path / "coco" / "000000000009.png", RED)
    rows = [{"id": "9", "image": "000000000009.png",
             "conversations": _sharegpt("What is this?\n<image>", "A red square.")}]  # fmt: skip
    ds = llava_instruct_dataset(
        TinyVisionTransform(), source="json", data_files=write_json(rows, "llava.json"),
        image_dir=str(tmp_path / "coco"), cache_dir=cache_dir, new_system_prompt="Be brief.",
    )  # fmt: skip
    tokens, labels = _conversation(
        _turn("system", "Be brief."), _turn("user", "What is this?\n", IMAGE_TOKEN),
        _turn("assistant", "A red square.", trained=True),
    )  # fmt: skip
    assert ds[0]["tokens"] == tokens and ds[0]["labels"] == labels
    assert _colours(ds[0]) == [RED]


def _image_table(tmp_path):
    """A vqa table whose image column is a datasets.Image holding PNG bytes (row 1's bytes are corrupt)."""
    good = _png(tmp_path / "src" / "g.png", GREEN).read_bytes()
    features = datasets.Features(
        {"question": datasets.Value("string"), "answer": datasets.Value("string"), "picture": datasets.Image()}
    )
    return datasets.Dataset.from_dict(
        {"question": ["Colour?", "Colour?"], "answer": ["Green.", "?"],
         "picture": [{"bytes": good, "path": "g.png"}, {"bytes": b"not a png", "path": "bad.png"}]},
        features=features,
    )  # fmt: skip


def test_vqa_with_datasets_image_column_in_parquet(tmp_path, cache_dir):
    path = tmp_path / "vqa.parquet"
    _image_table(tmp_path).to_parquet(str(path))
    (tmp_path / "src" / "g.png").unlink()  # the bytes are in the Parquet file: the image file is not needed
    ds = vqa_dataset(
        TinyVisionTransform(), source="parquet", data_files=str(path), cache_dir=cache_dir,
        column_map={"input": "question", "output": "answer", "image": "picture"},
    )  # fmt: skip
    tokens, labels = _conversation(_turn("user", IMAGE_TOKEN, "Colour?"), _turn("assistant", "Green.", trained=True))
    assert ds[0]["tokens"] == tokens and ds[0]["labels"] == labels
    assert _colours(ds[0]) == [GREEN]
    # the corrupt bytes fail in tune's loader, naming the dataset, the row and the image's stored path
    expected = r"Dataset 'parquet:.*vqa.parquet', row 1: column 'picture': Image 'bad.png' is not a readable image"
    with pytest.raises(ValueError, match=expected):
        ds[1]


def test_the_cauldron_from_save_to_disk(tmp_path):
    features = datasets.Features(
        {"images": [datasets.Image()], "texts": [{"user": datasets.Value("string"),
                                                  "assistant": datasets.Value("string")}]}
    )  # fmt: skip
    images = [Image.new("RGB", (2, 2), RED), Image.new("RGB", (2, 2), BLUE)]
    texts = [{"user": "First?", "assistant": "Red."}, {"user": "Second?", "assistant": "Blue."}]
    datasets.Dataset.from_dict({"images": [images], "texts": [texts]}, features=features).save_to_disk(
        str(tmp_path / "cauldron")
    )
    ds = the_cauldron_dataset(TinyVisionTransform(), source=str(tmp_path / "cauldron"), subset=None)
    tokens, labels = _conversation(
        _turn("user", IMAGE_TOKEN, IMAGE_TOKEN, "First?"), _turn("assistant", "Red.", trained=True),
        _turn("user", "Second?"), _turn("assistant", "Blue.", trained=True),
    )  # fmt: skip
    assert ds[0]["tokens"] == tokens and ds[0]["labels"] == labels
    assert _colours(ds[0]) == [RED, BLUE]


def test_the_cauldron_passes_subset_as_name(tmp_path, write_json, cache_dir):
    path = _png(tmp_path / "x.png", GREEN)
    rows = [{"images": [str(path)], "texts": [{"user": "Q", "assistant": "A"}]}]
    # a local JSON source accepts any configuration name; the hub source needs a real subset such as "ocrvqa"
    ds = the_cauldron_dataset(TinyVisionTransform(), subset="ocrvqa", source="json", data_files=write_json(rows),
                              cache_dir=cache_dir)  # fmt: skip
    assert _colours(ds[0]) == [GREEN]


def test_labels_follow_the_model_transform_mask(tmp_path, write_json, cache_dir):
    _png(tmp_path / "a.png", RED)
    rows = [{"conversations": _sharegpt("Q", "A"), "image": str(tmp_path / "a.png")}]
    ds = multimodal_chat_dataset(TinyVisionTransform(), source="json", data_files=write_json(rows),
                                 cache_dir=cache_dir)  # fmt: skip
    sample, expected = ds[0], TinyVisionTransform()(ds._message_transform(ds.raw_row(0)))
    assert sample["tokens"] == expected["tokens"]
    assert sample["labels"] == [IGNORE if m else t for t, m in zip(expected["tokens"], expected["mask"])]
    assert sample["tokens"][2] == IMAGE_TOKEN and sample["labels"][2] == IGNORE  # image_tag=None: image first


def _bad_rows(tmp_path):
    _png(tmp_path / "imgs" / "ok.png", RED)
    (tmp_path / "imgs" / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n and then nothing")
    return [
        {"conversations": _sharegpt("<image>Q", "A"), "image": "ok.png"},
        {"conversations": _sharegpt("<image>Q", "A"), "image": "missing.png"},
        {"conversations": _sharegpt("<image>Q", "A"), "image": "corrupt.png"},
        {"conversations": _sharegpt("no tag here", "A"), "image": "ok.png"},
    ]


def test_row_errors_name_source_row_and_image(tmp_path, write_json, cache_dir):
    data_files = write_json(_bad_rows(tmp_path))
    ds = multimodal_chat_dataset(TinyVisionTransform(), source="json", data_files=data_files, cache_dir=cache_dir,
                                 image_dir=str(tmp_path / "imgs"), image_tag="<image>")  # fmt: skip
    assert _colours(ds[0]) == [RED]
    missing = tmp_path / "imgs" / "missing.png"
    with pytest.raises(ValueError, match=rf"Dataset 'json:{data_files}', row 1: column 'image': Image file {missing} "
                                         "does not exist"):  # fmt: skip
        ds[1]
    with pytest.raises(ValueError, match=rf"row 2: column 'image': Image {tmp_path / 'imgs' / 'corrupt.png'} is not "
                                         "a readable image"):  # fmt: skip
        ds[2]
    with pytest.raises(ValueError, match="row 3: the user turns hold the image tag '<image>' 0 time"):
        ds[3]
    with pytest.raises(IndexError):  # past the end is the end of the dataset, not a bad row
        ds[4]


def test_filter_fn_and_row_numbers(tmp_path, write_json, cache_dir):
    rows = _bad_rows(tmp_path)
    ds = multimodal_chat_dataset(
        TinyVisionTransform(), source="json", data_files=write_json(rows), cache_dir=cache_dir,
        image_dir=str(tmp_path / "imgs"), image_tag="<image>", filter_fn=lambda row: row["image"] != "ok.png",
    )  # fmt: skip
    assert len(ds) == 2
    with pytest.raises(ValueError, match=r"\(after filter_fn; row numbers count kept rows\)', row 0: .*missing.png"):
        ds[0]


def test_build_time_errors(tmp_path, write_json, cache_dir):
    rows = [{"conversations": _sharegpt("Q", "A"), "photo": "a.png"}]
    data_files = write_json(rows)
    # image_dir says the data has images: a missing image column is refused when the dataset is built
    with pytest.raises(ValueError, match=r"has no column\(s\) \['image'\]. .*available: \['conversations', 'photo'\]"):
        multimodal_chat_dataset(TinyVisionTransform(), source="json", data_files=data_files, cache_dir=cache_dir,
                                image_dir=str(tmp_path))  # fmt: skip
    with pytest.raises(ValueError, match=r"has no column\(s\) \['input', 'output', 'image'\]"):
        vqa_dataset(TinyVisionTransform(), source="json", data_files=data_files, cache_dir=cache_dir)
    for builder, kwargs in (
        (multimodal_chat_dataset, {"source": "json"}),
        (llava_instruct_dataset, {}),
        (the_cauldron_dataset, {}),
        (vqa_dataset, {"source": "json"}),
    ):
        with pytest.raises(ValueError, match=f"{builder.__name__}: packed=True is not supported for datasets with im"):
            builder(TinyVisionTransform(), packed=True, **kwargs)


def _keep(batch):
    return batch


def test_error_surfaces_from_a_dataloader_worker(tmp_path, write_json, cache_dir):
    rows = _bad_rows(tmp_path)[:2]
    ds = multimodal_chat_dataset(TinyVisionTransform(), source="json", data_files=write_json(rows), cache_dir=cache_dir,
                                 image_dir=str(tmp_path / "imgs"), image_tag="<image>")  # fmt: skip
    loader = DataLoader(ds, batch_size=1, num_workers=1, collate_fn=_keep)
    batches = iter(loader)
    assert _colours(next(batches)[0]) == [RED]
    with pytest.raises(ValueError, match=r"(?s)DataLoader worker.*row 1: column 'image': Image file .*missing.png does "
                                         "not exist"):  # fmt: skip
        next(batches)
