"""Writes the shipped per-model configs under configs/<family>/ from the table below.

The YAML files are the source of truth once written (edit them directly; `tune validate` and
tests/test_configs.py check every one). This script exists so that adding a model size or changing a shared
default across families is one edit and one run:

    python tools/make_configs.py            # rewrite configs/<family>/*.yaml

Single-device configs (``<size>_<method>_single_device.yaml``) come from ``SIZES``; the multi-GPU ones
(``<size>_full.yaml``, ``<size>_lora.yaml``, for the distributed recipes) from ``DIST_SIZES``. A row names its
model builder; the Hugging Face repo to download is that builder's row of the family's ``MODEL_SIZES`` table
(``tune/models/<family>/_model_builders.py``) unless the row overrides it.
"""

import importlib
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the tables of this checkout, whichever tune is installed


def _model_sizes(family: str) -> dict:
    """The family's ``MODEL_SIZES`` table: builder name -> ``tune.models._common.ModelSize``."""
    return importlib.import_module(f"tune.models.{family}._model_builders").MODEL_SIZES


@dataclass
class Size:
    family: str  # tune.models.<family>
    size: str  # file-name size, e.g. "1B"
    builder: str  # model builder, e.g. "llama3_2_1b": a key of the family's MODEL_SIZES
    model_type: str  # checkpointer model_type (torchtune's names)
    tokenizer: str  # tune.models.<x>.<tokenizer builder>
    tokenizer_path: str  # relative to the download directory
    checkpoint_files: str | None  # a single file name, or None: read the safetensors index
    methods: tuple[str, ...]  # subset of full, lora, qlora
    big: bool = False  # >= 7B: activation checkpointing on, optimizer in backward for full fine-tuning
    extra_ignore: str = ""
    tokenizer_extra: dict = field(default_factory=dict)
    repo: str = ""  # Hugging Face repo id; empty: the one MODEL_SIZES gives the builder

    def __post_init__(self) -> None:
        table = _model_sizes(self.family)
        if self.builder not in table:
            raise ValueError(f"{self.builder} is not in MODEL_SIZES of tune/models/{self.family}/_model_builders.py")
        self.repo = self.repo or table[self.builder].repo


def _dl_dir(repo: str) -> str:
    return "/tmp/" + repo.split("/")[-1]


L2, L3 = "llama2.llama2_tokenizer", "llama3.llama3_tokenizer"
ORIG = "original/tokenizer.model"
SIZES = [
    Size("llama2", "7B", "llama2_7b", "LLAMA2", L2, "tokenizer.model", None, ("full", "lora", "qlora"), big=True),
    Size("llama2", "13B", "llama2_13b", "LLAMA2", L2, "tokenizer.model", None, ("lora", "qlora"), big=True),
    Size("llama2", "70B", "llama2_70b", "LLAMA2", L2, "tokenizer.model", None, ("qlora",), big=True),
    # Code Llama: a Llama 2 architecture read with the Llama 2 converter (torchtune's configs say LLAMA2 too)
    Size("code_llama2", "7B", "code_llama2_7b", "LLAMA2", L2, "tokenizer.model", None, ("full", "lora", "qlora"), big=True),
    Size("llama3", "8B", "llama3_8b", "LLAMA3", L3, ORIG, None, ("full", "lora", "qlora"), big=True, extra_ignore="original/consolidated.00.pth"),
    Size("llama3", "70B", "llama3_70b", "LLAMA3", L3, ORIG, None, ("qlora",), big=True, extra_ignore="original/consolidated*"),
    Size("llama3_1", "8B", "llama3_1_8b", "LLAMA3", L3, ORIG, None, ("full", "lora", "qlora"), big=True, extra_ignore="original/consolidated.00.pth"),
    Size("llama3_1", "70B", "llama3_1_70b", "LLAMA3", L3, ORIG, None, ("qlora",), big=True, extra_ignore="original/consolidated*"),
    Size("llama3_2", "1B", "llama3_2_1b", "LLAMA3_2", L3, ORIG, "model.safetensors", ("full", "lora", "qlora"), extra_ignore="original/consolidated.00.pth"),
    Size("llama3_2", "3B", "llama3_2_3b", "LLAMA3_2", L3, ORIG, None, ("full", "lora", "qlora"), extra_ignore="original/consolidated.00.pth"),
    Size("llama3_3", "70B", "llama3_3_70b", "LLAMA3", L3, ORIG, None, ("qlora",), big=True, extra_ignore="original/consolidated*"),
    # fine-tunes Mistral-7B-Instruct-v0.2, whose config.json (rope_theta 1e6, no sliding window) is not the v0.1
    # architecture mistral_7b builds (rope_base 1e4, sliding_window 4096); kept as shipped until that is settled
    Size("mistral", "7B", "mistral_7b", "MISTRAL", "mistral.mistral_tokenizer", "tokenizer.model", None, ("full", "lora", "qlora"), big=True, repo="mistralai/Mistral-7B-Instruct-v0.2"),
    Size("qwen2_5", "0.5B", "qwen2_5_0_5b", "QWEN2", "qwen2_5.qwen2_5_tokenizer", "tokenizer.json", "model.safetensors", ("full", "lora", "qlora")),
    Size("qwen2_5", "1.5B", "qwen2_5_1_5b_instruct", "QWEN2", "qwen2_5.qwen2_5_tokenizer", "tokenizer.json", "model.safetensors", ("full", "lora", "qlora")),
    Size("qwen2_5", "3B", "qwen2_5_3b", "QWEN2", "qwen2_5.qwen2_5_tokenizer", "tokenizer.json", None, ("full", "lora", "qlora")),
    Size("qwen2_5", "7B", "qwen2_5_7b_instruct", "QWEN2", "qwen2_5.qwen2_5_tokenizer", "tokenizer.json", None, ("full", "lora", "qlora"), big=True),
    Size("qwen2_5", "14B", "qwen2_5_14b_instruct", "QWEN2", "qwen2_5.qwen2_5_tokenizer", "tokenizer.json", None, ("lora", "qlora"), big=True),
    Size("qwen2_5", "32B", "qwen2_5_32b_instruct", "QWEN2", "qwen2_5.qwen2_5_tokenizer", "tokenizer.json", None, ("qlora",), big=True),
    Size("qwen2_5", "72B", "qwen2_5_72b_instruct", "QWEN2", "qwen2_5.qwen2_5_tokenizer", "tokenizer.json", None, ("qlora",), big=True),
    Size("qwen3", "0.6B", "qwen3_0_6b_instruct", "QWEN3", "qwen3.qwen3_tokenizer", "tokenizer.json", "model.safetensors", ("full", "lora", "qlora")),
    Size("qwen3", "1.7B", "qwen3_1_7b_instruct", "QWEN3", "qwen3.qwen3_tokenizer", "tokenizer.json", None, ("full", "lora", "qlora")),
    Size("qwen3", "4B", "qwen3_4b_instruct", "QWEN3", "qwen3.qwen3_tokenizer", "tokenizer.json", None, ("full", "lora", "qlora")),
    Size("qwen3", "8B", "qwen3_8b_instruct", "QWEN3", "qwen3.qwen3_tokenizer", "tokenizer.json", None, ("full", "lora", "qlora"), big=True),
    Size("qwen3", "14B", "qwen3_14b_instruct", "QWEN3", "qwen3.qwen3_tokenizer", "tokenizer.json", None, ("lora", "qlora"), big=True),
    Size("qwen3", "32B", "qwen3_32b", "QWEN3", "qwen3.qwen3_tokenizer", "tokenizer.json", None, ("qlora",), big=True),
    Size("gemma2", "2B", "gemma2_2b", "GEMMA2", "gemma2.gemma2_tokenizer", "tokenizer.model", None, ("full", "lora", "qlora")),
    Size("gemma2", "9B", "gemma2_9b", "GEMMA2", "gemma2.gemma2_tokenizer", "tokenizer.model", None, ("full", "lora", "qlora"), big=True),
    Size("gemma2", "27B", "gemma2_27b", "GEMMA2", "gemma2.gemma2_tokenizer", "tokenizer.model", None, ("lora", "qlora"), big=True),
    Size("phi3", "mini", "phi3_mini", "PHI3_MINI", "phi3.phi3_mini_tokenizer", "tokenizer.model", None, ("full", "lora", "qlora")),
]

