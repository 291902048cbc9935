"""Helpers of the recipe integration tests: tiny assets built in code, and running `tune run` in a subprocess.

Everything is generated here (nothing is downloaded): a SentencePiece BPE tokenizer trained on procedurally
generated text, alpaca-format JSON files of arithmetic questions, and a randomly initialised
``transformers.LlamaForCausalLM`` saved in the Hugging Face format.
"""

import io
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

from tests.recipes._zygote import Zygote

ROOT = Path(__file__).resolve().parents[2]
ASSETS = Path(__file__).parent / "assets"
_ZYGOTE = Zygote()  # this worker's forking recipe runner, started by the first run_recipe

_WORDS = (
    "the a one two three four five six seven eight nine ten add sum of and is what plus minus times number "
    "answer question write list color red blue green below input response instruction task describes that "
    "request appropriately completes an with paired further context provides"
).split()

# Tiny Llama: dim 128, 2 layers, 4 heads, 2 kv heads (GQA), head_dim 32, MLP 256.
MODEL_SIZES = dict(
    hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
)
VOCAB_SIZE = 320
MAX_POSITIONS = 512
MAX_SEQ_LEN = 256  # tokenizer.max_seq_len of the tiny configs in tests/recipes/assets


def _train_tokenizer(path: Path) -> None:
    import sentencepiece as spm

    rng = random.Random(0)
    lines = [" ".join(rng.choice(_WORDS) for _ in range(12)) for _ in range(2000)]
    lines += [f"{a} + {b} = {a + b}" for a in range(30) for b in range(30)]
    model = io.BytesIO()
    # Llama-2 special ids: unk 0, bos 1, eos 2, no pad piece (the tokenizer pads with 0).
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=model,
        vocab_size=VOCAB_SIZE,
        model_type="bpe",
        byte_fallback=True,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        character_coverage=1.0,
        minloglevel=2,
    )
    path.write_bytes(model.getvalue())


def _write_alpaca(path: Path, num_samples: int, seed: int) -> None:
    rng = random.Random(seed)
    rows = []
    for i in range(num_samples):
        a, b = rng.randrange(50), rng.randrange(50)
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randrange(2, 30)))
        row = {"instruction": f"Add the two numbers. {words}", "input": f"{a} and {b}", "output": str(a + b)}
        if i % 3 == 0:  # some rows without input: the alpaca template then has no "### Input:" section
            row["input"] = ""
            row["output"] = f"{a} plus {b} is {a + b}. {words}"
        rows.append(row)
    path.write_text(json.dumps(rows))


def _save_hf_llama(path: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        **MODEL_SIZES,
    )
    torch.manual_seed(0)
    save_spread_hf_model(LlamaForCausalLM(config).to(torch.float32), path)


def save_spread_hf_model(model, path: Path) -> None:
    """Fills every matrix of a transformers model with N(0, 0.08) noise from the global generator (larger than the
    default 0.02 init, so that a few optimizer steps move the loss visibly) and saves it as safetensors in ``path``."""
    import torch

    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.08)
    model.save_pretrained(path, safe_serialization=True)


def build_tiny_assets(root: Path) -> Path:
    """Writes ``tokenizer.model``, ``train.json``, ``val.json`` and ``llama/`` (HF checkpoint) into ``root``."""
    _train_tokenizer(root / "tokenizer.model")
    _write_alpaca(root / "train.json", num_samples=48, seed=0)
    _write_alpaca(root / "val.json", num_samples=10, seed=1)  # 4 + 4 + a ragged 2
    _save_hf_llama(root / "llama")
    return root


def run_recipe(
    recipe: str,
    config: Path | str,
    overrides: list[str],
    cwd: Path,
    timeout: int = 120,
    check: bool = True,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """Runs ``tune run RECIPE --config CONFIG OVERRIDES`` in a fresh process (tests/recipes/assets importable).

    Args:
        check (bool): fail the test, showing the output, when the exit status is not 0.
        env (dict[str, str] | None): extra environment variables.

    Returns:
        subprocess.CompletedProcess: with ``stdout`` and ``stderr`` captured as text.
    """
    fresh = env is not None or os.environ.get("TUNE_TEST_FRESH_PROCESS") == "1"
    env = {**os.environ, **(env or {})}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ASSETS), env.get("PYTHONPATH", "")])
    env.setdefault("OMP_NUM_THREADS", "1")
    env["TQDM_DISABLE"] = "1"
    argv = ["run", recipe, "--config", str(config), *overrides]
    cmd = [sys.executable, "-m", "tune._cli.main", *argv]
    if fresh:  # extra environment variables may matter at import time: a fresh interpreter
        proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    else:  # forked from a process that has imported torch and tune already (tests/recipes/_zygote.py)
        outputs = Path(tempfile.mkdtemp(prefix="tune-run-"))
        stdout, stderr = outputs / "stdout", outputs / "stderr"
        returncode = _ZYGOTE.run(argv, cwd, env, timeout, str(stdout), str(stderr))
        proc = subprocess.CompletedProcess(cmd, returncode, stdout.read_text(), stderr.read_text())
        shutil.rmtree(outputs)
    assert proc.returncode == 0 or not check, (
        f"`{' '.join(cmd)}` exited with {proc.returncode}\n--- stdout ---\n{proc.stdout[-4000:]}\n"
        f"--- stderr ---\n{proc.stderr[-8000:]}"
    )
    return proc


