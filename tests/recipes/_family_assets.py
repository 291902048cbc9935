"""Tiny assets of every model family, for running each family's shipped configs end to end.

For each family: a tiny tokenizer of the family's kind (tests/tune/data/_tiny_tokenizers.py), a randomly
initialised ``transformers`` checkpoint with the family's architecture (2 layers, small widths; every other
setting as in the released model whose config the family's smallest shipped config fine-tunes) and the
``model.*`` overrides that build the same architecture with the family's component builder. Only dimensions
differ from the shipped size: the non-dimension settings (RoPE base and scaling, norm epsilon, tied embeddings,
soft-capping, sliding windows, ...) are read from the family's size table, ``MODEL_SIZES``, so a wrong entry there
shows up as a logits mismatch against ``transformers``, whose config is written here from the released models'
``config.json`` values.
"""

import functools
import importlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from tests.recipes._preference_assets import write_preference_messages
from tests.recipes.utils import _write_alpaca
from tests.tune.data import _tiny_tokenizers
from tests.tune.models._hf_cases import build_hf_model

CONFIGS = Path(__file__).resolve().parents[2] / "configs"

# The tiny dimensions (head_dim 16, grouped-query attention 4 : 2).
EMBED_DIM, NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, INTERMEDIATE_DIM, NUM_LAYERS = 64, 4, 2, 16, 128, 2
# The model's and the tokenizer's max_seq_len. Not shorter: the tiny tokenizers spell the alpaca prompt's fixed
# preamble in 100-170 tokens, so at 64 every sample is cut to the same preamble and every batch has the same
# loss (a resume that reads the wrong batches would then go unnoticed). The tiny rows are 178-365 tokens long.
MAX_SEQ_LEN = 512
# the original context of the tiny LongRoPE model (phi3_128k): shorter than the rows, so its long factors apply
TINY_LONG_ROPE_CONTEXT = 64
# Mixture-of-experts families (qwen3_moe): each expert's width, the experts per layer and per token.
MOE_INTERMEDIATE_DIM, NUM_EXPERTS, EXPERTS_PER_TOKEN = 32, 8, 2
LORA_MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
# tune's attention module names -> transformers'
HF_ATTN_NAMES = {"q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj", "output_proj": "o_proj"}


@dataclass(frozen=True)
class FamilySpec:
    """What the tests need to know about a family.

    Attributes:
        size (str): the ``MODEL_SIZES`` row of the smallest shipped size (its non-dimension settings are kept).
        size_module (str): the module holding that table.
        builder_module (str): the module whose component builders the configs' ``model`` node is pointed at.
        builder (str): the full-model component builder; ``lora_<builder>`` is the LoRA one.
        configs (dict[str, str]): method -> shipped single-device config (relative to configs/).
        distributed (dict[str, str]): method -> shipped distributed config, where one exists.
        tokenizer (str): which tiny tokenizer (``sentencepiece``, ``gemma``, ``mistral_v0_3``, ``tiktoken``,
            ``qwen2_5``, ``qwen3``, ``phi3``, ``phi4``, ``tekken``, ``llama4``).
        tokenizer_builder (str): the configs' tokenizer builder, where it is not ``FAMILY.tokenizer`` of
            ``tune.models.<key>`` (a key that names a size, not a package).
    """

    size: str
    size_module: str
    builder_module: str
    builder: str
    configs: dict[str, str]
    distributed: dict[str, str]
    tokenizer: str
    tokenizer_builder: str = ""


def _single(prefix: str, methods=("full", "lora", "qlora")) -> dict[str, str]:
    return {m: f"{prefix}_{m}_single_device.yaml" for m in methods}


