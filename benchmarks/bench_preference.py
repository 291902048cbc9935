"""Reward-model and ORPO training throughput and peak memory: tune's recipes against TRL's trainers.

One command (from the repository root; builds the peer harness's assets on first use, see benchmarks/README.md)::

    .venv/bin/python benchmarks/bench_preference.py --sizes small,medium --reps 3

Quick look: ``--sizes small --steps 8 --reps 1``; ``--only orpo_lora,reward_lora`` picks rows.

What runs, for each size (the harness's Llama-shaped ~7M / ~64M-parameter checkpoints) and each row of ``--only``:

- ``orpo_lora``: tune's ``lora_dpo_single_device`` with ``tune.rlhf.loss.ORPOLoss`` (beta 0.1), its config the
  harness's ``lora_all_{size}`` torchtune config turned into a preference config as ``bench_dpo.py`` does
  (``torchtune.`` -> ``tune.``); against TRL's ``ORPOTrainer`` (``trl.experimental.orpo``, beta 0.1) on
  ``LlamaForCausalLM`` with a PEFT ``LoraConfig`` on the same modules (q, k, v, o, gate, up, down), rank 8, alpha 16,
  dropout 0.
- ``orpo_full``: tune's ``full_dpo_distributed`` in one process with the same loss, on the harness's
  ``full_{size}`` config; against ``ORPOTrainer`` without PEFT.
- ``reward_lora`` / ``reward_full``: tune's ``reward_model_single_device``; against TRL's ``RewardTrainer`` on
  ``LlamaForSequenceClassification`` loaded from the same checkpoint (``num_labels=1``, pad id 0), with a PEFT
  ``LoraConfig`` (``task_type="SEQ_CLS"``, same modules, rank and alpha) or all parameters trained.

Common to both systems: the same preference pairs (``bench_dpo.py``'s, from the harness's Alpaca rows: the row's
answer chosen, the next row's rejected), the same tokens (tokenised once, before any run, by tune's
``preference_dataset`` with the harness's SentencePiece tokenizer, at most 512 tokens per sequence; TRL gets these
ids as its pre-tokenised columns, so its timed loop is untouched), the same pair order (tune's sampler, seed 0; TRL
reads it sequentially), batch 4 pairs, every batch padded to its longest sequence (TRL's collators), fp32 on the
CPU, AdamW (fused) lr 3e-4, weight decay 0, cosine schedule without warm-up, no gradient clipping, no activation
checkpointing, dropout 0, data-loader workers 0. TRL runs as fast as it fairly can: no evaluation, no checkpoint
saving, no logging (``logging_strategy="no"``), ``use_cpu=True``, ``bf16=False`` and
``gradient_checkpointing=False`` (TRL's defaults are bf16 autocast and checkpointing, which tune's side does not do),
and without the optional packages of tune's environment that a plain TRL install lacks and transformers would import
(torchao, wandb). tune logs every step (its timestamps are the measurement) and saves its end-of-run checkpoint
after the last timed step (no config key skips it).

Definitions: pairs/s = preference pairs (batch size x optimizer steps) of steps 4..N over their wall time, from
per-step timestamps taken right after the optimizer step (tune: its DiskLogger's ``time``; TRL: a
``TrainerCallback.on_step_end`` writing ``time.perf_counter()``). Peak RSS = the process's maximum resident set size
(``wait4``). Ratios are tune / TRL of the means over repetitions (pairs/s above 1 is faster; RSS below 1 is
smaller). Every run is its own process; runs interleave (rep -> size -> row -> system). Each run's data is checked
against the pre-tokenised pairs: pairs timed, each step's padded length and non-padding tokens (TRL: recorded by its
collator; tune: tokens from its log's tokens/s x step time, which are approximate). Prints a markdown table, writes
``benchmarks/results/preference.json`` (and ``.md``).
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_dpo  # noqa: E402 (the preference pairs and the LoRA DPO config)
import bench_recipes as common  # noqa: E402 (the harness plumbing)

ROOT = common.ROOT
WARMUP_STEPS = common.WARMUP_STEPS
BATCH_SIZE = bench_dpo.BATCH_SIZE
MAX_SEQ_LEN = 512  # the harness configs' tokenizer.max_seq_len
LEARNING_RATE = 3e-4  # the harness configs' optimizer.lr
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ROWS = {  # row -> (tune recipe, TRL trainer, LoRA)
    "orpo_lora": ("lora_dpo_single_device", "orpo", True),
    "orpo_full": ("full_dpo_distributed", "orpo", False),
    "reward_lora": ("reward_model_single_device", "reward", True),
    "reward_full": ("reward_model_single_device", "reward", False),
}
DEFAULT_STEPS = {"small": 40, "medium": 12}
PAIR_COLUMNS = ("chosen_input_ids", "chosen_labels", "rejected_input_ids", "rejected_labels")  # tune's pair sample


# ------------------------------------------------------------------------------------------------ tune's configs


def _with_pairs(bench: Path, text: str, extra: str = "") -> str:
    """A harness config's text with its Alpaca dataset swapped for ``bench_dpo.py``'s preference pairs."""
    head, _, rest = text.partition("\ndataset:\n")
    _, _, rest = rest.partition("\nseed:")
    dataset = (
        "\ndataset:\n  _component_: tune.datasets.preference_dataset\n  source: json\n"
        f"  data_files: {bench_dpo._pairs_file(bench)}\n  split: train\n"
    )
    return head + dataset + extra + "seed:" + rest


def _write(bench: Path, name: str, text: str) -> Path:
    path = bench / "configs" / "preference" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _orpo_config(bench: Path, size: str, lora: bool) -> Path:
    """The harness's config of ``size`` as a tune ORPO config (LoRA: ``bench_dpo.py``'s DPO config)."""
    orpo = "_component_: tune.rlhf.loss.ORPOLoss\n  beta: 0.1"
    if lora:
        text = bench_dpo._dpo_config(bench, size, "tune").read_text()
        text = text.replace("_component_: tune.rlhf.loss.DPOLoss", orpo)
    else:
        text = common._tune_config(bench, f"full_{size}").read_text()
        text = _with_pairs(bench, text, extra="ref_checkpointer: null  # ORPO needs no reference model\n")
        text = text.replace("_component_: tune.modules.loss.CEWithChunkedOutputLoss", orpo)
    return _write(bench, f"tune_orpo_{'lora' if lora else 'full'}_{size}", text)


def _reward_config(bench: Path, size: str, lora: bool) -> Path:
    """The harness's ``lora_all`` or ``full`` config of ``size`` as a tune reward-model config: the model builder
    wrapped in ``tune.models.classifier_model`` (one output), the pairs of ``bench_dpo.py``, the Bradley-Terry loss."""
    text = common._tune_config(bench, f"{'lora_all' if lora else 'full'}_{size}").read_text()
    head, _, rest = text.partition("\nmodel:\n")
    model, _, rest = rest.partition("\n\n")
    classifier = "\nmodel:\n  _component_: tune.models.classifier_model\n  num_classes: 1\n  base:\n"
    text = head + classifier + "\n".join("  " + line for line in model.splitlines()) + "\n\n" + rest
    text = _with_pairs(bench, text)
    loss = "_component_: tune.rlhf.loss.RewardModelLoss"
    text = text.replace("_component_: tune.modules.loss.CEWithChunkedOutputLoss", loss)
    # a reward model's adapter carries its score head: the recipe saves the whole model, and refuses this key
    text = text.replace("save_adapter_weights_only: True\n", "")
    return _write(bench, f"tune_reward_{'lora' if lora else 'full'}_{size}", text)


def _tune_config(bench: Path, row: str, size: str) -> Path:
    if row.startswith("orpo"):
        return _orpo_config(bench, size, lora=row == "orpo_lora")
    return _reward_config(bench, size, lora=row == "reward_lora")


# ------------------------------------------------------------------------------------------------ the pairs


def _pretokenize(bench: Path, config: Path) -> Path:
    """Tokenises the pairs once with tune's dataset of ``config`` and writes them, in tune's sampler order, as
    JSON lines (the TRL runs read them; the data checks use them). Written anew by every invocation: a change to
    tune's tokenisation reaches both systems."""
    path = bench / "work" / "assets" / f"preference_tokens_{MAX_SEQ_LEN}.jsonl"
    from omegaconf import OmegaConf

    from tune import config as tune_config
    from tune.training.checkpointing import StatefulDistributedSampler

    cfg = OmegaConf.load(config)
    cwd = os.getcwd()
    os.chdir(bench)  # the harness configs' paths are relative to it
    try:
        tokenizer = tune_config.instantiate(cfg.tokenizer)
        dataset = tune_config.instantiate_dataset(cfg.dataset, tokenizer)
    finally:
        os.chdir(cwd)
    sampler = StatefulDistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=cfg.seed)
    sampler.set_epoch(0)
    with open(path.with_suffix(".tmp"), "w") as out:
        for index in sampler:
            sample = dataset[index]
            out.write(json.dumps({key: list(map(int, sample[key])) for key in PAIR_COLUMNS}) + "\n")
    path.with_suffix(".tmp").rename(path)
    return path


