"""Integration tests of recipes/generate.py with images: the shipped generation configs of the three vision-language
families, and torchtune 0.6.1's own ``llama3_2_vision/11B_generation_v2.yaml``, at tiny scale on the CPU.

The reference is transformers' greedy ``generate`` (``do_sample=False``) of the same tiny checkpoint on the same
prompt: the tokens and pixels of the family's model transform (whose equality with the Hugging Face processors is
tested in tests/tune/models/test_<family>_transform.py), with the family's stop tokens. The recipe must print the
decode of what it generated before the first stop token. For Llama 3.2 Vision the reference is transformers' model
made to compute as Meta's (and tune's) where transformers 5.23 differs: the encoder's intermediate layers are listed
one lower, and the tokens before the image (the system prompt, the user header) skip the cross-attention branch
(tests/tune/models/test_llama3_2_vision.py).

The tiny checkpoints and tokenizers are those of the vision recipe tests (tests/recipes/_vision_*_assets.py).
"""

import random
import subprocess
import sys
import zipfile

import pytest
import torch

from tests.recipes import _vision_gemma3_assets, _vision_llama_assets, _vision_qwen2_5_vl_assets
from tests.recipes.test_torchtune_published_configs import torchtune_wheel  # noqa: F401  (the session fixture)
from tests.recipes.utils import ROOT, run_recipe
from tune.data import Message, load_image, padded_collate_tiled_images_and_mask

pytestmark = pytest.mark.integration

transformers = pytest.importorskip("transformers")

MAX_NEW_TOKENS = 12
QUESTION = "What colour is the shape?"
SYSTEM = "You are a helpful assistant who responds like the author Shakespeare."  # the shipped configs' system


def _picture(path, size):
    """A picture of the colour task (demo/vision_data.py), saved as PNG."""
    from demo.vision_data import draw

    draw("blue", "disc", size, random.Random(0)).save(path)
    return path


def _common_overrides(out, image, as_messages=False):
    """CPU, fp32, greedy; the prompt as torchtune's ``prompt.user: {image, text}`` or as tune's ``messages``."""
    if as_messages:
        prompt = [
            "~prompt",
            f"messages=[{{role: system, content: {SYSTEM}}}, {{role: user, content: "
            f"[{{type: image, content: {image}}}, {{type: text, content: {QUESTION}}}]}}]",
        ]
    else:
        prompt = [f"prompt.user.image={image}", f"prompt.user.text={QUESTION}"]
    return [
        f"output_dir={out}",
        "device=cpu",
        "dtype=fp32",
        *prompt,
        f"max_new_tokens={MAX_NEW_TOKENS}",
        "temperature=0",
        "top_k=null",
    ]


def _messages(image):
    return [
        Message("system", SYSTEM),
        Message("user", [{"type": "image", "content": load_image(image)}, {"type": "text", "content": QUESTION}]),
    ]


def _hf_text(hf_model, transform, tokens, **inputs):
    """transformers' greedy continuation of ``tokens`` [1, s] up to the first stop token, decoded."""
    with torch.no_grad():
        out = hf_model.generate(
            input_ids=tokens, attention_mask=torch.ones_like(tokens), max_new_tokens=MAX_NEW_TOKENS,
            do_sample=False, eos_token_id=list(transform.stop_tokens), pad_token_id=transform.pad_id, **inputs,
        )  # fmt: skip
    new = out[0, tokens.shape[1] :].tolist()
    stops = [i for i, token in enumerate(new) if token in transform.stop_tokens]
    new = new[: stops[0]] if stops else new
    assert len(set(new)) > 1, f"the reference generated {new}: pick another picture or seed"
    return transform.decode(new)


def _printed(proc):
    return proc.stdout.removesuffix("\n")


# ---- Qwen2.5-VL ---------------------------------------------------------------------------------------------------