def random_peft_adapter(assets: Path, out: Path, use_dora: bool = False, model_dir: Path | None = None) -> Path:
    """A PEFT adapter for lora_tiny.yaml's layers (rank 8, alpha 16) on the tiny Llama (or ``model_dir``), with
    random A and B (seeded), so that a recipe's first loss depends on loading it."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    base = LlamaForCausalLM.from_pretrained(model_dir or assets / "llama", dtype=torch.float32)
    targets = ["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    config = LoraConfig(r=8, lora_alpha=16, target_modules=targets, use_dora=use_dora, init_lora_weights=False)
    model = get_peft_model(base, config)
    torch.manual_seed(3)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                param.normal_(0.0, 0.05)
    model.save_pretrained(out)
    return out


def hf_greedy_tokens(model, prompt: list[int], max_new_tokens: int, eos_id: int, pad_id: int) -> list[int]:
    """The tokens a transformers model adds to ``prompt`` by greedy ``generate``, up to (not including) EOS: the
    reference the generation and evaluation recipes are compared with."""
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=eos_id,
            pad_token_id=pad_id,
        )
    new = out[0, len(prompt) :].tolist()
    return new[: new.index(eos_id)] if eos_id in new else new


def read_jsonl(path: Path) -> list[dict]:
    """Parses a JSON-lines metric log."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def loss_records(out: Path) -> list[dict]:
    """The training records (those with a loss) of the metric log a run wrote under ``out``, in step order."""
    return [r for r in read_jsonl(out / "logs" / "log.jsonl") if "loss" in r]


def losses_by_step(out: Path) -> dict[int, float]:
    """Step -> training loss, from the metric log a run wrote under ``out``."""
    return {r["step"]: r["loss"] for r in loss_records(out)}


def tiny_dataset(
    assets: Path, split_file: str = "train.json", max_seq_len: int = MAX_SEQ_LEN, train_on_input: bool = False
):
    """The tiny configs' dataset, built in this process: the recipes' samples, for the reference loops."""
    from tune.datasets import alpaca_dataset
    from tune.models.llama2 import llama2_tokenizer

    tokenizer = llama2_tokenizer(str(assets / "tokenizer.model"), max_seq_len=max_seq_len, prompt_template=None)
    return alpaca_dataset(
        tokenizer, source="json", data_files=str(assets / split_file), split="train", train_on_input=train_on_input
    )


def pad_batch(samples: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pads samples into ``tokens`` (pad 0) and ``labels`` (-100) written independently of tune's collate."""
    length = max(len(s["tokens"]) for s in samples)
    tokens = torch.zeros(len(samples), length, dtype=torch.long)  # pad id 0; causal attention never reads it
    labels = torch.full((len(samples), length), -100, dtype=torch.long)
    for i, s in enumerate(samples):
        tokens[i, : len(s["tokens"])] = torch.as_tensor(s["tokens"])
        labels[i, : len(s["labels"])] = torch.as_tensor(s["labels"])
    return tokens, labels


def reference_run(
    assets: Path,
    num_steps: int,
    batch_size: int,
    lr: float,
    weight_decay: float,
    model: torch.nn.Module | None = None,
    optimizer_cls: type[torch.optim.Optimizer] = torch.optim.AdamW,
) -> tuple[list[float], list[float], torch.nn.Module]:
    """An independent plain PyTorch + transformers training loop over the tiny dataset in order (no shuffle).

    Args:
        model (torch.nn.Module | None): the model to train (e.g. a PEFT model); default the HF checkpoint.
        optimizer_cls (type[torch.optim.Optimizer]): built as ``optimizer_cls(params, lr=, weight_decay=,
            foreach=False)``. Default ``torch.optim.AdamW``.

    Returns:
        tuple: losses and gradient norms of the first ``num_steps`` steps, and the trained model.
    """
    from transformers import LlamaForCausalLM

    dataset = tiny_dataset(assets)
    if model is None:
        model = LlamaForCausalLM.from_pretrained(assets / "llama", dtype=torch.float32)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = optimizer_cls(params, lr=lr, weight_decay=weight_decay, foreach=False)
    losses, grad_norms = [], []
    for step in range(num_steps):
        tokens, labels = pad_batch([dataset[i] for i in range(step * batch_size, (step + 1) * batch_size)])
        logits = model(input_ids=tokens).logits  # [b, s, vocab]
        # position t predicts token t + 1; mean over every non-ignored target of the batch
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)
        loss.backward()
        grad_norms.append(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params])).item())
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses, grad_norms, model


def mc_task_yaml(name: str, data: Path) -> str:
    """An lm-eval multiple-choice task on a local JSON-lines file of ``{question, choices, label}`` rows (scored by
    log-likelihood, accuracy), for recipes/eleuther_eval.py without downloads."""
    return f"""\
task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{label}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""