RECIPE = {"full": "full_finetune_single_device", "lora": "lora_finetune_single_device", "qlora": "lora_finetune_single_device"}


def _header(s: Size, method: str) -> str:
    what = {"full": "full fine-tuning", "lora": "LoRA fine-tuning", "qlora": "QLoRA fine-tuning (NF4 base weights)"}[method]
    ignore = f" --ignore-patterns \"{s.extra_ignore}\"" if s.extra_ignore else ""
    name = f"{s.family}/{s.size}_{method}_single_device"
    return (
        f"# {what} of {s.repo} on one device, with {RECIPE[method]}.py.\n"
        "#\n"
        "# Download the model first:\n"
        f"#   tune download {s.repo} --output-dir {_dl_dir(s.repo)}{ignore}\n"
        "#\n"
        "# Then run:\n"
        f"#   tune run {RECIPE[method]} --config {name}\n"
        "#\n"
        "# Any key can be overridden on the command line, e.g. batch_size=8 dataset.packed=True.\n\n"
    )


def _model(s: Size, method: str) -> str:
    if method == "full":
        return f"model:\n  _component_: tune.models.{s.family}.{s.builder}\n"
    prefix = "qlora_" if method == "qlora" else "lora_"
    rank, alpha = (8, 16) if s.big else (64, 128)
    return (
        "model:\n"
        f"  _component_: tune.models.{s.family}.{prefix}{s.builder}\n"
        "  lora_attn_modules: ['q_proj', 'v_proj', 'output_proj']\n"
        "  apply_lora_to_mlp: True\n"
        "  apply_lora_to_output: False\n"
        f"  lora_rank: {rank}  # higher rank: more capacity, more memory\n"
        f"  lora_alpha: {alpha}  # the update is scaled by lora_alpha / lora_rank\n"
        "  lora_dropout: 0.0\n"
    )


def _checkpointer(s: Size, method: str) -> str:
    files = f"[{s.checkpoint_files}]" if s.checkpoint_files else "null  # null: every shard listed in model.safetensors.index.json"
    adapter = "  adapter_checkpoint: null\n" if method != "full" else ""
    return (
        "checkpointer:\n"
        "  _component_: tune.training.FullModelHFCheckpointer\n"
        f"  checkpoint_dir: {_dl_dir(s.repo)}\n"
        f"  checkpoint_files: {files}\n"
        f"{adapter}"
        "  recipe_checkpoint: null\n"
        "  output_dir: ${output_dir}\n"
        f"  model_type: {s.model_type}\n"
        "resume_from_checkpoint: False\n"
    )


# tokenizer builders whose torchtune name gives torchtune's tokens: tune's configs name the Hugging Face chat format
_HF_FORMATS = {
    L2: "tune.data.Llama2ChatFormat",
    L3: "tune.data.Llama3ChatFormat",
    "mistral.mistral_tokenizer": "tune.data.MistralChatFormat",
    "qwen2.qwen2_tokenizer": "tune.data.Qwen2ChatFormat",
    "qwen2_5.qwen2_5_tokenizer": "tune.data.Qwen2_5ChatFormat",
    "gemma.gemma_tokenizer": "tune.data.GemmaChatFormat",
    "phi3.phi3_mini_tokenizer": "tune.data.Phi3ChatFormat",
    "phi4.phi4_tokenizer": "tune.data.Phi4ChatFormat",
}
_HF_FORMAT_NOTE = "# the Hugging Face chat template's tokens (torchtune's name gives torchtune's)"


def _tokenizer(s: Size, max_seq_len: str) -> str:
    """The tokenizer section; ``max_seq_len`` is the value with its comment, if any."""
    template = f"  prompt_template: {_HF_FORMATS[s.tokenizer]}  {_HF_FORMAT_NOTE}\n" if s.tokenizer in _HF_FORMATS else ""
    return (
        "tokenizer:\n"
        f"  _component_: tune.models.{s.tokenizer}\n"
        + template
        + f"  path: {_dl_dir(s.repo)}/{s.tokenizer_path}\n"
        f"  max_seq_len: {max_seq_len}\n\n"
    )


def _tokenizer_checkpointer_dataset(s: Size, method: str) -> str:
    # the part every config shares, from the tokenizer to the dataset (which the caller's lines continue)
    out = _tokenizer(s, "2048")
    out += _checkpointer(s, method)
    if method != "full":
        out += "save_adapter_weights_only: False  # True: write only the PEFT adapter, not the merged model\n"
    return out + (
        "save_every_n_steps: null  # null: save at the end of each epoch only\n"
        "keep_last_n_checkpoints: null\n\n"
        "dataset:\n"
        "  _component_: tune.datasets.alpaca_cleaned_dataset\n"
        "  packed: False  # True packs samples into max_seq_len sequences: faster, same loss\n"
        "# batches: padded to the longest sample (packs, when the dataset is packed, get their block-causal mask);\n"
        "# on CPU, tune.data.padding_free_collate puts each batch in one row with no padding\n"
        "collate_fn: tune.data.padded_collate_sft\n"
    )