FAMILIES: dict[str, FamilySpec] = {
    "llama2": FamilySpec(
        "llama2_7b",
        "llama2",
        "llama2",
        "llama2",
        _single("llama2/7B"),
        {"full": "llama2/13B_full.yaml", "lora": "llama2/13B_lora.yaml"},
        "sentencepiece",
    ),  # fmt: skip
    # Code Llama is a Llama 2 architecture with no builder of its own: its builders call llama2's
    "code_llama2": FamilySpec(
        "code_llama2_7b",
        "code_llama2",
        "llama2",
        "llama2",
        _single("code_llama2/7B"),
        {},
        "sentencepiece",
    ),  # fmt: skip
    "llama3": FamilySpec(
        "llama3_8b",
        "llama3",
        "llama3",
        "llama3",
        _single("llama3/8B"),
        {"full": "llama3/8B_full.yaml", "lora": "llama3/8B_lora.yaml"},
        "tiktoken",
    ),  # fmt: skip
    "llama3_1": FamilySpec(
        "llama3_1_8b",
        "llama3_1",
        "llama3_1",
        "llama3_1",
        _single("llama3_1/8B"),
        {"full": "llama3_1/8B_full.yaml", "lora": "llama3_1/8B_lora.yaml"},
        "tiktoken",
    ),  # fmt: skip
    "llama3_2": FamilySpec(
        "llama3_2_1b",
        "llama3_2",
        "llama3_2",
        "llama3_2",
        _single("llama3_2/1B"),
        {},
        "tiktoken",
    ),  # fmt: skip
    # Llama 3.3 is a Llama 3.1 architecture with no builder of its own: its builders call llama3_1's. It ships
    # no single-device full config.
    "llama3_3": FamilySpec(
        "llama3_3_70b",
        "llama3_3",
        "llama3_1",
        "llama3_1",
        _single("llama3_3/70B", ("qlora",)),
        {"full": "llama3_3/70B_full.yaml", "lora": "llama3_3/70B_lora.yaml"},
        "tiktoken",
    ),  # fmt: skip
    "mistral": FamilySpec(
        "mistral_7b",
        "mistral",
        "mistral",
        "mistral",
        _single("mistral/7B"),
        {},
        "sentencepiece",
    ),  # fmt: skip
    # Mistral 7B v0.3 and NeMo 12B: sizes of the mistral family (rows of its table), NeMo with its tekken tokenizer
    "mistral_v0_3": FamilySpec(
        "mistral_7b_v0_3",
        "mistral",
        "mistral",
        "mistral",
        _single("mistral/7B_v0.3", ("lora", "qlora")),
        {},
        "mistral_v0_3",
        "tune.models.mistral.mistral_tokenizer",
    ),  # fmt: skip
    "mistral_nemo": FamilySpec(
        "mistral_nemo_12b",
        "mistral",
        "mistral",
        "mistral",
        _single("mistral/nemo_12B", ("lora", "qlora")),
        {},
        "tekken",
        "tune.models.mistral.mistral_nemo_tokenizer",
    ),  # fmt: skip
    "qwen2_5": FamilySpec(
        "qwen2_5_0_5b",
        "qwen2_5",
        "qwen2_5",
        "qwen2",
        _single("qwen2_5/0.5B"),
        {"full": "qwen2_5/14B_full.yaml", "lora": "qwen2_5/14B_lora.yaml"},
        "qwen2_5",
    ),  # fmt: skip
    # Qwen2 is the Qwen2.5 architecture (the qwen2 family's sizes call qwen2_5's component builders); torchtune's
    # qwen2 set has no single-device QLoRA config
    "qwen2": FamilySpec(
        "qwen2_0_5b",
        "qwen2",
        "qwen2",
        "qwen2",
        _single("qwen2/0.5B", ("full", "lora")),
        {"full": "qwen2/0.5B_full.yaml", "lora": "qwen2/0.5B_lora.yaml"},
        "qwen2_5",
        "tune.models.qwen2.qwen2_tokenizer",
    ),  # fmt: skip
    "qwen3": FamilySpec(
        "qwen3_0_6b_instruct",
        "qwen3",
        "qwen3",
        "qwen3",
        _single("qwen3/0.6B"),
        {"full": "qwen3/8B_full.yaml", "lora": "qwen3/8B_lora.yaml"},
        "qwen3",
    ),  # fmt: skip
    # no single-device full config: 30B-A3B is fine-tuned in full on several GPUs
    "qwen3_moe": FamilySpec(
        "qwen3_moe_30b_a3b",
        "qwen3_moe",
        "qwen3_moe",
        "qwen3_moe",
        _single("qwen3_moe/30B_A3B", methods=("lora", "qlora")),
        {"full": "qwen3_moe/30B_A3B_full.yaml", "lora": "qwen3_moe/30B_A3B_lora.yaml"},
        "qwen3",
    ),  # fmt: skip
    # Llama 4's language model: Scout (every layer sparse) single-device with LoRA and QLoRA, and distributed;
    # Maverick (dense and sparse layers alternating, unscaled RoPE, no q/k norm), a size of the same family, with
    # LoRA on several GPUs only
    "llama4": FamilySpec(
        "llama4_scout_17b_16e",
        "llama4",
        "llama4",
        "llama4",
        _single("llama4/scout_17B_16E", methods=("lora", "qlora")),
        {"full": "llama4/scout_17B_16E_full.yaml", "lora": "llama4/scout_17B_16E_lora.yaml"},
        "llama4",
    ),  # fmt: skip
    "llama4_maverick": FamilySpec(
        "llama4_maverick_17b_128e",
        "llama4",
        "llama4",
        "llama4",
        {},
        {"lora": "llama4/maverick_17B_128E_lora.yaml"},
        "llama4",
        "tune.models.llama4.llama4_tokenizer",
    ),  # fmt: skip
    "gemma": FamilySpec(
        "gemma_2b",
        "gemma",
        "gemma",
        "gemma",
        _single("gemma/2B"),
        {"full": "gemma/2B_full.yaml", "lora": "gemma/2B_lora.yaml"},
        "gemma",
    ),  # fmt: skip
    "gemma2": FamilySpec(
        "gemma2_2b",
        "gemma2",
        "gemma2",
        "gemma2",
        _single("gemma2/2B"),
        {"full": "gemma2/9B_full.yaml", "lora": "gemma2/9B_lora.yaml"},
        "gemma",
    ),  # fmt: skip
    "gemma3": FamilySpec(
        "gemma3_1b",
        "gemma3",
        "gemma3",
        "gemma3",
        _single("gemma3/1B"),
        {"full": "gemma3/12B_full.yaml", "lora": "gemma3/12B_lora.yaml"},
        "gemma",
    ),  # fmt: skip
    "phi3": FamilySpec(
        "phi3_mini",
        "phi3",
        "phi3",
        "phi3",
        _single("phi3/mini"),
        {},
        "phi3",
    ),  # fmt: skip
    # Phi-3 mini 128k: LongRoPE (its configs read the factors from config.json; here from the tiny one, whose
    # original context is shorter than the rows, so the long factors apply)
    "phi3_128k": FamilySpec(
        "phi3_mini_128k",
        "phi3",
        "phi3",
        "phi3",
        _single("phi3/mini_128k"),
        {},
        "phi3",
        "tune.models.phi3.phi3_mini_tokenizer",
    ),  # fmt: skip
    # Phi-4 is a Phi-3 architecture (grouped-query attention, RoPE theta 250000) whose builders call phi3's
    "phi4": FamilySpec(
        "phi4_14b",
        "phi4",
        "phi3",
        "phi3",
        _single("phi4/14B"),
        {"full": "phi4/14B_full.yaml", "lora": "phi4/14B_lora.yaml"},
        "phi4",
    ),  # fmt: skip
}


