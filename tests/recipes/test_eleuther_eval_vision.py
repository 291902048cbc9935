"""Integration tests of recipes/eleuther_eval.py on vision-language models: lm-eval 0.4.x's multimodal path (tasks
with ``doc_to_image``, scored by generation) on a local task, run with the shipped
``configs/llama3_2_vision/11B_evaluation.yaml`` moved to each family's tiny model by command-line overrides.

The task is the colour task of demo/vision_data.py ("what colour is the shape?", one word), written here as a
parquet file with the pictures inside (as MMMU's are) and a task YAML whose ``doc_to_text`` puts lm-eval's
``<image>`` placeholder before the question, as the models were fine-tuned. The reference answers are transformers'
greedy ``generate`` of the same checkpoint on the same prompt: the tokens and pixels of the family's model transform
for one user turn holding the picture then the question, with the assistant turn open (the transforms' equality with
the Hugging Face processors is tested in tests/tune/models/), cut before the first stop token.

- Random tiny checkpoints (Gemma 3, Qwen2.5-VL): the task's targets ARE the reference answers, so the recipe scores
  exact_match 1.0 exactly when it generates what transformers generates for every picture (the answers differ from
  picture to picture, so an evaluator that drops or swaps the images scores less).
- The demo's tiny Gemma 3 (demo/make_demo_vision.py), random and then fine-tuned on the colour task by
  full_finetune_single_device for 120 steps (marked slow): the targets are the true colours, so the score is the model's
  accuracy. The expected score is the reference's accuracy; the random model is near chance or below, the
  fine-tuned one near perfect.
"""

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.recipes import _vision_gemma3_assets, _vision_qwen2_5_vl_assets
from tests.recipes.utils import ROOT, run_recipe
from tune.data import Message, load_image

pytest.importorskip("lm_eval", reason="the eval extra (lm-eval) is not installed")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.integration

CONFIG = ROOT / "configs" / "llama3_2_vision" / "11B_evaluation.yaml"
TASK = "colour_task"
MAX_GEN_TOKS = 6

_TASK_YAML = """\
task: {name}
dataset_path: parquet
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_image: [image]
doc_to_text: "<image>{{{{question}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: {max_gen_toks}
  do_sample: false
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
"""


def colour_pictures(num_docs: int, image_size: int, seed: int = 0) -> list[tuple[object, str]]:
    """``num_docs`` pictures of the colour task (PIL images) and their colours."""
    from demo.vision_data import COLOURS, SHAPES, draw

    rng = random.Random(seed)
    docs = []
    for _ in range(num_docs):
        colour, shape = rng.choice(list(COLOURS)), rng.choice(SHAPES)
        docs.append((draw(colour, shape, image_size, rng), colour))
    return docs


def write_task(directory: Path, pictures: list, answers: list[str], name: str = TASK) -> Path:
    """``directory/<name>.yaml``, an lm-eval task over ``directory/<name>.parquet``: one row per picture (its PNG
    bytes inside the file), the question, and the answer to score against."""
    import io

    import datasets

    from demo.vision_data import QUESTION

    directory.mkdir(parents=True, exist_ok=True)
    images = []
    for picture in pictures:
        buffer = io.BytesIO()
        picture.save(buffer, format="PNG")
        images.append({"bytes": buffer.getvalue(), "path": None})
    features = datasets.Features(
        {"image": datasets.Image(), "question": datasets.Value("string"), "answer": datasets.Value("string")}
    )
    rows = {"image": images, "question": [QUESTION] * len(images), "answer": answers}
    data = directory / f"{name}.parquet"
    datasets.Dataset.from_dict(rows, features=features).to_parquet(str(data))
    (directory / f"{name}.yaml").write_text(_TASK_YAML.format(name=name, data=data, max_gen_toks=MAX_GEN_TOKS))
    return directory


def prompt_sample(transform, picture) -> dict:
    """What the recipe asks the model: one user turn, the picture then the question, the assistant turn open."""
    from demo.vision_data import QUESTION

    content = [{"type": "image", "content": picture}, {"type": "text", "content": QUESTION}]
    return transform({"messages": [Message(role="user", content=content)]}, inference=True)