def render(s: Size, method: str) -> str:
    full = method == "full"
    lr = "2e-5" if full else "3e-4"
    batch = 2 if s.big else 4
    accumulate = 8 if s.big else 4
    opt_in_bwd = full and s.big
    out = _header(s, method)
    out += f"output_dir: /tmp/tune/{s.family}_{s.size}/{method}_single_device\n\n"
    out += _model(s, method) + "\n"
    out += _tokenizer_checkpointer_dataset(s, method)
    out += (
        "seed: null\n"
        "shuffle: True\n"
        f"batch_size: {batch}\n\n"
        "optimizer:\n"
        "  _component_: torch.optim.AdamW\n"
        "  fused: True\n"
        f"  weight_decay: {'0.0' if full else '0.01'}\n"
        f"  lr: {lr}\n"
        "lr_scheduler:\n"
        "  _component_: tune.training.lr_schedulers.get_cosine_schedule_with_warmup\n"
        "  num_warmup_steps: 100\n"
        f"optimizer_in_bwd: {opt_in_bwd}  # True: step each parameter as its gradient is ready (saves memory; no clipping or accumulation)\n"
        "loss:\n"
        "  _component_: tune.modules.loss.LinearCrossEntropyLoss\n\n"
        "epochs: 1\n"
        "max_steps_per_epoch: null\n"
        f"gradient_accumulation_steps: {1 if opt_in_bwd else accumulate}\n"
        "clip_grad_norm: null\n"
        "compile: False  # torch.compile the model and loss: faster steps after a slower first one\n\n"
        "metric_logger:\n"
        "  _component_: tune.training.metric_logging.DiskLogger\n"
        "  log_dir: ${output_dir}/logs\n"
        "log_every_n_steps: 1\n"
        "log_peak_memory_stats: True\n\n"
        "device: cuda\n"
        "dtype: bf16\n\n"
        f"enable_activation_checkpointing: {s.big or full}\n"
        "enable_activation_offloading: False\n\n"
        "profiler:\n"
        "  _component_: tune.training.setup_torch_profiler\n"
        "  enabled: False\n"
    )
    return out


# ---------------------------------------------------------------------------------------------- distributed
# Multi-GPU configs (<family>/<size>_full.yaml, <size>_lora.yaml) for the sizes of 8B and up, run by
# full_finetune_distributed.py and lora_finetune_distributed.py with torchrun.

DIST_SIZES = [
    ("llama2", "13B"), ("llama2", "70B"),
    ("llama3", "8B"), ("llama3", "70B"),
    ("llama3_1", "8B"), ("llama3_1", "70B"),
    ("llama3_3", "70B"),
    ("qwen2_5", "14B"), ("qwen2_5", "32B"), ("qwen2_5", "72B"),
    ("qwen3", "8B"), ("qwen3", "14B"), ("qwen3", "32B"),
    ("gemma2", "9B"), ("gemma2", "27B"),
]
DIST_METHODS = ("full", "lora")
DIST_RECIPE = {"full": "full_finetune_distributed", "lora": "lora_finetune_distributed"}
# families whose registry entry has a tensor-parallel plan (tune/models/_parallel.py)
TP_FAMILIES = {"llama2", "llama3", "llama3_1", "llama3_2", "llama3_3", "mistral", "qwen2_5", "qwen3"}
NUM_GPUS = 8


def _size_in_billions(s: Size) -> float:
    return float(s.size.rstrip("B"))


def _dist_header(s: Size, method: str) -> str:
    what = {"full": "Full fine-tuning", "lora": "LoRA fine-tuning"}[method]
    ignore = f" --ignore-patterns \"{s.extra_ignore}\"" if s.extra_ignore else ""
    name = f"{s.family}/{s.size}_{method}"
    recipe = DIST_RECIPE[method]
    return (
        f"# {what} of {s.repo} on {NUM_GPUS} GPUs (FSDP2), with {recipe}.py.\n"
        "#\n"
        "# Download the model first:\n"
        f"#   tune download {s.repo} --output-dir {_dl_dir(s.repo)}{ignore}\n"
        "#\n"
        "# Then run, on one node:\n"
        f"#   tune run --nproc_per_node {NUM_GPUS} {recipe} --config {name}\n"
        "# or on several (docs/distributed.md; docs/slurm_multinode.sbatch for SLURM):\n"
        f"#   tune run --nnodes 2 --nproc_per_node {NUM_GPUS} --rdzv_backend c10d --rdzv_endpoint HOST:29500 \\\n"
        f"#       {recipe} --config {name}\n"
        "#\n"
        "# batch_size is per GPU. Any key can be overridden on the command line, e.g. batch_size=4.\n\n"
    )


def _parallelism(s: Size, method: str) -> str:
    # 70B+ full fine-tuning needs ~16 bytes per parameter (bf16 weights and gradients, fp32-sized AdamW
    # states): more than 8 x 80 GB holds next to activations, so the shards live in CPU memory
    offload = method == "full" and _size_in_billions(s) >= 70
    if s.family in TP_FAMILIES and method == "full":
        tp = "tensor_parallel_dim: 1  # >1 splits every layer over this many GPUs of a node; must divide the GPU count\n"
    else:
        tp = "tensor_parallel_dim: 1  # tensor parallelism: full fine-tuning of the llama and qwen families only\n"
    return (
        tp
        + f"fsdp_cpu_offload: {offload}  # True: keep sharded weights, gradients and optimizer states in CPU memory\n"
        "fsdp_reshard_after_forward: True  # False: keep each layer gathered until backward (faster, more memory)\n"
        "dist_backend: null  # null: nccl on GPU (gloo for CPU-side state), gloo on CPU\n"
    )


def render_distributed(s: Size, method: str) -> str:
    full = method == "full"
    out = _dist_header(s, method)
    out += f"output_dir: /tmp/tune/{s.family}_{s.size}/{method}\n\n"
    out += _model(s, method) + "\n"
    out += _tokenizer_checkpointer_dataset(s, method)
    out += (
        "seed: null  # null: drawn on rank 0 and shared with every rank\n"
        "shuffle: True\n"
        "batch_size: 2  # per GPU: the global batch is batch_size x GPUs / tensor_parallel_dim x accumulation\n\n"
        "optimizer:\n"
        "  _component_: torch.optim.AdamW\n"
        "  fused: True\n"
        f"  weight_decay: {'0.0' if full else '0.01'}\n"
        f"  lr: {'2e-5' if full else '3e-4'}\n"
        "lr_scheduler:\n"
        "  _component_: tune.training.lr_schedulers.get_cosine_schedule_with_warmup\n"
        "  num_warmup_steps: 100\n"
        "loss:\n"
        "  _component_: tune.modules.loss.LinearCrossEntropyLoss\n\n"
        "epochs: 1\n"
        "max_steps_per_epoch: null\n"
        "gradient_accumulation_steps: 1\n"
        "clip_grad_norm: null\n"
        "compile: False  # torch.compile each layer and the loss: faster steps after a slower first one\n\n"
    )
    out += _parallelism(s, method) + "\n"
    out += (
        "metric_logger:\n"
        "  _component_: tune.training.metric_logging.DiskLogger\n"
        "  log_dir: ${output_dir}/logs\n"
        "log_every_n_steps: 1\n"
        "log_peak_memory_stats: True\n\n"
        "device: cuda\n"
        "dtype: bf16\n\n"
        "enable_activation_checkpointing: True\n"
        "enable_activation_offloading: False\n\n"
        "profiler:\n"
        "  _component_: tune.training.setup_torch_profiler\n"
        "  enabled: False\n"
    )
    return out


