"""The offline vision-language demo (`make demo-vision`): its generator, the agreement of its config with the model it
writes, and the whole demo (demo/run_demo_vision.sh), which must take a tiny Gemma 3 with images trained from random
weights from chance to near-perfect held-out accuracy on "what colour is the shape?".
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.recipes.utils import ROOT

DEMO = ROOT / "demo"
CONFIG = ROOT / "configs" / "demo" / "vision_full_single_device.yaml"

pytestmark = pytest.mark.integration


def _python(args: list[str], cwd: Path, timeout: int = 300) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{args} exited with {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def _score(report: str, kind: str, label: str) -> tuple[int, int]:
    """(right, total) from a line ``held-out <kind> (<label>): 0.17 (34/200) ...`` of evaluate_vision.py."""
    match = re.search(rf"^held-out {kind} \({label}\): [\d.]+ \((\d+)/(\d+)\)", report, flags=re.MULTILINE)
    assert match, f"no 'held-out {kind} ({label})' line in:\n{report[-3000:]}"
    return int(match[1]), int(match[2])


@pytest.fixture(scope="module")
def small_assets(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("vision-demo")
    _python([str(DEMO / "make_demo_vision.py"), str(out / "a"), "--num-train", "48", "--num-heldout", "12"], out)
    _python([str(DEMO / "make_demo_vision.py"), str(out / "b"), "--num-train", "48", "--num-heldout", "12"], out)
    return out


def test_generator_is_deterministic_and_held_out_pictures_are_new(small_assets):
    a, b = small_assets / "a", small_assets / "b"
    for file in ("base_model/model.safetensors", "base_model/config.json", "data/images_heldout/00011.png"):
        assert (a / file).read_bytes() == (b / file).read_bytes(), file
    for file in ("data/train.json", "data/heldout.json"):  # their rows hold absolute image paths
        assert (a / file).read_text().replace(str(a), "") == (b / file).read_text().replace(str(b), ""), file
    train = json.loads((a / "data" / "train.json").read_text())
    heldout = json.loads((a / "data" / "heldout.json").read_text())
    assert len(train) == 48 and len(heldout) == 12
    pixels = lambda rows: {Path(row["images"][0]).read_bytes() for row in rows}  # noqa: E731
    assert not pixels(train) & pixels(heldout)


def test_config_matches_the_model_and_tokenizer_the_generator_writes(small_assets):
    """The demo config spells out the model's dimensions (the recipe builds the model from them, then loads the
    Hugging Face weights): they must be those of the written config.json, and the image token the tokenizer's."""
    import sentencepiece as spm

    hf = json.loads((small_assets / "a" / "base_model" / "config.json").read_text())
    cfg = yaml.safe_load(CONFIG.read_text())
    text, vision, model = hf["text_config"], hf["vision_config"], cfg["model"]
    pieces = spm.SentencePieceProcessor(model_file=str(small_assets / "a" / "tokenizer" / "tokenizer.model"))
    assert hf["image_token_index"] == pieces.vocab_size() == text["vocab_size"] - 1
    expected = {
        "vocab_size": text["vocab_size"], "num_layers": text["num_hidden_layers"],
        "num_heads": text["num_attention_heads"], "head_dim": text["head_dim"],
        "num_kv_heads": text["num_key_value_heads"], "embed_dim": text["hidden_size"],
        "intermediate_dim": text["intermediate_size"], "max_seq_len": text["max_position_embeddings"],
        "sliding_window_size": text["sliding_window"], "query_pre_attn_scalar": text["query_pre_attn_scalar"],
        "image_size": vision["image_size"], "patch_size": vision["patch_size"],
        "vision_embed_dim": vision["hidden_size"], "vision_num_layers": vision["num_hidden_layers"],
        "vision_num_heads": vision["num_attention_heads"], "vision_intermediate_dim": vision["intermediate_size"],
        "mm_tokens_per_image": hf["mm_tokens_per_image"], "image_token_id": hf["image_token_index"],
    }  # fmt: skip
    assert {key: model[key] for key in expected} == expected
    assert model["decoder_trainable"] and model["encoder_trainable"] and model["fusion_trainable"]
    tokenizer = cfg["tokenizer"]
    assert (tokenizer["image_size"], tokenizer["tokens_per_image"], tokenizer["image_token_id"]) == (
        vision["image_size"],
        hf["mm_tokens_per_image"],
        hf["image_token_index"],
    )


def test_base_model_is_a_transformers_gemma3_checkpoint(small_assets):
    """transformers loads the written base model as Gemma3ForConditionalGeneration, every weight from the file, and
    its logits for a question about a picture equal tune's."""
    transformers = pytest.importorskip("transformers")
    import torch

    from tune.data import TheCauldronToMessages
    from tune.models import from_hf
    from tune.models.gemma3_vision import gemma3_vision_transform

    assets = small_assets / "a"
    hf_model, info = transformers.Gemma3ForConditionalGeneration.from_pretrained(
        assets / "base_model", torch_dtype=torch.float32, output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    config = json.loads((assets / "base_model" / "config.json").read_text())
    transform = gemma3_vision_transform(
        str(assets / "tokenizer" / "tokenizer.model"), image_size=config["vision_config"]["image_size"],
        tokens_per_image=config["mm_tokens_per_image"], image_token_id=config["image_token_index"],
    )  # fmt: skip
    row = json.loads((assets / "data" / "heldout.json").read_text())[0]
    sample = transform(TheCauldronToMessages()(row))
    tokens = torch.tensor([sample["tokens"]])
    images = sample["encoder_input"]["images"]
    with torch.no_grad():
        expected = hf_model.eval()(
            input_ids=tokens, pixel_values=images, token_type_ids=(tokens == config["image_token_index"]).long()
        ).logits
        actual = from_hf(assets / "base_model")(tokens, encoder_input={"images": images})
    assert expected.abs().max() > 0.1
    torch.testing.assert_close(actual, expected, atol=1e-4, rtol=1e-4)


def test_demo_learns_the_colour_of_held_out_pictures(tmp_path):
    # the whole demo as `make demo-vision` runs it, writing into tmp_path (20-30 s on 2 CPU cores)
    env = {**os.environ, "TQDM_DISABLE": "1", "DEMO_OUT": str(tmp_path / "demo_out_vision")}
    proc = subprocess.run(
        ["bash", str(DEMO / "run_demo_vision.sh"), str(Path(sys.executable).parent)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = proc.stdout
    # Before: random weights. Choosing among the six colours is chance (1 in 6; measured 0.15-0.19 with the shipped
    # data seed and three others); the greedy answer over all tokens is rarely a colour (0 to 11 of 200).
    right, total = _score(report, "accuracy", "before")
    assert total == 200 and right / total <= 0.4
    assert _score(report, "greedy answer", "before")[0] / total <= 0.4
    # After: 200/200 with the shipped seeds, and 199 or 200 of 200 for each of three other data seeds times two
    # shuffle seeds (demo/make_demo_vision.py --seed 1..3, recipe seed=0..1). 0.95 leaves 10 misses for numerics.
    assert _score(report, "accuracy", "after")[0] / total >= 0.95
    assert _score(report, "greedy answer", "after")[0] / total >= 0.95