def hf_answer(hf_model, transform, tokens: torch.Tensor, **inputs) -> str:
    """transformers' greedy continuation of ``tokens`` [1, s] (``MAX_GEN_TOKS`` at most), up to the first stop
    token, decoded, cut at the task's stop string."""
    with torch.no_grad():
        out = hf_model.generate(
            input_ids=tokens, attention_mask=torch.ones_like(tokens), max_new_tokens=MAX_GEN_TOKS,
            do_sample=False, eos_token_id=list(transform.stop_tokens), pad_token_id=transform.pad_id, **inputs,
        )  # fmt: skip
    new = out[0, tokens.shape[1] :].tolist()
    stops = [i for i, token in enumerate(new) if token in transform.stop_tokens]
    return transform.decode(new[: stops[0]] if stops else new).split("\n")[0]


def gemma3_answers(hf_dir: Path, transform, image_token_id: int, pictures: list) -> list[str]:
    hf_model = transformers.Gemma3ForConditionalGeneration.from_pretrained(hf_dir, dtype=torch.float32).eval()
    answers = []
    for picture in pictures:
        sample = prompt_sample(transform, picture)
        tokens = torch.tensor([sample["tokens"]])
        answers.append(
            hf_answer(
                hf_model,
                transform,
                tokens,
                pixel_values=sample["encoder_input"]["images"],
                token_type_ids=(tokens == image_token_id).long(),
            )  # fmt: skip
        )
    return answers


def eval_overrides(out: Path, tasks: Path, limit: int | None = None) -> list[str]:
    """The shipped config on the CPU in fp32, on the local task."""
    return [
        f"output_dir={out}",
        "device=cpu",
        "dtype=fp32",
        f"include_path={tasks}",
        f"tasks=[{TASK}]",
        f"limit={'null' if limit is None else limit}",
        "max_seq_length=128",
        "checkpointer.checkpoint_files=[model.safetensors]",
    ]


def score(out: Path) -> float:
    return json.loads((out / "eleuther_eval_results.json").read_text())[TASK]["exact_match,none"]


# ---- random tiny checkpoints: the recipe generates what transformers generates --------------------------------


@pytest.fixture(scope="module")
def gemma3_root(tmp_path_factory) -> Path:
    """The tiny Gemma 3 checkpoint and tokenizer of tests/recipes/_vision_gemma3_assets.py."""
    return _vision_gemma3_assets.build_assets(tmp_path_factory.mktemp("gemma3_vision"))


def gemma3_overrides(root: Path) -> list[str]:
    """The shipped config's model, model transform and checkpointer changed to the tiny Gemma 3's."""
    assets = _vision_gemma3_assets
    return [
        *assets.model_overrides("gemma3_vision"),
        "model.rope_scale_factor=8.0",  # the checkpoint's linear RoPE scaling of the global layers
        "tokenizer._component_=tune.models.gemma3_vision.gemma3_vision_transform",
        f"tokenizer.path={root / 'tokenizer.model'}",
        f"tokenizer.image_size={assets.IMAGE_SIZE}",
        f"tokenizer.tokens_per_image={assets.TOKENS_PER_IMAGE}",
        f"tokenizer.image_token_id={assets.IMAGE_TOKEN_ID}",
        f"checkpointer.checkpoint_dir={root / 'hf'}",
        "checkpointer.model_type=GEMMA3_VISION",
    ]


def test_gemma3_vision_matches_transformers(gemma3_root, tmp_path):
    assets, root = _vision_gemma3_assets, gemma3_root
    transform = assets.transform(root)
    pictures = [picture for picture, _ in colour_pictures(8, assets.IMAGE_SIZE)]
    answers = gemma3_answers(root / "hf", transform, assets.IMAGE_TOKEN_ID, pictures)
    assert len(set(answers)) > 1, f"the reference gave {answers} for every picture: pick other pictures or seeds"
    tasks = write_task(tmp_path / "tasks", pictures, answers)

    overrides = [*eval_overrides(tmp_path / "out", tasks), *gemma3_overrides(root)]
    proc = run_recipe("eleuther_eval", CONFIG, overrides, cwd=tmp_path, timeout=300)
    assert TASK in proc.stdout  # the harness's table
    assert score(tmp_path / "out") == 1.0