# ---------------------------------------------------------------------------------------------------- DPO
# One LoRA DPO config per family (<family>/<size>_lora_dpo_single_device.yaml, QLoRA for a 70B-only family), run by
# lora_dpo_single_device.py: torchtune's llama2/7B and llama3_1/8B settings (stack_exchange_paired, lr 5e-4, weight
# decay 0.05, 1000 steps, max_seq_len 1024), the family's smallest instruct size where it has several.

DPO_SIZES = [
    ("llama2", "7B", "lora"), ("code_llama2", "7B", "lora"), ("llama3", "8B", "lora"), ("llama3_1", "8B", "lora"),
    ("llama3_2", "1B", "lora"), ("llama3_3", "70B", "qlora"), ("mistral", "7B", "lora"), ("qwen2_5", "1.5B", "lora"),
    ("qwen3", "1.7B", "lora"), ("gemma2", "2B", "lora"), ("phi3", "mini", "lora"),
]
DPO_RECIPE = "lora_dpo_single_device"


# Multi-GPU DPO configs (<family>/<size>_lora_dpo.yaml, <size>_full_dpo.yaml: torchtune's names), run by
# lora_dpo_distributed.py and full_dpo_distributed.py: torchtune's llama2/7B_lora_dpo, llama3_1/8B_lora_dpo and
# llama3_1/8B_full_dpo settings (full: lr 2e-5, beta 0.05, 20 warmup steps), and one of each for the other families
# that ship multi-GPU configs, at their size nearest 8B (LoRA only at 70B: full DPO keeps a second full copy).
DPO_DIST_SIZES = [
    ("llama2", "7B", "lora"), ("llama3", "8B", "lora"), ("llama3", "8B", "full"), ("llama3_1", "8B", "lora"),
    ("llama3_1", "8B", "full"), ("llama3_3", "70B", "lora"), ("qwen2_5", "7B", "lora"), ("qwen2_5", "7B", "full"),
    ("qwen3", "8B", "lora"), ("qwen3", "8B", "full"), ("gemma2", "9B", "lora"), ("gemma2", "9B", "full"),
]
DPO_DIST_RECIPE = {"lora": "lora_dpo_distributed", "full": "full_dpo_distributed"}


def _dpo_header(s: Size, method: str, distributed: bool = False) -> str:
    what = {"lora": "LoRA", "qlora": "QLoRA (NF4 base weights)", "full": "Full"}[method]
    ignore = f" --ignore-patterns \"{s.extra_ignore}\"" if s.extra_ignore else ""
    name = f"{s.family}/{s.size}_{method}_dpo{'' if distributed else '_single_device'}"
    recipe = DPO_DIST_RECIPE[method] if distributed else DPO_RECIPE
    where = f"on {NUM_GPUS} GPUs (FSDP2)" if distributed else "on one device"
    run = f"tune run --nproc_per_node {NUM_GPUS} {recipe}" if distributed else f"tune run {recipe}"
    return (
        f"# {what} DPO (direct preference optimization) of {s.repo} {where}, with {recipe}.py.\n"
        "#\n"
        "# Download the model first:\n"
        f"#   tune download {s.repo} --output-dir {_dl_dir(s.repo)}{ignore}\n"
        "#\n"
        "# Then run:\n"
        f"#   {run} --config {name}\n"
        "#\n"
        + ("# batch_size is pairs per GPU. " if distributed else "# ")
        + "Any key can be overridden on the command line, e.g. loss.beta=0.05 loss.loss_type=ipo.\n\n"
    )


def _ref_checkpointer(s: Size) -> str:
    # full DPO's frozen reference (torchtune's key): the starting weights, read again on every (re)start
    return _checkpointer(s, "full").replace("checkpointer:\n", "ref_checkpointer:  # the reference model: always the starting weights\n", 1).replace("resume_from_checkpoint: False\n", "")


def render_dpo(s: Size, method: str, distributed: bool = False) -> str:
    full = method == "full"
    out = _dpo_header(s, method, distributed)
    name = f"{method}_dpo" if distributed else f"{method}_dpo_single_device"
    out += f"output_dir: /tmp/tune/{s.family}_{s.size}/{name}\n\n"
    out += _model(s, method) + "\n"
    out += _tokenizer(s, "1024  # per sequence: each pair is a chosen and a rejected sequence")
    out += _checkpointer(s, method)
    out += _ref_checkpointer(s) if full else "save_adapter_weights_only: False  # True: write only the PEFT adapter, not the merged model\n"
    out += (
        "save_every_n_steps: null  # null: save at the end of each epoch only\n"
        "keep_last_n_checkpoints: null\n\n"
        "dataset:\n"
        "  _component_: tune.datasets.stack_exchange_paired_dataset\n"
        "# batches: the chosen sequences, then the rejected ones, padded to the longest (pairs are not packed)\n"
        "collate_fn: tune.data.padded_collate_dpo\n"
        "seed: null\n"
        "shuffle: True\n"
        f"batch_size: {4 if distributed or not s.big else 2}  # pairs{' per GPU' if distributed else ''}\n\n"
        "optimizer:\n"
        "  _component_: torch.optim.AdamW\n"
        "  fused: True\n"
        "  weight_decay: 0.05\n"
        f"  lr: {'2e-5' if full else '5e-4'}\n"
        "lr_scheduler:\n"
        "  _component_: tune.training.lr_schedulers.get_cosine_schedule_with_warmup\n"
        f"  num_warmup_steps: {20 if full else 100}\n"
    )
    if not distributed:
        out += "optimizer_in_bwd: False  # True: step each parameter as its gradient is ready (saves memory; no clipping or accumulation)\n"
    reference = "the starting weights, ref_checkpointer" if full else "the model with adapters disabled"
    out += (
        "loss:\n"
        "  _component_: tune.rlhf.loss.DPOLoss  # tune.rlhf.loss.SimPOLoss: reference-free; RSOLoss: hinge\n"
        f"  beta: {0.05 if full else 0.1}  # higher keeps the policy closer to the reference ({reference})\n"
        "  label_smoothing: 0.0  # > 0: conservative DPO, as if each preference label were flipped with this probability\n"
        "  loss_type: sigmoid  # sigmoid (DPO), hinge, ipo (length-normalised) or robust\n\n"
        "epochs: 1\n"
        "max_steps_per_epoch: 1000\n"
        f"gradient_accumulation_steps: {8 if s.big or distributed else 4}\n"
        "clip_grad_norm: null\n"
        "compile: False  # torch.compile the model: faster steps after a slower first one\n\n"
    )
    if distributed:
        out += (
            "tensor_parallel_dim: 1  # the DPO recipes shard with FSDP2 only\n"
            "fsdp_cpu_offload: False  # True: keep sharded weights, gradients and optimizer states in CPU memory\n"
            "fsdp_reshard_after_forward: True  # False: keep each layer gathered until backward (faster, more memory)\n"
            "dist_backend: null  # null: nccl on GPU (gloo for CPU-side state), gloo on CPU\n\n"
        )
    out += (
        "metric_logger:\n"
        "  _component_: tune.training.metric_logging.DiskLogger\n"
        "  log_dir: ${output_dir}/logs\n"
        "log_every_n_steps: 1\n"
        "log_peak_memory_stats: True\n\n"
        "device: cuda\n"
        "dtype: bf16\n\n"
        f"enable_activation_checkpointing: {s.big or distributed}\n"
        "enable_activation_offloading: False\n\n"
        "profiler:\n"
        "  _component_: tune.training.setup_torch_profiler\n"
        "  enabled: False\n"
    )
    return out


