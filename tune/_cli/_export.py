"""``tune export CHECKPOINT --format hf|gguf``: one model file (or directory) for an inference stack."""

import argparse
from pathlib import Path

from tune._cli._common import HelpFormatter, examples
from tune.config import TuneError

_DTYPES = ("f16", "bf16", "f32", "q8_0")


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "export",
        help="export a checkpoint as a merged Hugging Face model or a GGUF file",
        description=(
            "Export a run's checkpoint as one model for inference. CHECKPOINT is a run's output_dir (its newest\n"
            "complete checkpoint is exported), one of its step_N directories, or any Hugging Face model directory.\n"
            "A LoRA checkpoint saved with save_adapter_weights_only=True is merged into its base model.\n"
            "\n"
            "  --format hf    a Hugging Face directory: merged weights (safetensors), config.json, tokenizer,\n"
            "                 generation config and chat template; loads with AutoModelForCausalLM.from_pretrained\n"
            "  --format gguf  one GGUF file for llama.cpp, Ollama, LM Studio: weights, hyperparameters, tokenizer\n"
            "                 and chat template (needs `pip install 'tune[export]'`). Architectures (config.json\n"
            "                 model_type): llama (Llama 2/3/3.1/3.2/3.3, Code Llama), mistral, qwen2 (Qwen 2/2.5),\n"
            "                 qwen3, phi3 (Phi-3 without LongRoPE, Phi-4), gemma, gemma2"
        ),
        formatter_class=HelpFormatter,
        epilog=examples(
            "tune export /tmp/llama3_2_1B/lora_single_device --format gguf --dtype q8_0",
            "tune export /tmp/qwen2_5_0.5B/full/step_500 --format hf --out ~/models/my-qwen",
            "tune export /tmp/run/step_500 --format hf --base /tmp/Llama-3.2-1B-Instruct  # adapter-only save",
        ),
    )
    parser.add_argument(
        "checkpoint",
        metavar="CHECKPOINT",
        type=Path,
        help="a run's output_dir, a step_N directory or a Hugging Face model directory; e.g. /tmp/run/step_500",
    )
    parser.add_argument(
        "--format",
        required=True,
        choices=("hf", "gguf"),
        help="what to write: hf (a Hugging Face directory) or gguf (one file); e.g. --format gguf",
    )
    parser.add_argument(
        "--dtype",
        choices=_DTYPES,
        default=None,
        help="weight type: for gguf f16 (default), bf16, f32 or q8_0 (8-bit); for hf f16, bf16 or f32 "
        "(default: each weight's dtype as saved); e.g. --dtype q8_0",
    )
    parser.add_argument(
        "--out",
        type=Path,
        metavar="PATH",
        default=None,
        help="the directory (hf) or .gguf file to create (default: <checkpoint's parent>/exports/<name>-hf or "
        "<name>.<dtype>.gguf); e.g. --out ~/models/my-model.gguf",
    )
    parser.add_argument(
        "--base",
        type=Path,
        metavar="DIR",
        default=None,
        help="the base model of an adapter-only checkpoint (default: the directory its adapter_config.json or "
        "config.yaml names); e.g. --base /tmp/Llama-3.2-1B-Instruct",
    )


def run(args: argparse.Namespace) -> int:
    from tune.training import checkpointing

    checkpoint = checkpointing.resolve_checkpoint(args.checkpoint)
    if args.format == "hf" and args.dtype == "q8_0":
        raise TuneError("--dtype q8_0 is a GGUF type; --format hf writes f16, bf16 or f32 (or keeps the saved dtype)")
    dtype = args.dtype or ("f16" if args.format == "gguf" else None)
    out = args.out or _default_out(checkpoint, args.format, dtype)
    try:
        if args.format == "hf":
            path = checkpointing.export_hf(checkpoint, out, dtype=dtype, base_dir=args.base)
        else:
            path = checkpointing.export_gguf(checkpoint, out, dtype=dtype, base_dir=args.base)
    except ImportError as err:
        raise TuneError(str(err)) from None
    except KeyError as err:  # a config.json without a hyperparameter the export needs
        raise TuneError(f"{checkpoint}/config.json has no {err.args[0]!r}, which the export needs") from None
    print(f"Exported {checkpoint} to {path} ({_size(path)})")
    if args.format == "hf":
        for missing in checkpointing.missing_inference_files(path):
            print(f"note: no {missing} in {checkpoint} or its base model: add it to {path} by hand")
    return 0


def _default_out(checkpoint: Path, fmt: str, dtype: str | None) -> Path:
    name = checkpoint.resolve().name
    if fmt == "gguf":
        return checkpoint.resolve().parent / "exports" / f"{name}.{dtype}.gguf"
    return checkpoint.resolve().parent / "exports" / (f"{name}-hf-{dtype}" if dtype else f"{name}-hf")


def _size(path: Path) -> str:
    total = path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    for unit in ("B", "KB", "MB", "GB"):
        if total < 1024 or unit == "GB":
            return f"{total:.0f} {unit}" if unit == "B" else f"{total:.1f} {unit}"
        total /= 1024
    return f"{total:.1f} GB"