# family -> (its shipped LoRA DPO config, relative to configs/; the method its model builder names)
DPO_CONFIGS: dict[str, tuple[str, str]] = {
    "llama2": ("llama2/7B_lora_dpo_single_device.yaml", "lora"),
    "code_llama2": ("code_llama2/7B_lora_dpo_single_device.yaml", "lora"),
    "llama3": ("llama3/8B_lora_dpo_single_device.yaml", "lora"),
    "llama3_1": ("llama3_1/8B_lora_dpo_single_device.yaml", "lora"),
    "llama3_2": ("llama3_2/1B_lora_dpo_single_device.yaml", "lora"),
    "llama3_3": ("llama3_3/70B_qlora_dpo_single_device.yaml", "qlora"),
    "mistral": ("mistral/7B_lora_dpo_single_device.yaml", "lora"),
    "qwen2_5": ("qwen2_5/1.5B_lora_dpo_single_device.yaml", "lora"),
    "qwen3": ("qwen3/1.7B_lora_dpo_single_device.yaml", "lora"),
    "gemma2": ("gemma2/2B_lora_dpo_single_device.yaml", "lora"),
    "gemma3": ("gemma3/1B_lora_dpo_single_device.yaml", "lora"),
    "phi3": ("phi3/mini_lora_dpo_single_device.yaml", "lora"),
}

# the shipped ORPO configs (tune.rlhf.loss.ORPOLoss in the preference recipes), relative to configs/: (family, config,
# recipe); tests/recipes/test_orpo_every_family.py runs each on its family's tiny assets
ORPO_CONFIGS: list[tuple[str, str, str]] = [
    ("llama3_2", "llama3_2/1B_lora_orpo_single_device.yaml", "lora_dpo_single_device"),
    ("qwen2_5", "qwen2_5/1.5B_lora_orpo_single_device.yaml", "lora_dpo_single_device"),
    ("qwen3", "qwen3/1.7B_lora_orpo_single_device.yaml", "lora_dpo_single_device"),
    ("gemma", "gemma/2B_lora_orpo_single_device.yaml", "lora_dpo_single_device"),
    ("mistral", "mistral/7B_lora_orpo_single_device.yaml", "lora_dpo_single_device"),
    ("qwen3", "qwen3/8B_lora_orpo.yaml", "lora_dpo_distributed"),
    ("qwen2_5", "qwen2_5/7B_full_orpo.yaml", "full_dpo_distributed"),
]

# family -> its shipped KTO configs, relative to configs/, with the method its model builder names (run by
# tests/recipes/test_kto_every_family.py on the generated preference pairs, unpaired; kto_distributed's on 2 ranks)
KTO_CONFIGS: dict[str, list[tuple[str, str]]] = {
    "llama3_2": [("llama3_2/1B_lora_kto_single_device.yaml", "lora")],
    "qwen2_5": [("qwen2_5/1.5B_lora_kto_single_device.yaml", "lora"), ("qwen2_5/7B_full_kto.yaml", "full")],
    "qwen3": [
        ("qwen3/1.7B_lora_kto_single_device.yaml", "lora"),
        ("qwen3/1.7B_full_kto_single_device.yaml", "full"),
        ("qwen3/8B_lora_kto.yaml", "lora"),
    ],
    "gemma": [("gemma/2B_lora_kto_single_device.yaml", "lora")],
    "mistral": [("mistral/7B_lora_kto_single_device.yaml", "lora")],
}