def write_dpo_distributed_configs() -> int:
    by_name = {(s.family, s.size): s for s in SIZES}
    for family, size, method in DPO_DIST_SIZES:
        path = ROOT / "configs" / family / f"{size}_{method}_dpo.yaml"
        path.write_text(render_dpo(by_name[family, size], method, distributed=True))
    return len(DPO_DIST_SIZES)


def main() -> None:
    written = 0
    for s in SIZES:
        for method in s.methods:
            path = ROOT / "configs" / s.family / f"{s.size}_{method}_single_device.yaml"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(render(s, method))
            written += 1
    by_name = {(s.family, s.size): s for s in SIZES}
    for family, size in DIST_SIZES:
        for method in DIST_METHODS:
            path = ROOT / "configs" / family / f"{size}_{method}.yaml"
            path.write_text(render_distributed(by_name[family, size], method))
            written += 1
    for family, size, method in DPO_SIZES:
        path = ROOT / "configs" / family / f"{size}_{method}_dpo_single_device.yaml"
        path.write_text(render_dpo(by_name[family, size], method))
        written += 1
    print(f"wrote {written} configs")


# ------------------------------------------------------------------------------------- knowledge distillation
# <teacher>_to_<student>_KD_lora_single_device.yaml (torchtune's names), run by knowledge_distillation_single_device.py:
# a LoRA student learns from a frozen teacher of the same vocabulary, usually a larger size of its family.

# (config folder, file-name sizes "<teacher>_to_<student>", teacher's SIZES row, student's SIZES row)
KD_PAIRS = [
    ("llama3_2", "8B_to_1B", ("llama3_1", "8B"), ("llama3_2", "1B")),  # torchtune's teacher: Llama 3.1 8B
    ("qwen2_5", "1.5_to_0.5B", ("qwen2_5", "1.5B"), ("qwen2_5", "0.5B")),
    ("qwen3", "1.7_to_0.6B", ("qwen3", "1.7B"), ("qwen3", "0.6B")),
    ("gemma2", "9B_to_2B", ("gemma2", "9B"), ("gemma2", "2B")),
]
KD_RECIPE = "knowledge_distillation_single_device"
# the same pairs for several GPUs (<teacher>_to_<student>_KD_lora_distributed.yaml), run by
# knowledge_distillation_distributed.py: the student and the teacher both sharded with FSDP2
KD_DIST_RECIPE = "knowledge_distillation_distributed"


def _download_line(s: Size) -> str:
    ignore = f" --ignore-patterns \"{s.extra_ignore}\"" if s.extra_ignore else ""
    return f"#   tune download {s.repo} --output-dir {_dl_dir(s.repo)}{ignore}\n"


def render_kd(folder: str, sizes: str, teacher: Size, student: Size, distributed: bool = False) -> str:
    kind = "KD_lora_distributed" if distributed else "KD_lora_single_device"
    name = f"{folder}/{sizes}_{kind}"
    recipe = KD_DIST_RECIPE if distributed else KD_RECIPE
    files = f"[{teacher.checkpoint_files}]" if teacher.checkpoint_files else "null  # null: every shard listed in model.safetensors.index.json"
    out = (
        f"# Knowledge distillation {'on several GPUs (FSDP2)' if distributed else 'on one device'}, with {recipe}.py: a LoRA student,\n"
        f"# {student.repo}, learns from a frozen teacher, {teacher.repo}.\n"
        "#\n"
        "# Download the student and the teacher first:\n"
        f"{_download_line(student)}{_download_line(teacher)}"
        "#\n"
        "# Distillation works best from a teacher already fine-tuned on the same data, e.g. with\n"
        f"#   tune run lora_finetune_single_device --config {teacher.family}/{teacher.size}_lora_single_device\n"
        "# and teacher_checkpointer.checkpoint_dir pointed at its merged output.\n"
        "#\n"
        "# Then run:\n"
        f"#   tune run {'--nproc_per_node 2 ' if distributed else ''}{recipe} --config {name}\n"
        "#\n"
        f"# {'batch_size is per GPU. ' if distributed else ''}Any key can be overridden on the command line, e.g. kd_ratio=0.8 batch_size=8.\n\n"
    )
    out += f"output_dir: /tmp/tune/{folder}_{sizes}/{kind}\n\n"
    out += _model(student, "lora") + "\n"
    out += (
        "# the frozen teacher: any model with the student's vocabulary\n"
        "teacher_model:\n"
        f"  _component_: tune.models.{teacher.family}.{teacher.builder}\n"
        "teacher_checkpointer:\n"
        "  _component_: tune.training.FullModelHFCheckpointer\n"
        f"  checkpoint_dir: {_dl_dir(teacher.repo)}\n"
        f"  checkpoint_files: {files}\n"
        "  recipe_checkpoint: null\n"
        "  output_dir: ${output_dir}\n"
        f"  model_type: {teacher.model_type}\n\n"
    )
    out += _tokenizer_checkpointer_dataset(student, "lora")
    out += (
        "seed: null\n"
        "shuffle: True\n"
        "batch_size: 4\n\n"
        "optimizer:\n"
        "  _component_: torch.optim.AdamW\n"
        "  fused: True\n"
        "  weight_decay: 0.01\n"
        "  lr: 3e-4\n"
        "lr_scheduler:\n"
        "  _component_: tune.training.lr_schedulers.get_cosine_schedule_with_warmup\n"
        "  num_warmup_steps: 100\n"
    )
    if not distributed:
        out += "optimizer_in_bwd: False  # True: step each parameter as its gradient is ready (no clipping or accumulation)\n"
    out += (
        "loss:  # the student's cross-entropy against the labels\n"
        "  _component_: tune.modules.loss.CEWithChunkedOutputLoss\n"
        "kd_loss:  # the divergence from the teacher: ReverseKL, SymmetricKL and GeneralizedJSD variants exist too\n"
        "  _component_: tune.modules.loss.ForwardKLWithChunkedOutputLoss\n"
        "kd_ratio: 0.5  # loss = (1 - kd_ratio) * loss + kd_ratio * kd_loss\n\n"
        "epochs: 1\n"
        "max_steps_per_epoch: null\n"
        "gradient_accumulation_steps: 8\n"
        "clip_grad_norm: null\n"
        "compile: False  # torch.compile the models and losses: faster steps after a slower first one\n\n"
    )
    if distributed:
        out += (
            "tensor_parallel_dim: 1  # LoRA layers are sharded with FSDP2 only\n"
            "fsdp_cpu_offload: False  # True: keep sharded weights, gradients and optimizer states in CPU memory\n"
            "fsdp_reshard_after_forward: True  # False: keep each layer gathered until backward (faster, more memory)\n"
            "dist_backend: null  # null: nccl on GPU (gloo for CPU-side state), gloo on CPU\n\n"
        )
    out += (
        "metric_logger:\n"
        "  _component_: tune.training.metric_logging.DiskLogger\n"
        "  log_dir: ${output_dir}/logs\n"
        "log_every_n_steps: 1\n"
        "log_peak_memory_stats: True\n\n"
        "device: cuda\n"
        "dtype: bf16\n\n"
        "enable_activation_checkpointing: False\n"
        "enable_activation_offloading: False\n\n"
        "profiler:\n"
        "  _component_: tune.training.setup_torch_profiler\n"
        "  enabled: False\n"
    )
    return out