def test_qwen2_5_vl_matches_transformers(tmp_path):
    from tests.recipes.test_generate_vision import _spread
    from tune.models.qwen2_5_vl import qwen2_5_vl_transform

    assets = _vision_qwen2_5_vl_assets
    config_name = "qwen2_5_vl/3B_generation"  # the 3B's settings: tied embeddings
    torch.manual_seed(0)
    hf_model = transformers.Qwen2_5_VLForConditionalGeneration(assets.hf_config(assets.size_row(config_name)))
    _spread(hf_model.float())
    hf_model.save_pretrained(tmp_path / "hf")
    transform = qwen2_5_vl_transform(str(assets.tokenizer_file()), max_pixels=assets.MAX_PIXELS)
    pictures = [picture for picture, _ in colour_pictures(8, assets.IMAGE_SIZE)]
    answers = []
    for picture in pictures:
        sample = prompt_sample(transform, picture)
        tokens = torch.tensor([sample["tokens"]])
        image_tokens = (tokens == assets.special_ids()["<|image_pad|>"]).int()
        answers.append(
            hf_answer(hf_model.eval(), transform, tokens, mm_token_type_ids=image_tokens, **sample["encoder_input"])
        )
    assert len(set(answers)) > 1, f"the reference gave {answers} for every picture: pick other pictures or seeds"
    tasks = write_task(tmp_path / "tasks", pictures, answers)

    overrides = [
        *eval_overrides(tmp_path / "out", tasks),
        *assets.model_overrides(config_name, "full"),
        "tokenizer._component_=tune.models.qwen2_5_vl.qwen2_5_vl_transform",
        f"tokenizer.path={assets.tokenizer_file()}",
        f"tokenizer.max_pixels={assets.MAX_PIXELS}",
        f"checkpointer.checkpoint_dir={tmp_path / 'hf'}",
        "checkpointer.model_type=QWEN2_5_VL",
    ]
    proc = run_recipe("eleuther_eval", CONFIG, overrides, cwd=tmp_path, timeout=300)
    assert TASK in proc.stdout
    assert score(tmp_path / "out") == 1.0


# ---- the demo's tiny Gemma 3: random, then fine-tuned on the colour task --------------------------------------------


