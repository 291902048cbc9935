"""Loading images (tune.data.load_image) and placing them in messages (the message transforms' image support).

Every image is a tiny PNG written with PIL in tmp_path; URLs are served by a local ``http.server`` on 127.0.0.1.
Expected pixels are the colours the test wrote; expected content parts follow the order of tags in the text.
"""

import functools
import http.server
import io
import threading
from pathlib import Path

import pytest
from PIL import Image

from tune.data import (
    InputOutputToMessages,
    Message,
    OpenAIToMessages,
    ShareGPTToMessages,
    TheCauldronToMessages,
    format_content_with_images,
    load_image,
)

RED, GREEN, BLUE = (255, 0, 0), (0, 255, 0), (0, 0, 255)


def _png(path: Path, colour: tuple[int, int, int], size: tuple[int, int] = (3, 2)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, colour).save(path)
    return path


def _colour(image: Image.Image) -> tuple[int, int, int]:
    colours = image.convert("RGB").getcolors()
    assert len(colours) == 1, colours
    return colours[0][1]


@pytest.fixture
def server(tmp_path):
    """A local HTTP server over tmp_path/www; yields its base URL."""
    root = tmp_path / "www"
    root.mkdir()

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(root)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", root
    httpd.shutdown()
    httpd.server_close()


class TestLoadImage:
    def test_path_str_pathlike_and_file_url(self, tmp_path):
        path = _png(tmp_path / "dir with space" / "red.png", RED)
        for location in (str(path), path, path.as_uri()):
            image = load_image(location)
            assert isinstance(image, Image.Image)
            assert image.size == (3, 2) and _colour(image) == RED

    def test_relative_path_reads_from_working_directory(self, tmp_path, monkeypatch):
        _png(tmp_path / "images" / "g.png", GREEN)
        monkeypatch.chdir(tmp_path)
        assert _colour(load_image("images/g.png")) == GREEN

    def test_datasets_image_dict_and_loaded_image(self, tmp_path):
        path = _png(tmp_path / "b.png", BLUE)
        assert _colour(load_image({"bytes": path.read_bytes(), "path": "whatever.png"})) == BLUE
        assert _colour(load_image({"bytes": None, "path": str(path)})) == BLUE
        image = Image.new("RGB", (1, 1), RED)
        assert load_image(image) is image

    def test_missing_file_names_the_path(self, tmp_path):
        missing = tmp_path / "nope" / "cat.png"
        with pytest.raises(ValueError, match=rf"Image file {missing} does not exist"):
            load_image(missing)
        with pytest.raises(ValueError, match="relative to the working directory"):
            load_image("not/here.png")
        with pytest.raises(ValueError, match="is a directory"):
            load_image(tmp_path)

    def test_corrupt_and_truncated_files_name_the_path(self, tmp_path):
        garbage = tmp_path / "garbage.png"
        garbage.write_bytes(b"this is not an image")
        with pytest.raises(ValueError, match=rf"Image {garbage} is not a readable image"):
            load_image(garbage)
        # a PNG cut in half opens (the header is intact) but fails when its pixels are decoded: caught here too
        whole = _png(tmp_path / "whole.png", RED, size=(64, 64))
        Image.effect_noise((64, 64), 100).convert("RGB").save(whole)  # noise: the pixel data is not tiny
        cut = tmp_path / "cut.png"
        cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
        with pytest.raises(ValueError, match=rf"Image {cut} is not a readable image"):
            load_image(cut)
        with pytest.raises(ValueError, match="'broken.png' is not a readable image"):
            load_image({"bytes": b"\x89PNG broken", "path": "broken.png"})

    def test_bad_values(self):
        with pytest.raises(TypeError, match="got int"):
            load_image(7)
        with pytest.raises(ValueError, match="neither 'bytes' nor 'path'"):
            load_image({"bytes": None, "path": None})
        with pytest.raises(ValueError, match="empty"):
            load_image("")
        with pytest.raises(ValueError, match="can only name a local file"):
            load_image("file://otherhost/x.png")

    def test_http_url(self, server):
        base, root = server
        _png(root / "red.png", RED)
        assert _colour(load_image(f"{base}/red.png")) == RED
        with pytest.raises(ValueError, match=rf"Could not download image {base}/missing.png: HTTP 404 "):
            load_image(f"{base}/missing.png")

    def test_unreachable_url_says_to_download_beforehand(self):
        import socket

        with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with pytest.raises(ValueError, match=rf"Could not download image http://127.0.0.1:{port}/a.png: .*local files"):
            load_image(f"http://127.0.0.1:{port}/a.png")