def write_kd_configs() -> int:
    by_name = {(s.family, s.size): s for s in SIZES}
    for folder, sizes, teacher, student in KD_PAIRS:
        path = ROOT / "configs" / folder / f"{sizes}_KD_lora_single_device.yaml"
        path.write_text(render_kd(folder, sizes, by_name[teacher], by_name[student]))
        path = ROOT / "configs" / folder / f"{sizes}_KD_lora_distributed.yaml"
        path.write_text(render_kd(folder, sizes, by_name[teacher], by_name[student], distributed=True))
    return 2 * len(KD_PAIRS)


# ---------------------------------------------------------------------------------------------------- GRPO
# <family>/<size>_{full,lora}_grpo_single_device.yaml, run by grpo_full_finetune_single_device.py and
# grpo_lora_finetune_single_device.py: GSM8K prompts, the answer and format rewards, for the small instruct sizes;
# and <family>/<size>_full_grpo.yaml (torchtune's dev name) for grpo_full_finetune_distributed.py on several GPUs.
GRPO_SIZES = [("llama3_2", "1B"), ("qwen2_5", "1.5B"), ("qwen3", "0.6B")]
GRPO_RECIPE = {"full": "grpo_full_finetune_single_device", "lora": "grpo_lora_finetune_single_device"}
GRPO_DIST_SIZES = [("llama3_2", "3B"), ("qwen2_5", "3B"), ("qwen3", "4B")]
GRPO_DIST_RECIPE = "grpo_full_finetune_distributed"


def render_grpo(s: Size, method: str, distributed: bool = False) -> str:
    kind = f"{method}_grpo" if distributed else f"{method}_grpo_single_device"
    name = f"{s.family}/{s.size}_{kind}"
    recipe = GRPO_DIST_RECIPE if distributed else GRPO_RECIPE[method]
    where = f"on several GPUs (FSDP2), with {recipe}.py" if distributed else f"on one device, with {recipe}.py"
    launch = "--nproc_per_node 8 " if distributed else ""
    reference = "a frozen copy of the starting model" if method == "full" else "the model with adapters disabled"
    out = (
        f"# GRPO (group relative policy optimization) of {s.repo} {where}:\n"
        "# GSM8K math problems, rewarded for the right final answer and for the <think>/<answer> format.\n"
        "#\n"
        "# Download the model first:\n"
        f"{_download_line(s)}"
        "#\n"
        "# Then run:\n"
        f"#   tune run {launch}{recipe} --config {name}\n"
        "#\n"
        f"# {'batch_size is per GPU. ' if distributed else ''}Any key can be overridden on the command line, e.g. grpo_samples=8 loss.beta=0.04 loss.loss_type=dr_grpo.\n\n"
    )
    out += f"output_dir: /tmp/tune/{s.family}_{s.size}/{kind}\n\n"
    out += _model(s, method) + "\n"
    out += _tokenizer(s, "1024")
    out += _checkpointer(s, method)
    if method != "full":
        out += "save_adapter_weights_only: False  # True: write only the PEFT adapter, not the merged model\n"
    out += (
        "save_every_n_steps: null  # null: save at the end of each epoch only\n"
        "keep_last_n_checkpoints: null\n\n"
        "dataset:\n"
        "  _component_: tune.datasets.gsm8k_dataset  # tune.datasets.prompt_dataset: your own prompts and answers\n"
        "seed: null\n"
        "shuffle: True\n"
        "batch_size: 4  # prompts per step\n\n"
        "# each a _component_ (built with its arguments) or the dotted path of a function (prompts, completions, **row)\n"
        "reward_functions:\n"
        "  - _component_: tune.rlhf.AnswerReward  # 1 when the final answer equals the row's answer\n"
        "  - _component_: tune.rlhf.FormatReward  # 1 for <think>...</think><answer>...</answer>\n"
        "reward_weights: [1.0, 0.2]\n\n"
        "grpo_samples: 8  # completions per prompt: the group whose rewards the advantages are normalised in\n"
        "ppo_epochs: 1  # optimizer steps per batch of completions; > 1 reuses them, the loss clips the ratio\n"
        "forward_batch_size: 8  # completions per generation and per training micro-batch\n"
        "max_generated_tokens: 512\n"
        "temperature: 1.0\n"
        "top_k: null\n\n"
        "optimizer:\n"
        "  _component_: torch.optim.AdamW\n"
        "  fused: True\n"
        "  weight_decay: 0.0\n"
        f"  lr: {'1e-6' if method == 'full' else '2e-5'}\n"
        "lr_scheduler:\n"
        "  _component_: tune.training.lr_schedulers.get_cosine_schedule_with_warmup\n"
        "  num_warmup_steps: 10\n"
        "loss:\n"
        "  _component_: tune.rlhf.loss.GRPOLoss\n"
        "  epsilon: 0.2  # the ratio to the sampling policy is clipped to [1 - epsilon, 1 + epsilon_high]\n"
        "  epsilon_high: null  # null: epsilon; 0.28: DAPO's clip-higher\n"
        f"  beta: 0.0  # > 0: k3 KL penalty to the reference ({reference}); 0 runs no reference\n"
        "  loss_type: grpo  # grpo (per-completion mean), bnpo / dapo (per-token mean), dr_grpo (constant divisor)\n"
        "  max_completion_length: ${max_generated_tokens}  # dr_grpo's divisor\n\n"
        "epochs: 1\n"
        "max_steps_per_epoch: 500\n"
        "gradient_accumulation_steps: 1  # GRPO splits a step's completions by forward_batch_size instead\n"
        "clip_grad_norm: 1.0\n\n"
        "metric_logger:\n"
        "  _component_: tune.training.metric_logging.DiskLogger\n"
        "  log_dir: ${output_dir}/logs\n"
        "log_every_n_steps: 1\n"
        "log_peak_memory_stats: True\n\n"
        "device: cuda\n"
        "dtype: bf16\n\n"
        f"enable_activation_checkpointing: {method == 'full'}\n"
        "enable_activation_offloading: False\n\n"
    )
    if distributed:
        out += (
            "fsdp_cpu_offload: False  # True: keep sharded weights, gradients and optimizer states in CPU memory\n"
            "fsdp_reshard_after_forward: True  # False: keep each layer gathered until backward (faster, more memory)\n"
            "dist_backend: null  # null: nccl on GPU (gloo for CPU-side state), gloo on CPU\n\n"
        )
    out += (
        "profiler:\n"
        "  _component_: tune.training.setup_torch_profiler\n"
        "  enabled: False\n"
    )
    return out