def _expected_batches(pairs: Path, steps: int) -> list[tuple[int, int]]:
    """(padded length, non-padding tokens) of the first ``steps`` batches, chosen and rejected rows together."""
    batches = []
    with open(pairs) as rows:
        for _ in range(steps):
            batch = [json.loads(next(rows)) for _ in range(BATCH_SIZE)]
            lengths = [len(r[key]) for r in batch for key in ("chosen_input_ids", "rejected_input_ids")]
            batches.append((max(lengths), sum(lengths)))
    return batches


# ------------------------------------------------------------------------------------------------ running


def _env(bench: Path) -> dict:
    paths = [str(ROOT), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p), "TQDM_DISABLE": "1"}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HOME=str(bench / "work" / "hf_home"))
    env.update(TOKENIZERS_PARALLELISM="false", TRANSFORMERS_VERBOSITY="error", TRL_EXPERIMENTAL_SILENCE="1")
    return env


def _window(timestamps: list[float]) -> tuple[int, float]:
    """Pairs and seconds of steps WARMUP_STEPS + 1 .. N from the per-step timestamps (step 1 first)."""
    window = timestamps[WARMUP_STEPS - 1 :]
    return BATCH_SIZE * (len(window) - 1), window[-1] - window[0]


def _run_tune(bench: Path, row: str, size: str, steps: int, rep: int) -> dict:
    recipe = ROWS[row][0]
    out = Path("work") / "runs" / f"tune_{row}_{size}_{rep}"
    shutil.rmtree(bench / out, ignore_errors=True)  # the DiskLogger appends
    overrides = [f"output_dir={out}", f"max_steps_per_epoch={steps}", f"batch_size={BATCH_SIZE}"]
    command = [sys.executable, "-m", "tune._cli.main", "run", recipe, "--config", str(_tune_config(bench, row, size))]
    log = bench / "work" / "logs" / f"{out.name}.log"
    status, tail, peak_mib = common._run_process(command + overrides, bench, _env(bench), log)
    if status != 0:
        print(tail, file=sys.stderr)
        raise SystemExit(f"tune {row} {size} failed with exit status {status} (log: {log})")
    logged = bench_dpo._steps("tune", bench / out)
    pairs, seconds = _window([t for _, t, _ in logged])
    # tokens of step i = its tokens/s x its duration (approximate: the recipe's own clock)
    tokens = [tps * (t - t_prev) for (_, t_prev, _), (_, t, tps) in zip(logged, logged[1:])]
    return {
        "pairs_per_second": pairs / seconds,
        "peak_rss_mib": peak_mib,
        "steps": len(logged),
        "pairs_timed": pairs,
        "tokens_per_step": tokens,
    }