def test_qwen2_5_vl_3b_generation(tmp_path):
    assets = _vision_qwen2_5_vl_assets
    config_name = "qwen2_5_vl/3B_generation"
    torch.manual_seed(0)
    hf_model = transformers.Qwen2_5_VLForConditionalGeneration(assets.hf_config(assets.size_row(config_name)))
    _spread(hf_model.float())
    hf_model.save_pretrained(tmp_path / "hf")
    image = _picture(tmp_path / "picture.png", assets.IMAGE_SIZE)
    overrides = [
        *_common_overrides(tmp_path / "out", image),
        *assets.model_overrides(config_name, "full"),
        f"tokenizer.path={assets.tokenizer_file()}",
        f"tokenizer.max_pixels={assets.MAX_PIXELS}",
        f"checkpointer.checkpoint_dir={tmp_path / 'hf'}",
    ]
    proc = run_recipe("generate", ROOT / "configs" / f"{config_name}.yaml", overrides, cwd=tmp_path)

    from tune.models.qwen2_5_vl import qwen2_5_vl_transform

    transform = qwen2_5_vl_transform(str(assets.tokenizer_file()), max_pixels=assets.MAX_PIXELS)
    sample = transform({"messages": _messages(image)}, inference=True)
    tokens = torch.tensor([sample["tokens"]])
    mm_token_type_ids = (tokens == assets.special_ids()["<|image_pad|>"]).int()
    images = sample["encoder_input"]
    expected = _hf_text(hf_model.eval(), transform, tokens, mm_token_type_ids=mm_token_type_ids, **images)
    assert _printed(proc) == expected


def _spread(hf_model):
    """Random weights, norms and biases too (the initialisation leaves them trivial), as
    tests/tune/models/test_qwen2_5_vl.py spreads them (narrower ones make this prompt repeat one token)."""
    with torch.no_grad():
        for name, param in hf_model.named_parameters():
            if param.dim() > 1:
                param.normal_(0.0, 0.3 if "embed" in name else 0.15)
            elif "norm" in name or "ln_q" in name:
                param.copy_(1.0 + 0.2 * torch.randn_like(param))
            else:
                param.normal_(0.0, 0.05)


# ---- Gemma 3 ------------------------------------------------------------------------------------------------------


def test_gemma3_vision_4b_generation(tmp_path):
    assets = _vision_gemma3_assets
    root = assets.build_assets(tmp_path / "assets")
    image = _picture(tmp_path / "picture.png", 48)
    overrides = [
        *_common_overrides(tmp_path / "out", image, as_messages=True),
        *assets.model_overrides("gemma3_vision"),
        "model.rope_scale_factor=8.0",  # the 4B's linear RoPE scaling of the global layers, as the checkpoint's
        f"tokenizer.path={root / 'tokenizer.model'}",
        f"tokenizer.image_size={assets.IMAGE_SIZE}",
        f"tokenizer.tokens_per_image={assets.TOKENS_PER_IMAGE}",
        f"tokenizer.image_token_id={assets.IMAGE_TOKEN_ID}",
        f"checkpointer.checkpoint_dir={root / 'hf'}",
    ]
    proc = run_recipe("generate", assets.config_path("gemma3_vision/4B_generation"), overrides, cwd=tmp_path)

    transform = assets.transform(root)
    sample = transform({"messages": _messages(image)}, inference=True)
    tokens = torch.tensor([sample["tokens"]])
    hf_model = transformers.Gemma3ForConditionalGeneration.from_pretrained(root / "hf", dtype=torch.float32).eval()
    expected = _hf_text(
        hf_model, transform, tokens, pixel_values=sample["encoder_input"]["images"],
        token_type_ids=(tokens == assets.IMAGE_TOKEN_ID).long(),
    )  # fmt: skip
    assert _printed(proc) == expected