# Families whose architecture and tokenizer kind another family's default-tier tests cover: Code Llama is Llama 2
# with another RoPE base; Llama 3, 3.1 and 3.3 are Llama 3.2's blocks and tiktoken tokenizer with other RoPE
# scaling and untied embeddings; Phi-4 is Phi-3's blocks with another RoPE base and a byte-level BPE tokenizer
# (its chat format is checked in tests/tune/models/test_phi4.py). Their LoRA configs (train, resume, load in
# transformers and PEFT) run in the default tier, which checks those settings against transformers; their other
# shipped and published configs run in the slow tier (`make test-all`), keeping `make test` under its 15 minutes.
# Qwen2 is Qwen2.5's builders (the qwen2 family calls them) with its own size table and tokenizer builder;
# Mistral 7B v0.3 and NeMo are Mistral's blocks with other sizes (NeMo's head_dim and its tekken tokenizer are
# checked against transformers in tests/tune/models/test_hf.py and test_mistral_variants.py).
VARIANT_FAMILIES = (
    *("code_llama2", "llama3", "llama3_1", "llama3_3", "phi4"),
    *("qwen2", "mistral_v0_3", "mistral_nemo"),
)
# Qwen3-MoE is Qwen 3's attention and tokenizer with MoE blocks, which its LoRA config checks end to end in the
# default tier (its NF4 experts: tests/tune/models/test_qwen3_moe.py); its QLoRA and distributed configs run slow.
VARIANT_FAMILIES += ("qwen3_moe",)
# Llama 4 likewise: its Scout LoRA config end to end in the default tier (its logits, NF4 experts and conversion
# against transformers: tests/tune/models/test_llama4.py); QLoRA, distributed and Maverick configs run slow.
VARIANT_FAMILIES += ("llama4", "llama4_maverick")


def tokenizer_file(kind: str) -> Path:
    """The tiny tokenizer file of a kind, in the form the family's tokenizer builder reads (``tokenizer.path``)."""
    if kind == "sentencepiece":
        return _tiny_tokenizers.sentencepiece_model() / "tokenizer.model"
    if kind == "gemma":
        return _tiny_tokenizers.sentencepiece_model(dummy_prefix=False, gemma=True) / "tokenizer.model"
    if kind == "mistral_v0_3":  # Mistral 7B v0.3's [INST]/[/INST] (and tool) control pieces
        return _tiny_tokenizers.sentencepiece_model(mistral_v0_3=True) / "tokenizer.model"
    if kind == "tiktoken":
        return _tiny_tokenizers.tiktoken_file()
    if kind in ("qwen2_5", "qwen3"):
        return _tiny_tokenizers.qwen_tokenizer_json(qwen3=kind == "qwen3") / "tokenizer.json"
    if kind == "phi3":
        return _tiny_tokenizers.phi3_tokenizer_dir() / "tokenizer.model"
    if kind == "phi4":
        return phi4_tokenizer_dir() / "tokenizer.json"
    if kind == "tekken":
        return tekken_tokenizer_dir() / "tokenizer.json"
    if kind == "llama4":
        return llama4_tokenizer_dir() / "tokenizer.json"
    raise ValueError(kind)


@functools.cache
def phi4_tokenizer_dir() -> Path:
    """A Phi-4-style byte-level BPE (cl100k regex, no normaliser, Phi-4's 96 special tokens after the BPE entries):
    ``tokenizer.json`` next to the ``vocab.json``/``merges.txt`` of the same model."""
    return _tiny_tokenizers.phi4_bpe_files()


@functools.cache
def llama4_tokenizer_dir() -> Path:
    """A Llama-4-style ``tokenizer.json``: byte-level BPE with Llama 4's o200k-style regex and no normaliser, then
    Llama 4's first special tokens (``<|begin_of_text|>`` ... ``<|finetune_right_pad|>``) in their id order."""
    from tokenizers import AddedToken

    from tune.models.llama4._tokenizer import LLAMA4_PATTERN, LLAMA4_SPECIAL_TOKENS

    tokenizer = _tiny_tokenizers._train_byte_level_bpe(LLAMA4_PATTERN, vocab_size=600, nfc=False)
    tokenizer.add_special_tokens(
        [AddedToken(content, special=True, normalized=False) for content in LLAMA4_SPECIAL_TOKENS]
    )
    out = _tiny_tokenizers._workdir() / "llama4"
    out.mkdir()
    tokenizer.save(str(out / "tokenizer.json"))
    return out


# Mistral NeMo's tekken tokenizer.json (mistralai/Mistral-Nemo-Instruct-2407): its first control tokens, in id order
# (the release pads them to 1000 with <SPECIAL_n>), and its pre-tokenisation regex
TEKKEN_CONTROL_TOKENS = (
    "<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]", "[TOOL_CALLS]", "<pad>", "[PREFIX]", "[MIDDLE]", "[SUFFIX]",
)  # fmt: skip
TEKKEN_PATTERN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|"
    r"\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@functools.cache
def tekken_tokenizer_dir() -> Path:
    """A tekken-style ``tokenizer.json`` (byte-level BPE, control tokens at the first ids, no normaliser) with the
    ``tokenizer_config.json`` special tokens of Mistral NeMo."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(TEKKEN_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=list(TEKKEN_CONTROL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_tiny_tokenizers.corpus(), trainer)
    out = _tiny_tokenizers._workdir() / "tekken"
    out.mkdir()
    tokenizer.save(str(out / "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out


def _tokenizer(family: str):
    """The family's own tokenizer on the tiny file (its ``vocab_size`` and special ids size the model)."""
    spec = FAMILIES[family]
    if spec.tokenizer_builder:
        module, _, name = spec.tokenizer_builder.rpartition(".")
        tokenizer_builder = getattr(importlib.import_module(module), name)
    else:
        tokenizer_builder = importlib.import_module(f"tune.models.{family}").FAMILY.tokenizer
    return tokenizer_builder(str(tokenizer_file(spec.tokenizer)))