def _python(args: list, cwd: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, f"{args} exited with {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


def _demo_eval_config(path: Path, assets: Path) -> Path:
    """The shipped evaluation config with the demo's model, model transform and checkpointer (those of
    configs/demo/vision_full_single_device.yaml)."""
    import yaml

    demo = yaml.safe_load((ROOT / "configs" / "demo" / "vision_full_single_device.yaml").read_text())
    cfg = yaml.safe_load(CONFIG.read_text())
    cfg.update(assets_dir=str(assets), model=demo["model"], tokenizer=demo["tokenizer"])
    cfg["checkpointer"] = {**demo["checkpointer"], "checkpoint_dir": "???"}
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


@pytest.mark.slow  # 25-40 s on 2 CPU cores: fine-tuning and two evaluations
def test_demo_gemma3_scores_chance_then_near_perfect_after_fine_tuning(tmp_path):
    from tune.models.gemma3_vision import gemma3_vision_transform

    assets = tmp_path / "assets"
    # 1280 training rows, 3 epochs of 40 steps of 32 rows: 24/24 held-out with the demo's seeds (the demo runs 186)
    _python([ROOT / "demo" / "make_demo_vision.py", assets, "--num-train", "1280", "--num-heldout", "24"], tmp_path)
    train_overrides = [f"assets_dir={assets}", f"output_dir={tmp_path / 'run'}", "epochs=3"]
    run_recipe("full_finetune_single_device", "demo/vision_full_single_device", train_overrides, cwd=tmp_path)
    fine_tuned = tmp_path / "run" / "step_120"
    config = _demo_eval_config(tmp_path / "demo_evaluation.yaml", assets)

    rows = json.loads((assets / "data" / "heldout.json").read_text())
    pictures = [load_image(row["images"][0]) for row in rows]
    colours = [row["texts"][0]["assistant"] for row in rows]
    tasks = write_task(tmp_path / "tasks", pictures, colours)
    hf_config = json.loads((assets / "base_model" / "config.json").read_text())
    transform = gemma3_vision_transform(
        str(assets / "tokenizer" / "tokenizer.model"), image_size=hf_config["vision_config"]["image_size"],
        tokens_per_image=hf_config["mm_tokens_per_image"], image_token_id=hf_config["image_token_index"],
    )  # fmt: skip

    scores = {}
    for name, checkpoint in (("random", assets / "base_model"), ("fine-tuned", fine_tuned)):
        answers = gemma3_answers(checkpoint, transform, hf_config["image_token_index"], pictures)
        expected = sum(answer == colour for answer, colour in zip(answers, colours)) / len(colours)
        out = tmp_path / f"out_{name}"
        overrides = [*eval_overrides(out, tasks), f"checkpointer.checkpoint_dir={checkpoint}"]
        run_recipe("eleuther_eval", config, overrides, cwd=tmp_path, timeout=300)
        scores[name] = score(out)
        assert scores[name] == pytest.approx(expected, abs=1e-9), name
    # random weights answer with a colour by chance at best (1 in 6); 24/24 after fine-tuning with the demo's seeds
    print(f"exact_match on {len(colours)} held-out pictures: {scores}")
    assert scores["random"] <= 0.4 and scores["fine-tuned"] >= 0.9, scores


def llama3_2_vision_answers(root: Path, transform, pictures: list) -> list[str]:
    """The reference answers of the tiny Llama 3.2 Vision in ``root/hf`` (tests/recipes/_vision_llama_assets.py):
    transformers' model made to compute as Meta's, as tests/recipes/test_generate_vision.py makes it."""
    from tests.recipes import _vision_llama_assets as assets
    from tests.recipes.test_generate_vision import _skip_cross_attention_without_images
    from tune.data import padded_collate_tiled_images_and_mask

    reference = assets.hf_config([i - 1 for i in assets.CLIP_HIDDEN_STATES])
    hf_model = transformers.MllamaForConditionalGeneration.from_pretrained(
        root / "hf", config=reference, dtype=torch.float32
    ).eval()
    _skip_cross_attention_without_images(hf_model)
    ratios = [(h, w) for h in range(1, 5) for w in range(1, 5) if h * w <= assets.MAX_NUM_TILES]
    tokens_per_tile = (assets.TILE_SIZE // 14) ** 2 + 1
    answers = []
    for picture in pictures:
        batch = padded_collate_tiled_images_and_mask(
            [prompt_sample(transform, picture)], transform.pad_id, pad_direction="left",
            pad_max_tiles=assets.MAX_NUM_TILES,
        )  # fmt: skip
        tokens = batch["tokens"]
        (rows, cols) = batch["encoder_input"]["aspect_ratio"][0, 0].tolist()
        mask = batch["encoder_mask"].view(1, tokens.shape[1], 1, assets.MAX_NUM_TILES, tokens_per_tile)
        aspect_ratio_mask = torch.zeros(1, 1, assets.MAX_NUM_TILES, dtype=torch.long)
        aspect_ratio_mask[..., : rows * cols] = 1
        answers.append(
            hf_answer(
                hf_model,
                transform,
                tokens,
                pixel_values=batch["encoder_input"]["images"],
                aspect_ratio_ids=torch.tensor([[ratios.index((rows, cols)) + 1]]),
                aspect_ratio_mask=aspect_ratio_mask,
                cross_attention_mask=mask[..., 0].long(),
            )  # fmt: skip
        )
    return answers


# ---- errors ---------------------------------------------------------------------------------------------------------


def test_log_likelihood_with_images_is_one_clear_error(gemma3_root, tmp_path):
    # a multiple-choice task with images: lm-eval asks for log-likelihoods, which its own hf-multimodal refuses too
    tasks = write_task(tmp_path / "tasks", [picture for picture, _ in colour_pictures(2, 32)], ["red", "blue"])
    text = (tasks / f"{TASK}.yaml").read_text()
    text = text.replace("output_type: generate_until", 'output_type: multiple_choice\ndoc_to_choice: ["red", "blue"]')
    (tasks / f"{TASK}.yaml").write_text(text)
    overrides = [*eval_overrides(tmp_path / "out", tasks), *gemma3_overrides(gemma3_root)]
    proc = run_recipe("eleuther_eval", CONFIG, overrides, cwd=tmp_path, check=False)
    assert proc.returncode != 0
    assert f"tasks: holds {TASK}: a task with images, which eleuther_eval scores by generation only" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_text_model_with_a_task_with_images_is_one_clear_error(tiny_assets, tmp_path):
    from tests.recipes.utils import ASSETS

    tasks = write_task(tmp_path / "tasks", [picture for picture, _ in colour_pictures(2, 32)], ["red", "blue"])
    overrides = [f"assets_dir={tiny_assets}", f"output_dir={tmp_path / 'out'}", f"include_path={tasks}"]
    overrides.append(f"tasks=[{TASK}]")
    proc = run_recipe("eleuther_eval", ASSETS / "eval_tiny.yaml", overrides, cwd=tmp_path, check=False)
    assert proc.returncode != 0
    assert f"tasks: holds {TASK}, with images, but tokenizer._component_=" in proc.stderr
    assert "Traceback" not in proc.stderr