def write_grpo_configs() -> int:
    by_name = {(s.family, s.size): s for s in SIZES}
    for family, size in GRPO_SIZES:
        for method in GRPO_RECIPE:
            path = ROOT / "configs" / family / f"{size}_{method}_grpo_single_device.yaml"
            path.write_text(render_grpo(by_name[family, size], method))
    for family, size in GRPO_DIST_SIZES:
        path = ROOT / "configs" / family / f"{size}_full_grpo.yaml"
        path.write_text(render_grpo(by_name[family, size], "full", distributed=True))
    return len(GRPO_SIZES) * len(GRPO_RECIPE) + len(GRPO_DIST_SIZES)


# -------------------------------------------------------------------------------------------------- vision
# Vision-language fine-tuning on image+text conversations (the_cauldron's OCR-VQA subset, as torchtune's
# llama3_2_vision configs), single device (<size>_<method>_single_device.yaml) and on several GPUs (<size>_<method>.yaml,
# LoRA and QLoRA through lora_finetune_distributed.py). The model trains its vision encoder and the fusion parts (the
# projector, or Llama 3.2 Vision's cross-attention layers) and keeps the language model frozen, as torchtune's
# configs do; LoRA configs put adapters on both.


@dataclass
class VisionSize:
    family: str
    size: str
    builder: str
    model_type: str
    transform: str  # the family's model transform builder (tokenizer + images)
    tokenizer_path: str
    collate: str
    single: tuple[str, ...]  # methods with a single-device config
    distributed: tuple[str, ...]  # methods with a multi-GPU config
    fusion: str = "the projector"  # what fusion_trainable covers, in words
    image_size: int | None = None  # Llama 3.2 Vision's tile size, which the model and the transform share
    tokenizer_extra: str = ""  # more tokenizer lines
    # what trains, as (decoder, encoder, fusion): the family's common practice (Llama 3.2 Vision: torchtune's)
    full_trainable: tuple[bool, bool, bool] = (True, False, True)
    lora_trainable: tuple[str, str, str] = ("lora", "frozen", "lora")
    repo: str = ""

    def __post_init__(self) -> None:
        table = _model_sizes(self.family)
        if self.builder not in table:
            raise ValueError(f"{self.builder} is not in MODEL_SIZES of tune/models/{self.family}/_model_builders.py")
        self.repo = self.repo or table[self.builder].repo


_TILED, _FLAT = "tune.data.padded_collate_tiled_images_and_mask", "tune.data.padded_collate_images"
_QWEN_PIXELS = "  max_pixels: 1003520  # at most 1280 image tokens an image (the release allows 16384)\n"
VISION_SIZES = [
    VisionSize(
        "llama3_2_vision",
        "11B",
        "llama3_2_vision_11b",
        "LLAMA3_VISION",
        "llama3_2_vision_transform",
        ORIG,
        _TILED,
        ("full", "lora", "qlora"),
        ("full", "lora", "qlora"),
        image_size=560,
        fusion="the projection head and cross-attention layers",
        full_trainable=(False, True, True),
        lora_trainable=("frozen", "lora", "lora"),
    ),
    VisionSize(
        "llama3_2_vision",
        "90B",
        "llama3_2_vision_90b",
        "LLAMA3_VISION",
        "llama3_2_vision_transform",
        ORIG,
        _TILED,
        (),
        ("full", "lora", "qlora"),
        image_size=560,
        fusion="the projection head and cross-attention layers",
        full_trainable=(False, True, True),
        lora_trainable=("frozen", "lora", "lora"),
    ),
    VisionSize(
        "qwen2_5_vl",
        "3B",
        "qwen2_5_vl_3b",
        "QWEN2_5_VL",
        "qwen2_5_vl_transform",
        "tokenizer.json",
        _FLAT,
        ("full", "lora", "qlora"),
        (),
        tokenizer_extra=_QWEN_PIXELS,
        fusion="the patch merger",
    ),
    VisionSize(
        "qwen2_5_vl",
        "7B",
        "qwen2_5_vl_7b",
        "QWEN2_5_VL",
        "qwen2_5_vl_transform",
        "tokenizer.json",
        _FLAT,
        ("lora", "qlora"),
        ("full", "lora"),
        tokenizer_extra=_QWEN_PIXELS,
        fusion="the patch merger",
    ),
    VisionSize(
        "qwen2_5_vl",
        "32B",
        "qwen2_5_vl_32b",
        "QWEN2_5_VL",
        "qwen2_5_vl_transform",
        "tokenizer.json",
        _FLAT,
        (),
        ("lora",),
        tokenizer_extra=_QWEN_PIXELS,
        fusion="the patch merger",
    ),
    VisionSize(
        "qwen2_5_vl",
        "72B",
        "qwen2_5_vl_72b",
        "QWEN2_5_VL",
        "qwen2_5_vl_transform",
        "tokenizer.json",
        _FLAT,
        (),
        ("qlora",),
        tokenizer_extra=_QWEN_PIXELS,
        fusion="the patch merger",
    ),
    VisionSize(
        "gemma3_vision",
        "4B",
        "gemma3_vision_4b",
        "GEMMA3_VISION",
        "gemma3_vision_transform",
        "tokenizer.model",
        _FLAT,
        ("full", "lora", "qlora"),
        (),
        lora_trainable=("lora", "frozen", "frozen"),
    ),
    VisionSize(
        "gemma3_vision",
        "12B",
        "gemma3_vision_12b",
        "GEMMA3_VISION",
        "gemma3_vision_transform",
        "tokenizer.model",
        _FLAT,
        ("lora", "qlora"),
        ("full", "lora"),
        lora_trainable=("lora", "frozen", "frozen"),
    ),
    VisionSize(
        "gemma3_vision",
        "27B",
        "gemma3_vision_27b",
        "GEMMA3_VISION",
        "gemma3_vision_transform",
        "tokenizer.model",
        _FLAT,
        ("qlora",),
        ("lora",),
        lora_trainable=("lora", "frozen", "frozen"),
    ),
]