def vocab_size(family: str) -> int:
    """The tiny tokenizer's vocabulary, rounded up to a multiple of 64 (as released vocabularies are padded)."""
    return -(-_tokenizer(family).vocab_size // 64) * 64


def tune_dims(family: str) -> dict:
    """Keyword arguments of the family's component builder: the smallest size's, with tiny dimensions."""
    spec = FAMILIES[family]
    sizes = importlib.import_module(f"tune.models.{spec.size_module}._model_builders").MODEL_SIZES
    dims = dict(sizes[spec.size].dims)
    dims.update(
        vocab_size=vocab_size(family),
        num_layers=NUM_LAYERS,
        num_heads=NUM_HEADS,
        num_kv_heads=NUM_KV_HEADS,
        embed_dim=EMBED_DIM,
        intermediate_dim=INTERMEDIATE_DIM,
        max_seq_len=MAX_SEQ_LEN,
    )
    if "head_dim" in dims:
        dims["head_dim"] = HEAD_DIM
    if "rope_scaling" in dims:  # LongRoPE: the tiny config.json's factors, read as the 128k builder reads them
        from tune.models.phi3._convert_weights import phi3_long_rope_settings

        dims["rope_scaling"] = phi3_long_rope_settings(hf_config(family).to_dict())[1]
    if "num_experts" in dims:
        dims.update(
            moe_intermediate_dim=MOE_INTERMEDIATE_DIM, num_experts=NUM_EXPERTS, experts_per_token=EXPERTS_PER_TOKEN
        )
    return dims


def hf_config(family: str):
    """The ``transformers`` config of the tiny model: the released model's settings, tiny dimensions."""
    import transformers

    tokenizer = _tokenizer(family)
    common = dict(
        vocab_size=vocab_size(family),
        hidden_size=EMBED_DIM,
        intermediate_size=INTERMEDIATE_DIM,
        num_hidden_layers=NUM_LAYERS,
        num_attention_heads=NUM_HEADS,
        num_key_value_heads=NUM_KV_HEADS,
        max_position_embeddings=MAX_SEQ_LEN,
        bos_token_id=tokenizer.bos_id,
        eos_token_id=tokenizer.eos_id,
    )

    def llama3_scaling(factor: float) -> dict:  # meta-llama/Llama-3.1-8B-Instruct and Llama-3.2-1B config.json
        return dict(
            rope_type="llama3",
            factor=factor,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=8192,
        )

    llama = dict(rms_norm_eps=1e-5, tie_word_embeddings=False)
    if family == "llama2":  # meta-llama/Llama-2-7b-hf
        return transformers.LlamaConfig(rope_theta=10_000.0, **llama, **common)
    if family == "code_llama2":  # codellama/CodeLlama-7b-hf
        return transformers.LlamaConfig(rope_theta=1_000_000.0, **llama, **common)
    if family == "llama3":  # meta-llama/Meta-Llama-3-8B-Instruct
        return transformers.LlamaConfig(rope_theta=500_000.0, **llama, **common)
    if family in ("llama3_1", "llama3_3"):  # meta-llama/Llama-3.1-8B-Instruct, Llama-3.3-70B-Instruct
        return transformers.LlamaConfig(rope_theta=500_000.0, rope_scaling=llama3_scaling(8.0), **llama, **common)
    if family == "llama3_2":  # meta-llama/Llama-3.2-1B-Instruct
        return transformers.LlamaConfig(
            rope_theta=500_000.0, rope_scaling=llama3_scaling(32.0), rms_norm_eps=1e-5, tie_word_embeddings=True,
            **common,
        )  # fmt: skip
    if family == "mistral":  # mistralai/Mistral-7B-v0.1
        return transformers.MistralConfig(rope_theta=10_000.0, rms_norm_eps=1e-5, sliding_window=4096, **common)
    if family == "mistral_v0_3":  # mistralai/Mistral-7B-Instruct-v0.3
        return transformers.MistralConfig(rope_theta=1_000_000.0, rms_norm_eps=1e-5, sliding_window=None, **common)
    if family == "mistral_nemo":  # mistralai/Mistral-Nemo-Instruct-2407
        return transformers.MistralConfig(
            head_dim=HEAD_DIM, rope_theta=1_000_000.0, rms_norm_eps=1e-5, sliding_window=None, **common
        )
    if family == "qwen2_5":  # Qwen/Qwen2.5-0.5B-Instruct
        return transformers.Qwen2Config(rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, **common)
    if family == "qwen2":  # Qwen/Qwen2-0.5B-Instruct
        return transformers.Qwen2Config(rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, **common)
    if family == "qwen3":  # Qwen/Qwen3-0.6B
        return transformers.Qwen3Config(
            head_dim=HEAD_DIM, rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, **common
        )
    if family == "qwen3_moe":  # Qwen/Qwen3-30B-A3B (every layer sparse)
        return transformers.Qwen3MoeConfig(
            head_dim=HEAD_DIM, rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
            moe_intermediate_size=MOE_INTERMEDIATE_DIM, num_experts=NUM_EXPERTS, num_experts_per_tok=EXPERTS_PER_TOKEN,
            norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], **common,
        )  # fmt: skip
    if family in ("llama4", "llama4_maverick"):  # the text_config of meta-llama/Llama-4-Scout-17B-16E-Instruct
        # (every layer sparse, Llama 3 RoPE scaling, q/k norm) or of Llama-4-Maverick-17B-128E-Instruct (every
        # second layer sparse, unscaled RoPE, no q/k norm)
        scout = family == "llama4"
        rope = dict(rope_type="default", rope_theta=500_000.0)
        if scout:
            rope.update(
                rope_type="llama3", factor=16.0, low_freq_factor=1.0, high_freq_factor=1.0,
                original_max_position_embeddings=8192,
            )  # fmt: skip
        return transformers.Llama4TextConfig(
            **{**common, "intermediate_size": MOE_INTERMEDIATE_DIM}, intermediate_size_mlp=INTERMEDIATE_DIM,
            head_dim=HEAD_DIM, rope_parameters=rope, rms_norm_eps=1e-5, tie_word_embeddings=False,
            num_local_experts=NUM_EXPERTS, num_experts_per_tok=EXPERTS_PER_TOKEN,
            interleave_moe_layer_step=1 if scout else 2, use_qk_norm=scout, attention_chunk_size=8192,
            attn_temperature_tuning=True, floor_scale=8192, attn_scale=0.1, pad_token_id=tokenizer.pad_id,
        )  # fmt: skip
    if family == "gemma":  # google/gemma-2b
        return transformers.GemmaConfig(
            head_dim=HEAD_DIM, rope_theta=10_000.0, rms_norm_eps=1e-6, hidden_act="gelu_pytorch_tanh",
            pad_token_id=tokenizer.pad_id, **common,
        )  # fmt: skip
    if family == "gemma2":  # google/gemma-2-2b-it
        return transformers.Gemma2Config(
            head_dim=HEAD_DIM, rope_theta=10_000.0, rms_norm_eps=1e-6, query_pre_attn_scalar=256,
            attn_logit_softcapping=50.0, final_logit_softcapping=30.0, sliding_window=4096,
            pad_token_id=tokenizer.pad_id, **common,
        )  # fmt: skip
    if family == "gemma3":  # google/gemma-3-1b-it (2 layers: both local, as the first 5 of every 6 are)
        rope = {
            "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        }
        return transformers.Gemma3TextConfig(
            head_dim=HEAD_DIM, rope_parameters=rope, rms_norm_eps=1e-6, query_pre_attn_scalar=256, sliding_window=512,
            pad_token_id=tokenizer.pad_id, **common,
        )  # fmt: skip
    if family == "phi3":  # microsoft/Phi-3-mini-4k-instruct
        return transformers.Phi3Config(
            rope_theta=10_000.0, rms_norm_eps=1e-5, sliding_window=2047, tie_word_embeddings=False,
            original_max_position_embeddings=MAX_SEQ_LEN, pad_token_id=tokenizer.pad_id, **common,
        )  # fmt: skip
    if family == "phi3_128k":  # microsoft/Phi-3-mini-128k-instruct's longrope, tiny: 8 factor pairs, context 64
        scaling = dict(
            rope_type="longrope",
            short_factor=[1.0 + 0.05 * i for i in range(HEAD_DIM // 2)],
            long_factor=[1.0 + 0.7 * i for i in range(HEAD_DIM // 2)],
            original_max_position_embeddings=TINY_LONG_ROPE_CONTEXT,
        )
        common = {**common, "max_position_embeddings": MAX_SEQ_LEN}
        return transformers.Phi3Config(
            rope_theta=10_000.0, rms_norm_eps=1e-5, sliding_window=262_143, tie_word_embeddings=False,
            rope_scaling=scaling, original_max_position_embeddings=TINY_LONG_ROPE_CONTEXT,
            pad_token_id=tokenizer.pad_id, **common,
        )  # fmt: skip
    if family == "phi4":  # microsoft/phi-4
        return transformers.Phi3Config(
            rope_theta=250_000.0, rms_norm_eps=1e-5, sliding_window=None, tie_word_embeddings=False,
            original_max_position_embeddings=MAX_SEQ_LEN, pad_token_id=tokenizer.pad_id, **common,
        )  # fmt: skip
    raise ValueError(family)


def build_family_assets(family: str, root: Path) -> Path:
    """Writes ``root/hf/`` (the tiny HF checkpoint, one ``model.safetensors``), ``root/train.json`` (80 rows) and
    ``root/pairs.json`` (64 preference pairs in messages form, for the DPO configs)."""
    root.mkdir(parents=True, exist_ok=True)
    model = build_hf_model(hf_config(family), seed=0)
    model.save_pretrained(root / "hf", safe_serialization=True)
    _write_alpaca(root / "train.json", num_samples=80, seed=0)  # 4 steps of 2 x 8 (the largest accumulation shipped)
    # 4 single-device DPO steps of 1 x 8 pairs (at most); 4 two-rank steps of 1 x 8 pairs per rank
    write_preference_messages(root / "pairs.json", num_pairs=64, seed=0)
    return root


def model_overrides(family: str, method: str) -> list[str]:
    """``model.*`` overrides: the family's component builder with the tiny dimensions (LoRA settings kept)."""
    spec = FAMILIES[family]
    builder = spec.builder if method == "full" else f"lora_{spec.builder}"
    overrides = [f"model._component_=tune.models.{spec.builder_module}.{builder}"]
    if method == "qlora":  # what the shipped qlora_* builder adds to lora_*
        overrides.append("model.quantize_base=True")
    if family == "phi3_128k":  # the named builder's reader of config.json: the component builder takes its result
        overrides.append("~model.hf_config_path")
    for key, value in tune_dims(family).items():
        overrides.append(f"model.{key}={json.dumps(value) if value is not None else 'null'}")
    return overrides


def tiny_run_overrides(family: str, method: str, data: Path, out: Path, steps: int) -> list[str]:
    """Command-line changes that run a shipped config of ``family`` at tiny scale on the CPU: the tiny model
    (:func:`model_overrides`), tokenizer and checkpoint, the alpaca rows of ``data``, fp32, ``steps`` steps of 2
    samples, outputs in ``out``."""
    return [
        f"output_dir={out}",
        "device=cpu",
        "dtype=fp32",
        *model_overrides(family, method),
        f"tokenizer.path={tokenizer_file(FAMILIES[family].tokenizer)}",
        f"tokenizer.max_seq_len={MAX_SEQ_LEN}",
        f"checkpointer.checkpoint_dir={data / 'hf'}",
        "dataset._component_=tune.datasets.alpaca_dataset",
        "dataset.source=json",
        f"dataset.data_files={data / 'train.json'}",
        "dataset.split=train",
        "batch_size=2",
        f"max_steps_per_epoch={steps}",
    ]


def hf_lora_targets(lora_node: dict) -> list[str]:
    """The ``transformers`` module names a config's LoRA settings adapt."""
    targets = [HF_ATTN_NAMES[name] for name in lora_node["lora_attn_modules"]]
    if lora_node.get("apply_lora_to_mlp"):
        targets += LORA_MLP_MODULES
    if lora_node.get("apply_lora_to_output"):
        targets.append("lm_head")
    return targets


def quantized_rows(family: str, lora_node: dict) -> dict[str, list]:
    """transformers module name -> the row ranges (or row indices, in tune's order) of its weight that QLoRA
    quantises: the weights of tune's LoRA layers. Phi-3 fuses q/k/v into ``qkv_proj`` and gate/up into
    ``gate_up_proj``; each part was its own tune layer (its own NF4 tensor), and k_proj without LoRA stays
    unquantised."""
    targets = hf_lora_targets(lora_node)
    if family in ("llama4", "llama4_maverick"):
        # tune quantises q/k in its RoPE row order (each head's even rows, then its odd ones), which groups the NF4
        # block scales differently: an index of the rows in that order (tune/models/llama4/_convert_weights.py)
        rows: dict[str, list] = {name: [slice(None)] for name in targets}
        for name, heads in (("q_proj", NUM_HEADS), ("k_proj", NUM_KV_HEADS)):
            if name in rows:
                rows[name] = [torch.arange(heads * HEAD_DIM).view(heads, HEAD_DIM // 2, 2).transpose(1, 2).flatten()]
        return rows
    if family not in ("phi3", "phi3_128k", "phi4"):
        return {name: [slice(None)] for name in targets}
    q, kv = NUM_HEADS * EMBED_DIM // NUM_HEADS, NUM_KV_HEADS * EMBED_DIM // NUM_HEADS
    parts = {"q_proj": ("qkv_proj", slice(0, q)), "k_proj": ("qkv_proj", slice(q, q + kv))}
    parts.update(v_proj=("qkv_proj", slice(q + kv, q + 2 * kv)), o_proj=("o_proj", slice(None)))
    parts.update(gate_proj=("gate_up_proj", slice(0, INTERMEDIATE_DIM)))
    parts.update(up_proj=("gate_up_proj", slice(INTERMEDIATE_DIM, 2 * INTERMEDIATE_DIM)))
    parts.update(down_proj=("down_proj", slice(None)), lm_head=("lm_head", slice(None)))
    rows: dict[str, list[slice]] = {}
    for name in targets:
        module, part = parts[name]
        rows.setdefault(module, []).append(part)
    return rows


def nf4_round_trip(weight: torch.Tensor) -> torch.Tensor:
    """QLoRA's 4-bit NormalFloat round trip through torchao: blocks of 64 values, block scales double-quantised
    in the groups tune picks for the shape (the QLoRA paper's 256 at real sizes; smaller groups for tiny weights,
    so that FSDP can split them: see tune.modules.peft.nf4_block_sizes and its tests)."""
    from torchao.quantization import to_nf4

    from tune.modules.peft import nf4_block_sizes

    return to_nf4(weight.detach(), *nf4_block_sizes(weight.shape)).get_original_weight().to(weight.dtype)


@torch.no_grad()
def nf4_round_trip_experts(model: torch.nn.Module) -> None:
    """QLoRA's NF4 round trip of every expert weight of a transformers MoE model (qwen3_moe, llama4), in place, as tune
    stores them under QLoRA (adapted or not): gate, up and down each flattened to ``[num_experts * out, in]`` and
    quantised as one matrix (tune.modules.moe.SwiGLUExperts with quantize_base=True)."""
    for module in model.modules():
        stacked = getattr(module, "gate_up_proj", None)
        if not isinstance(stacked, torch.Tensor) or stacked.dim() != 3:  # not an experts module (Phi-3's is a Linear)
            continue
        # Llama 4 stores x @ W ([E, dim, 2 * hidden], [E, hidden, dim]): transposed to tune's [E, out, in] and back
        llama4 = type(module).__name__ == "Llama4TextExperts"
        gate_up = stacked.transpose(1, 2) if llama4 else stacked
        gate, up = gate_up.chunk(2, dim=1)  # [E, 2 * hidden, dim], gate rows first
        parts = [nf4_round_trip(part.reshape(-1, part.shape[-1])).view(part.shape) for part in (gate, up)]
        gate_up.copy_(torch.cat(parts, dim=1))
        down = module.down_proj.transpose(1, 2) if llama4 else module.down_proj
        down.copy_(nf4_round_trip(down.reshape(-1, down.shape[-1])).view(down.shape))


# Knowledge-distillation configs (knowledge_distillation_single_device): family -> shipped config. At tiny scale
# the teacher is the family's tiny checkpoint read by the family's full component builder: the shipped teacher's
# size (and, for llama3_2, its family llama3_1) cannot be kept, only its role (a frozen model, same vocabulary).
KD_CONFIGS = {
    "qwen2_5": "qwen2_5/1.5_to_0.5B_KD_lora_single_device.yaml",
    "qwen2": "qwen2/1.5_to_0.5B_KD_lora_single_device.yaml",
    "llama3_2": "llama3_2/8B_to_1B_KD_lora_single_device.yaml",
    "qwen3": "qwen3/1.7_to_0.6B_KD_lora_single_device.yaml",
    "gemma2": "gemma2/9B_to_2B_KD_lora_single_device.yaml",
}


# The multi-GPU post-training configs: family -> kind -> shipped config (relative to configs/). The kinds are
# lora_dpo (lora_dpo_distributed), full_dpo (full_dpo_distributed) and kd (knowledge_distillation_distributed).
DIST_POST_TRAINING_CONFIGS: dict[str, dict[str, str]] = {
    "llama2": {"lora_dpo": "llama2/7B_lora_dpo.yaml"},
    "llama3": {"lora_dpo": "llama3/8B_lora_dpo.yaml", "full_dpo": "llama3/8B_full_dpo.yaml"},
    "llama3_1": {"lora_dpo": "llama3_1/8B_lora_dpo.yaml", "full_dpo": "llama3_1/8B_full_dpo.yaml"},
    "llama3_2": {"kd": "llama3_2/8B_to_1B_KD_lora_distributed.yaml"},
    "llama3_3": {"lora_dpo": "llama3_3/70B_lora_dpo.yaml"},
    "qwen2_5": {
        "lora_dpo": "qwen2_5/7B_lora_dpo.yaml",
        "full_dpo": "qwen2_5/7B_full_dpo.yaml",
        "kd": "qwen2_5/1.5_to_0.5B_KD_lora_distributed.yaml",
    },
    "qwen2": {"kd": "qwen2/1.5_to_0.5B_KD_lora_distributed.yaml"},
    "qwen3": {
        "lora_dpo": "qwen3/8B_lora_dpo.yaml",
        "full_dpo": "qwen3/8B_full_dpo.yaml",
        "kd": "qwen3/1.7_to_0.6B_KD_lora_distributed.yaml",
    },
    "gemma2": {
        "lora_dpo": "gemma2/9B_lora_dpo.yaml",
        "full_dpo": "gemma2/9B_full_dpo.yaml",
        "kd": "gemma2/9B_to_2B_KD_lora_distributed.yaml",
    },
}


def teacher_overrides(family: str, hf_dir: Path, model_type: str) -> list[str]:
    """``teacher_model.*`` and ``teacher_checkpointer.*`` overrides: the family's full component builder with the
    tiny dimensions, reading the tiny checkpoint in ``hf_dir`` as ``model_type``."""
    overrides = ["teacher_" + override for override in model_overrides(family, "full")]
    overrides += [
        f"teacher_checkpointer.checkpoint_dir={hf_dir}",
        "teacher_checkpointer.checkpoint_files=[model.safetensors]",
        f"teacher_checkpointer.model_type={model_type}",
    ]
    return overrides