def _run_trl(bench: Path, row: str, size: str, steps: int, rep: int, pairs_file: Path) -> dict:
    out = bench / "work" / "runs" / f"trl_{row}_{size}_{rep}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    spec = {
        "trainer": ROWS[row][1],
        "lora": ROWS[row][2],
        "model_dir": str(bench / "work" / "assets" / f"llama-{size}"),
        "pairs": str(pairs_file),
        "steps": steps,
        "out_dir": str(out),
    }
    (out / "spec.json").write_text(json.dumps(spec))
    command = [sys.executable, str(Path(__file__).resolve()), "--trl-worker", str(out / "spec.json")]
    log = bench / "work" / "logs" / f"{out.name}.log"
    status, tail, peak_mib = common._run_process(command, bench, _env(bench), log)
    if status != 0:
        print(tail, file=sys.stderr)
        raise SystemExit(f"TRL {row} {size} failed with exit status {status} (log: {log})")
    timestamps = [json.loads(line)["t"] for line in (out / "steps.jsonl").read_text().splitlines()]
    batches = json.loads((out / "batches.json").read_text())
    pairs, seconds = _window(timestamps)
    return {
        "pairs_per_second": pairs / seconds,
        "peak_rss_mib": peak_mib,
        "steps": len(timestamps),
        "pairs_timed": pairs,
        "batches": batches,
    }