def _vision_model(v: VisionSize, method: str) -> str:
    image_size = (
        f"  image_size: {v.image_size}  # the tile size: the same as tokenizer.image_size\n" if v.image_size else ""
    )
    if method == "full":
        decoder, encoder, fusion = v.full_trainable
        return (
            "model:\n"
            f"  _component_: tune.models.{v.family}.{v.builder}\n"
            f"  decoder_trainable: {decoder}  # the language model\n"
            f"  encoder_trainable: {encoder}  # the vision encoder\n"
            f"  fusion_trainable: {fusion}  # what joins them: {v.fusion}\n" + image_size
        )
    prefix = "qlora_" if method == "qlora" else "lora_"
    decoder, encoder, fusion = v.lora_trainable
    return (
        "model:\n"
        f"  _component_: tune.models.{v.family}.{prefix}{v.builder}\n"
        f"  decoder_trainable: {decoder}  # the language model: frozen or lora (a LoRA recipe trains adapters only)\n"
        f"  encoder_trainable: {encoder}  # the vision encoder\n"
        f"  fusion_trainable: {fusion}  # {v.fusion}\n"
        "  lora_attn_modules: ['q_proj', 'v_proj', 'output_proj']\n"
        "  apply_lora_to_mlp: True\n"
        "  apply_lora_to_output: False\n"
        "  lora_rank: 8  # higher rank: more capacity, more memory\n"
        "  lora_alpha: 16  # the update is scaled by lora_alpha / lora_rank\n"
        "  lora_dropout: 0.0\n" + image_size
    )


def render_vision(v: VisionSize, method: str, distributed: bool) -> str:
    kind = method if distributed else f"{method}_single_device"
    name = f"{v.family}/{v.size}_{kind}"
    recipe = ("full_finetune" if method == "full" else "lora_finetune") + (
        "_distributed" if distributed else "_single_device"
    )
    what = {"full": "Full fine-tuning", "lora": "LoRA fine-tuning", "qlora": "QLoRA fine-tuning (NF4 base weights)"}[
        method
    ]
    where = f"on {NUM_GPUS} GPUs (FSDP2)" if distributed else "on one device"
    launch = f"--nproc_per_node {NUM_GPUS} " if distributed else ""
    out = (
        f"# {what} of {v.repo} {where} on images and text, with {recipe}.py.\n"
        "#\n"
        "# Download the model first:\n"
        f"#   tune download {v.repo} --output-dir {_dl_dir(v.repo)}\n"
        "#\n"
        "# Then run:\n"
        f"#   tune run {launch}{recipe} --config {name}\n"
        "#\n"
        f"# {'batch_size is per GPU. ' if distributed else ''}Any key can be overridden on the command line, e.g. dataset.subset=vqav2.\n\n"
    )
    out += f"output_dir: /tmp/tune/{v.family}_{v.size}/{kind}\n\n"
    out += _vision_model(v, method) + "\n"
    out += (
        "tokenizer:  # the model transform: tokenizer and image processor\n"
        f"  _component_: tune.models.{v.family}.{v.transform}\n"
        f"  path: {_dl_dir(v.repo)}/{v.tokenizer_path}\n"
        + (f"  image_size: {v.image_size}\n" if v.image_size else "")
        + v.tokenizer_extra
        + "  max_seq_len: 8192\n\n"
        "checkpointer:\n"
        "  _component_: tune.training.FullModelHFCheckpointer\n"
        f"  checkpoint_dir: {_dl_dir(v.repo)}\n"
        "  checkpoint_files: null  # null: every shard listed in model.safetensors.index.json\n"
        + ("  adapter_checkpoint: null\n" if method != "full" else "")
        + "  recipe_checkpoint: null\n"
        "  output_dir: ${output_dir}\n"
        f"  model_type: {v.model_type}\n"
        "resume_from_checkpoint: False\n"
        + (
            "save_adapter_weights_only: False  # True: write only the PEFT adapter, not the merged model\n"
            if method != "full"
            else ""
        )
        + "save_every_n_steps: null  # null: save at the end of each epoch only\n"
        "keep_last_n_checkpoints: null\n\n"
        "dataset:\n"
        "  _component_: tune.datasets.multimodal.the_cauldron_dataset\n"
        "  subset: ocrvqa\n"
        "  packed: False  # samples with images are not packed\n"
        f"collate_fn: {v.collate}\n"
        "seed: null\n"
        "shuffle: True\n"
        f"batch_size: 2{'  # per GPU' if distributed else ''}\n\n"
        "optimizer:\n"
        "  _component_: torch.optim.AdamW\n"
        "  fused: True\n"
        "  weight_decay: 0.01\n"
        f"  lr: {'2e-5' if method == 'full' else '1e-4'}\n"
        "lr_scheduler:\n"
        "  _component_: tune.training.lr_schedulers.get_cosine_schedule_with_warmup\n"
        "  num_warmup_steps: 100\n"
    )
    if not distributed:
        out += "optimizer_in_bwd: False  # True: step each parameter as its gradient is ready (saves memory; no clipping or accumulation)\n"
    out += (
        "loss:\n"
        "  _component_: tune.modules.loss.LinearCrossEntropyLoss\n\n"
        "epochs: 1\n"
        "max_steps_per_epoch: null\n"
        "gradient_accumulation_steps: 8\n"
        "clip_grad_norm: 1.0\n"
        "compile: False  # torch.compile the model and loss: faster steps after a slower first one\n\n"
    )
    if distributed:
        out += (
            "tensor_parallel_dim: 1  # vision-language models are sharded with FSDP2 only\n"
            "fsdp_cpu_offload: False  # True: keep sharded weights, gradients and optimizer states in CPU memory\n"
            "fsdp_reshard_after_forward: True  # False: keep each layer gathered until backward (faster, more memory)\n"
            "dist_backend: null  # null: nccl on GPU (gloo for CPU-side state), gloo on CPU\n\n"
        )
    out += (
        "metric_logger:\n"
        "  _component_: tune.training.metric_logging.DiskLogger\n"
        "  log_dir: ${output_dir}/logs\n"
        "log_every_n_steps: 1\n"
        "log_peak_memory_stats: True\n\n"
        "device: cuda\n"
        "dtype: bf16\n\n"
        "enable_activation_checkpointing: True\n"
        "enable_activation_offloading: False\n\n"
        "profiler:\n"
        "  _component_: tune.training.setup_torch_profiler\n"
        "  enabled: False\n"
    )
    return out


def write_vision_configs() -> int:
    written = 0
    for v in VISION_SIZES:
        for methods, distributed in ((v.single, False), (v.distributed, True)):
            for method in methods:
                kind = method if distributed else f"{method}_single_device"
                path = ROOT / "configs" / v.family / f"{v.size}_{kind}.yaml"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(render_vision(v, method, distributed))
                written += 1
    return written


if __name__ == "__main__":
    main()
    print(f"wrote {write_dpo_distributed_configs()} multi-GPU DPO configs")
    print(f"wrote {write_kd_configs()} knowledge-distillation configs")
    print(f"wrote {write_grpo_configs()} GRPO configs")
    print(f"wrote {write_vision_configs()} vision configs")