# ---- Llama 3.2 Vision ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama_assets(tmp_path_factory):
    """The tiny checkpoint and tokenizer, a picture, and transformers' greedy text for it under the shipped
    prompt (the one torchtune's config has too)."""
    assets = _vision_llama_assets
    root = tmp_path_factory.mktemp("llama_vision")
    assets.save_hf_model(root / "hf")
    tokenizer_path = root / "tokenizer.model"
    tokenizer_path.write_bytes(assets.tiktoken_file().read_bytes())
    image = _picture(root / "picture.png", assets.IMAGE_SIZE)

    from tune.models.llama3_2_vision import llama3_2_vision_transform

    transform = llama3_2_vision_transform(
        str(tokenizer_path), image_size=assets.TILE_SIZE, max_seq_len=assets.MAX_SEQ_LEN
    )
    sample = transform({"messages": _messages(image)}, inference=True)
    batch = padded_collate_tiled_images_and_mask(
        [sample], transform.pad_id, pad_direction="left", pad_max_tiles=assets.MAX_NUM_TILES
    )
    tokens, images = batch["tokens"], batch["encoder_input"]["images"]  # [1, s], [1, 1, tiles, 3, h, w]
    (rows, cols) = batch["encoder_input"]["aspect_ratio"][0, 0].tolist()
    ratios = [(h, w) for h in range(1, 5) for w in range(1, 5) if h * w <= assets.MAX_NUM_TILES]
    tokens_per_tile = (assets.TILE_SIZE // 14) ** 2 + 1
    cross_attention_mask = batch["encoder_mask"].view(1, tokens.shape[1], 1, assets.MAX_NUM_TILES, tokens_per_tile)
    aspect_ratio_mask = torch.zeros(1, 1, assets.MAX_NUM_TILES, dtype=torch.long)
    aspect_ratio_mask[..., : rows * cols] = 1
    reference = assets.hf_config([i - 1 for i in assets.CLIP_HIDDEN_STATES])
    hf_model = transformers.MllamaForConditionalGeneration.from_pretrained(
        root / "hf", config=reference, dtype=torch.float32
    ).eval()
    _skip_cross_attention_without_images(hf_model)
    expected = _hf_text(
        hf_model, transform, tokens, pixel_values=images,
        aspect_ratio_ids=torch.tensor([[ratios.index((rows, cols)) + 1]]), aspect_ratio_mask=aspect_ratio_mask,
        cross_attention_mask=cross_attention_mask[..., 0].long(),
    )  # fmt: skip
    return root, image, expected


def _skip_cross_attention_without_images(hf_model):
    """Meta's model leaves a token with no image to attend unchanged by a cross-attention layer; transformers 5.23
    masks the layer's feed-forward branch there but not its attention branch. Zero that branch too."""
    from transformers.models.mllama.modeling_mllama import MllamaCrossAttentionDecoderLayer

    for layer in hf_model.model.language_model.layers:
        if not isinstance(layer, MllamaCrossAttentionDecoderLayer):
            continue
        rows = {}

        def remember(module, args, kwargs, rows=rows):
            rows["mask"] = kwargs["full_text_row_masked_out_mask"][:, 0]  # [b, s, 1]: 0 where nothing to attend

        def zero(module, args, output, rows=rows):
            return (output[0] * rows["mask"], *output[1:])

        layer.register_forward_pre_hook(remember, with_kwargs=True)
        layer.cross_attn.register_forward_hook(zero)


def _llama_overrides(root, image, out, model_component):
    assets = _vision_llama_assets
    return [
        *_common_overrides(out, image),
        *assets.model_overrides(model_component),
        f"tokenizer.path={root / 'tokenizer.model'}",
        f"tokenizer.image_size={assets.TILE_SIZE}",
        f"tokenizer.max_seq_len={assets.MAX_SEQ_LEN}",
        f"checkpointer.checkpoint_dir={root / 'hf'}",
        "checkpointer.checkpoint_files=[model.safetensors]",
    ]


def test_llama3_2_vision_11b_generation_v2(llama_assets, tmp_path):
    root, image, expected = llama_assets
    config = ROOT / "configs" / "llama3_2_vision" / "11B_generation_v2.yaml"
    overrides = _llama_overrides(root, image, tmp_path / "out", "tune.models.llama3_2_vision.llama3_2_vision_11b")
    proc = run_recipe("generate", config, overrides, cwd=tmp_path)
    assert _printed(proc) == expected


def test_torchtune_11b_generation_v2_config_runs(llama_assets, torchtune_wheel, tmp_path):  # noqa: F811
    # torchtune's own config (written for its dev/generate_v2 recipe), moved over by changing the prefix
    root, image, expected = llama_assets
    with zipfile.ZipFile(torchtune_wheel) as archive:
        text = archive.read("recipes/configs/llama3_2_vision/11B_generation_v2.yaml").decode()
    config = tmp_path / "11B_generation_v2.yaml"
    config.write_text(text.replace("torchtune.", "tune."))
    overrides = _llama_overrides(root, image, tmp_path / "out", "tune.models.llama3_2_vision.llama3_2_vision_11b")
    proc = run_recipe("generate", config, overrides, cwd=tmp_path)
    assert _printed(proc) == expected


# ---- errors -------------------------------------------------------------------------------------------------------


def test_text_tokenizer_with_an_image_is_one_clear_error(tiny_assets, tmp_path):
    from tests.recipes.utils import ASSETS

    image = _picture(tmp_path / "picture.png", 32)
    overrides = [
        f"assets_dir={tiny_assets}",
        f"output_dir={tmp_path}",
        "~prompt",
        f"messages=[{{role: user, content: [{{type: image, content: {image}}}, {{type: text, content: Hi}}]}}]",
    ]
    proc = run_recipe("generate", ASSETS / "generation_tiny.yaml", overrides, cwd=tmp_path, check=False)
    assert proc.returncode != 0
    assert "a text tokenizer, but the prompt holds an image" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_torchtune_11b_evaluation_config_validates_and_runs_a_local_task(llama_assets, torchtune_wheel, tmp_path):  # noqa: F811
    # torchtune's 11B_evaluation.yaml (MMMU through lm-eval's multimodal path), moved over by changing the prefix. MMMU
    # comes from the hub, so the config is validated as it is, then run on a local task with images: the colour task
    # of tests/recipes/test_eleuther_eval_vision.py, its targets transformers' answers for each picture
    from tests.recipes.test_eleuther_eval_vision import (
        TASK,
        colour_pictures,
        eval_overrides,
        llama3_2_vision_answers,
        score,
        write_task,
    )
    from tune.models.llama3_2_vision import llama3_2_vision_transform

    root, _, _ = llama_assets
    with zipfile.ZipFile(torchtune_wheel) as archive:
        text = archive.read("recipes/configs/llama3_2_vision/11B_evaluation.yaml").decode()
    config = tmp_path / "11B_evaluation.yaml"
    config.write_text(text.replace("torchtune.", "tune."))
    validate = subprocess.run(
        [sys.executable, "-m", "tune._cli.main", "validate", str(config), "--recipe", "eleuther_eval"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert validate.returncode == 0 and validate.stdout.startswith("OK:"), validate.stdout + validate.stderr

    assets = _vision_llama_assets
    transform = llama3_2_vision_transform(
        str(root / "tokenizer.model"), image_size=assets.TILE_SIZE, max_seq_len=assets.MAX_SEQ_LEN
    )
    pictures = [picture for picture, _ in colour_pictures(6, assets.IMAGE_SIZE)]
    answers = llama3_2_vision_answers(root, transform, pictures)
    assert len(set(answers)) > 1, f"the reference gave {answers} for every picture: pick other pictures or seeds"
    overrides = [
        *eval_overrides(tmp_path / "out", write_task(tmp_path / "tasks", pictures, answers)),
        *assets.model_overrides("tune.models.llama3_2_vision.llama3_2_vision_11b"),
        f"tokenizer.path={root / 'tokenizer.model'}",
        f"tokenizer.image_size={assets.TILE_SIZE}",
        f"tokenizer.max_seq_len={assets.MAX_SEQ_LEN}",
        f"checkpointer.checkpoint_dir={root / 'hf'}",
    ]
    proc = run_recipe("eleuther_eval", config, overrides, cwd=tmp_path, timeout=300)
    assert TASK in proc.stdout and score(tmp_path / "out") == 1.0