def test_format_content_with_images():
    red, blue = Image.new("RGB", (1, 1), RED), Image.new("RGB", (1, 1), BLUE)
    images = [red, blue]
    parts = format_content_with_images("<image>hello <image>world", image_tag="<image>", images=images)
    assert parts == [
        {"type": "image", "content": red},
        {"type": "text", "content": "hello "},
        {"type": "image", "content": blue},
        {"type": "text", "content": "world"},
    ]
    assert images == [red, blue]  # not consumed
    with pytest.raises(ValueError, match="holds the image tag '<image>' 1 time\\(s\\) but 2 image\\(s\\)"):
        format_content_with_images("<image> one", image_tag="<image>", images=images)


def _parts(message: Message) -> list:
    """A message's parts with images as their colour."""
    return [(p["type"], _colour(p["content"]) if p["type"] == "image" else p["content"]) for p in message.content]


class TestTransformsWithImages:
    def test_sharegpt_tag_and_image_dir(self, tmp_path):
        _png(tmp_path / "imgs" / "a.png", RED)
        row = {
            "conversations": [{"from": "human", "value": "Look: <image> what?"}, {"from": "gpt", "value": "Red."}],
            "image": "a.png",
        }
        messages = ShareGPTToMessages(image_dir=tmp_path / "imgs")(row)["messages"]
        assert _parts(messages[0]) == [("text", "Look: "), ("image", RED), ("text", " what?")]
        assert messages[0].masked and not messages[1].masked
        assert _parts(messages[1]) == [("text", "Red.")]

    def test_sharegpt_images_follow_tags_across_turns_or_go_first(self, tmp_path):
        paths = [str(_png(tmp_path / f"{i}.png", c)) for i, c in enumerate((RED, GREEN, BLUE))]
        turns = [{"from": "human", "value": "<image><image>two"}, {"from": "gpt", "value": "ok"},
                 {"from": "human", "value": "then <image>"}, {"from": "gpt", "value": "ok"}]  # fmt: skip
        row = {"conversations": turns, "image": paths}
        messages = ShareGPTToMessages()(row)["messages"]
        assert _parts(messages[0]) == [("image", RED), ("image", GREEN), ("text", "two")]
        assert _parts(messages[2]) == [("text", "then "), ("image", BLUE)]
        untagged = [{"from": "human", "value": "Q"}, {"from": "gpt", "value": "A"}]
        messages = ShareGPTToMessages(image_tag=None)({"conversations": untagged, "image": paths[:2]})["messages"]
        assert _parts(messages[0]) == [("image", RED), ("image", GREEN), ("text", "Q")]
        with pytest.raises(ValueError, match="hold the image tag '<image>' 3 time\\(s\\) but the row has 2"):
            ShareGPTToMessages()({"conversations": turns, "image": paths[:2]})

    def test_sharegpt_text_only_row_is_unchanged(self):
        row = {"conversations": [{"from": "human", "value": "<image> Q"}, {"from": "gpt", "value": "A"}],
               "image": None}  # fmt: skip
        assert ShareGPTToMessages()(row)["messages"][0].content == [{"type": "text", "content": "<image> Q"}]

    def test_missing_image_names_column_and_path(self, tmp_path):
        row = {"conversations": [{"from": "human", "value": "<image>"}, {"from": "gpt", "value": "A"}],
               "img": "gone.png"}  # fmt: skip
        transform = ShareGPTToMessages(column_map={"image": "img"}, image_dir=tmp_path)
        with pytest.raises(ValueError, match=rf"column 'img': Image file {tmp_path / 'gone.png'} does not exist"):
            transform(row)

    def test_openai_image_parts(self, tmp_path, server):
        base, root = server
        _png(tmp_path / "rel.png", GREEN)
        _png(root / "web.png", BLUE)
        content = [
            {"type": "text", "text": "Compare"},
            {"type": "image_url", "image_url": {"url": "rel.png"}},
            {"type": "image", "url": f"{base}/web.png"},
        ]
        row = {"messages": [{"role": "user", "content": content}, {"role": "assistant", "content": "Same size."}]}
        messages = OpenAIToMessages(image_dir=tmp_path)(row)["messages"]
        assert _parts(messages[0]) == [("text", "Compare"), ("image", GREEN), ("image", BLUE)]
        bad = {"messages": [{"role": "user", "content": [{"type": "video", "video": "v.mp4"}]},
                            {"role": "assistant", "content": "A"}]}  # fmt: skip
        with pytest.raises(ValueError, match="column 'messages', turn 0, part 0: expected"):
            OpenAIToMessages()(bad)

    def test_input_output_puts_image_before_question(self, tmp_path):
        image_bytes = _png(tmp_path / "x.png", RED).read_bytes()
        row = {"question": "Colour?", "answer": "Red", "picture": {"bytes": image_bytes, "path": "x.png"}}
        transform = InputOutputToMessages(column_map={"input": "question", "output": "answer", "image": "picture"})
        assert transform.required_columns == ["question", "answer", "picture"]
        messages = transform(row)["messages"]
        assert _parts(messages[0]) == [("image", RED), ("text", "Colour?")]
        assert [m.masked for m in messages] == [True, False]

    def test_the_cauldron(self, tmp_path):
        images = [str(_png(tmp_path / "1.png", RED)), str(_png(tmp_path / "2.png", BLUE))]
        row = {"images": images, "texts": [{"user": "Q1", "assistant": "A1", "source": "x"},
                                           {"user": "Q2", "assistant": "A2", "source": "x"}]}  # fmt: skip
        messages = TheCauldronToMessages(new_system_prompt="Sys")(row)["messages"]
        assert [(m.role, m.masked) for m in messages] == [
            ("system", True), ("user", True), ("assistant", False), ("user", True), ("assistant", False)
        ]  # fmt: skip
        assert _parts(messages[1]) == [("image", RED), ("image", BLUE), ("text", "Q1")]
        assert _parts(messages[3]) == [("text", "Q2")]
        # a datasets Sequence of dicts reads as a dict of lists: the same exchanges
        columnar = {"images": images[:1], "texts": {"user": ["Q"], "assistant": ["A"]}}
        assert [m.text_content for m in TheCauldronToMessages()(columnar)["messages"]] == ["Q", "A"]
        with pytest.raises(ValueError, match="exchange 0: expected a dict with non-empty 'user' and 'assistant'"):
            TheCauldronToMessages()({"images": [], "texts": [{"user": "Q", "assistant": ""}]})
        with pytest.raises(ValueError, match="unknown key\\(s\\) \\['pictures'\\]"):
            TheCauldronToMessages(column_map={"pictures": "p"})


def test_png_bytes_round_trip_in_memory():
    # load_image reads everything into memory: the returned image holds no open file
    buffer = io.BytesIO()
    Image.new("RGB", (2, 2), GREEN).save(buffer, format="PNG")
    image = load_image({"bytes": buffer.getvalue(), "path": None})
    assert _colour(image) == GREEN and image.fp is None