def _check_data(run: dict, system: str, expected: list[tuple[int, int]]) -> str:
    """One line comparing a run's data with the pre-tokenised pairs; raises when TRL's batches differ."""
    lengths = [length for length, _ in expected]
    line = (
        f"  {system}: {run['steps']} steps, {run['pairs_timed']} pairs timed; padded lengths per step "
        f"{lengths} (expected)"
    )
    if "batches" in run:  # TRL: exact, from its collator
        seen = [(b["length"], b["tokens"]) for b in run["batches"][: len(expected)]]
        if seen != expected:
            raise SystemExit(f"TRL's batches differ from the pre-tokenised pairs: {seen} != {expected}")
        return line + "; TRL's collator: the same lengths and non-padding tokens"
    tokens = run["tokens_per_step"]
    worst = max(abs(t - e) / e for t, (_, e) in zip(tokens, expected[1:]))
    return line + f"; tune's logged non-padding tokens within {worst:.1%} of the expected (steps 2..N)"


# ------------------------------------------------------------------------------------------------ TRL's side


def _trl_worker(spec_path: Path) -> None:
    """Trains with TRL in this process (a fresh one per run) and writes per-step timestamps and batch shapes."""
    # tune's environment holds optional packages that transformers, PEFT and TRL import when present although these
    # runs do not use them (torchao ~10 MiB, wandb ~25 MiB of RSS); a plain TRL install lacks them, so hide them
    for name in ("torchao", "wandb"):
        sys.modules[name] = None
    import datasets
    import torch
    import transformers
    from transformers import AutoTokenizer, TrainerCallback

    spec = json.loads(spec_path.read_text())
    out = Path(spec["out_dir"])
    rows = [json.loads(line) for line in Path(spec["pairs"]).read_text().splitlines()]
    steps_file = open(out / "steps.jsonl", "w")
    batches: list[dict] = []

    class StepTimes(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            steps_file.write(json.dumps({"step": state.global_step, "t": time.perf_counter()}) + "\n")
            steps_file.flush()

    class Recording:
        """TRL's collator, noting each batch's padded length and non-padding tokens (chosen and rejected rows)."""

        def __init__(self, collate, orpo: bool):
            self.collate, self.orpo = collate, orpo

        def __call__(self, examples):
            batch = self.collate(examples)
            if self.orpo:  # ORPOTrainer concatenates chosen and rejected, padded to the longer of the two
                length = max(batch["chosen_input_ids"].shape[1], batch["rejected_input_ids"].shape[1])
                tokens = batch["chosen_attention_mask"].sum() + batch["rejected_attention_mask"].sum()
            else:
                length, tokens = batch["input_ids"].shape[1], batch["attention_mask"].sum()
            batches.append({"length": int(length), "tokens": int(tokens)})
            return batch

    transformers.set_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(spec["model_dir"])  # ids come pre-tokenised; this gives pad/bos/eos
    tokenizer.pad_token = tokenizer.convert_ids_to_tokens(0)  # tune's Llama 2 tokenizer pads with id 0
    common_args = dict(
        output_dir=str(out / "trainer"),
        per_device_train_batch_size=BATCH_SIZE,
        gradient_accumulation_steps=1,
        max_steps=spec["steps"],
        learning_rate=LEARNING_RATE,
        lr_scheduler_type="cosine",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=0.0,  # no clipping (the harness configs: clip_grad_norm null)
        optim="adamw_torch_fused",
        bf16=False,  # TRL defaults to bf16 autocast; both systems train in fp32
        gradient_checkpointing=False,  # TRL's default is on; tune's side runs without activation checkpointing
        logging_strategy="no",
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
        seed=0,
        data_seed=0,
        use_cpu=True,
        dataloader_num_workers=0,
        dataloader_drop_last=True,
        train_sampling_strategy="sequential",  # the rows are in tune's sampler order already
        remove_unused_columns=False,
        disable_tqdm=True,
        max_length=MAX_SEQ_LEN,
    )
    peft_config = None
    if spec["trainer"] == "orpo":
        from trl.experimental.orpo import ORPOConfig, ORPOTrainer
        from trl.experimental.utils import DPODataCollatorWithPadding

        class PretokenizedORPOTrainer(ORPOTrainer):
            """ORPOTrainer on pairs tokenised already (its own row tokenisation, run in __init__, is skipped)."""

            def tokenize_row(self, feature, model=None):
                return {}

        def trl_row(r):  # TRL's tokenised columns: the prompt is the masked prefix of the chosen sequence
            prompt = next(i for i, label in enumerate(r["chosen_labels"]) if label != -100)
            return {
                "prompt_input_ids": r["chosen_input_ids"][:prompt],
                "prompt_attention_mask": [1] * prompt,
                **{
                    f"{side}_{key}": value
                    for side in ("chosen", "rejected")
                    for key, value in (
                        ("input_ids", r[f"{side}_input_ids"]),
                        ("attention_mask", [1] * len(r[f"{side}_input_ids"])),
                        ("labels", r[f"{side}_labels"]),
                    )
                },
            }

        model = transformers.LlamaForCausalLM.from_pretrained(spec["model_dir"], dtype=torch.float32)
        if spec["lora"]:
            from peft import LoraConfig

            peft_config = LoraConfig(
                r=8, lora_alpha=16, lora_dropout=0.0, bias="none", task_type="CAUSAL_LM", target_modules=LORA_TARGETS
            )
        trainer = PretokenizedORPOTrainer(
            model=model,
            args=ORPOConfig(beta=0.1, **common_args),
            train_dataset=datasets.Dataset.from_list([trl_row(r) for r in rows]),
            processing_class=tokenizer,
            data_collator=Recording(DPODataCollatorWithPadding(pad_token_id=0), orpo=True),
            peft_config=peft_config,
            callbacks=[StepTimes()],
        )
    else:
        from trl import RewardConfig, RewardTrainer
        from trl.trainer.reward_trainer import DataCollatorForPreference

        model = transformers.LlamaForSequenceClassification.from_pretrained(
            spec["model_dir"], num_labels=1, pad_token_id=0, dtype=torch.float32
        )
        if spec["lora"]:
            from peft import LoraConfig

            peft_config = LoraConfig(
                r=8, lora_alpha=16, lora_dropout=0.0, bias="none", task_type="SEQ_CLS", target_modules=LORA_TARGETS
            )
        dataset = datasets.Dataset.from_list(
            [{"chosen_ids": r["chosen_input_ids"], "rejected_ids": r["rejected_input_ids"]} for r in rows]
        )
        trainer = RewardTrainer(
            model=model,
            args=RewardConfig(**common_args),  # pads with the tokenizer's pad token (id 0)
            train_dataset=dataset,
            processing_class=tokenizer,
            data_collator=Recording(DataCollatorForPreference(pad_token_id=0), orpo=False),
            peft_config=peft_config,
            callbacks=[StepTimes()],
        )
    if len(trainer.train_dataset) != len(rows):
        raise SystemExit(f"TRL kept {len(trainer.train_dataset)} of {len(rows)} pairs")
    trainer.train()
    steps_file.close()
    (out / "batches.json").write_text(json.dumps(batches))


# ------------------------------------------------------------------------------------------------ the table


def _table(results: dict, rows: list[str], sizes: list[str], steps: dict, reps: int) -> tuple[str, list[dict]]:
    lines = [
        f"Preference training, batch {BATCH_SIZE} pairs, steps "
        + ", ".join(f"{s} {steps[s]}" for s in sizes)
        + f", {reps} rep(s); pairs/s over steps {WARMUP_STEPS + 1}..N, mean over reps; ratio = tune / TRL",
        "",
        "| system | recipe | size | pairs/s | pairs/s ratio | peak RSS MiB | RSS ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    records = []
    for size in sizes:
        for row in rows:
            means = {}
            for system in ("tune", "trl"):
                runs = results.get((row, size, system))
                if runs:
                    means[system] = {
                        key: statistics.mean(r[key] for r in runs) for key in ("pairs_per_second", "peak_rss_mib")
                    }
            for system, mean in means.items():
                peer = means.get("trl")
                speed, rss = "-", "-"
                if system == "tune" and peer:
                    speed = f"{mean['pairs_per_second'] / peer['pairs_per_second']:.2f}"
                    rss = f"{mean['peak_rss_mib'] / peer['peak_rss_mib']:.2f}"
                name = "tune" if system == "tune" else "TRL"
                lines.append(
                    f"| {name} | {row} | {size} | {mean['pairs_per_second']:.2f} | {speed} "
                    f"| {mean['peak_rss_mib']:,.0f} | {rss} |"
                )
                records.append(
                    {"system": system, "recipe": row, "size": size, **mean, "runs": results[(row, size, system)]}
                )
    return "\n".join(lines), records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--harness", type=Path, default=ROOT.parent / "shared" / "bench", help="the peer harness")
    parser.add_argument("--workdir", type=Path, default=ROOT / "benchmarks" / "results" / "preference")
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "preference.json")
    parser.add_argument("--sizes", default="small,medium", help="comma list of small, medium")
    parser.add_argument("--only", default=",".join(ROWS), help=f"comma list of {', '.join(ROWS)}")
    parser.add_argument("--systems", default="tune,trl", help="comma list of tune, trl")
    parser.add_argument("--steps", type=int, help=f"optimizer steps per run (default: {DEFAULT_STEPS})")
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--trl-worker", type=Path, help=argparse.SUPPRESS)  # one TRL run (what this script starts)
    args = parser.parse_args()
    if args.trl_worker:
        return _trl_worker(args.trl_worker)
    sizes, rows, systems = args.sizes.split(","), args.only.split(","), args.systems.split(",")
    unknown = [r for r in rows if r not in ROWS] + [s for s in systems if s not in ("tune", "trl")]
    if unknown:
        parser.error(f"unknown rows or systems {unknown}; rows: {', '.join(ROWS)}; systems: tune, trl")
    steps = {size: args.steps or DEFAULT_STEPS[size] for size in sizes}
    if min(steps.values()) <= WARMUP_STEPS + 1:
        parser.error(f"steps must be above {WARMUP_STEPS + 1}: the first {WARMUP_STEPS} steps are warm-up")
    bench = common._prepare(args.harness.resolve(), args.workdir.resolve(), sizes)
    pairs_file = _pretokenize(bench, _orpo_config(bench, sizes[0], lora=True))
    print(f"pairs: {sum(1 for _ in open(pairs_file))}, tokenised by tune once, in its sampler order: {pairs_file}")
    results: dict[tuple[str, str, str], list[dict]] = {}
    for rep in range(args.reps):
        for size in sizes:
            expected = _expected_batches(pairs_file, steps[size])
            for row in rows:
                for system in systems:
                    print(f"rep {rep + 1}: {system} {row} {size} ...", flush=True)
                    if system == "tune":
                        run = _run_tune(bench, row, size, steps[size], rep)
                    else:
                        run = _run_trl(bench, row, size, steps[size], rep, pairs_file)
                    print(_check_data(run, system, expected), flush=True)
                    results.setdefault((row, size, system), []).append(run)
    table, records = _table(results, rows, sizes, steps, args.reps)
    print(table)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({"steps": steps, "batch_size": BATCH_SIZE, "rows": records}, indent=2))
    args.output.with_suffix(".md").write_text(table + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
