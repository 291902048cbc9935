"""A Hugging Face causal LM as one GGUF file, the format of llama.cpp (and of Ollama, LM Studio, ...).

The file holds the weights (f32, f16, bf16 or 8-bit ``q8_0``), the hyperparameters under llama.cpp's key names, the
tokenizer (a SentencePiece vocabulary with its scores, or a byte-level BPE vocabulary with its merges; token types
and special token ids) and the chat template. Tensor names come from the ``gguf`` package's name map; what differs
between architectures (llama.cpp's name for it, its RoPE layout, Gemma's norm offset) is one row of
:data:`GGUF_ARCHITECTURES`, keyed by ``config.json``'s ``model_type``.
"""

import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tune.training.checkpointing._export import ExportSource, open_checkpoint, read_chat_template
from tune.training.checkpointing._formats import permute_hf_to_meta
from tune.training.checkpointing._io import CheckpointError, read_json

# --dtype of `tune export --format gguf`: the type of the matrices (norms, biases and RoPE factors stay f32, as
# llama.cpp keeps them)
GGUF_EXPORT_DTYPES = ("f16", "bf16", "f32", "q8_0")
_Q8_0_BLOCK = 32  # a q8_0 block: 32 weights sharing one f16 scale; a row of another length is written f16
_TOKEN_NORMAL, _TOKEN_UNKNOWN, _TOKEN_CONTROL, _TOKEN_USER_DEFINED, _TOKEN_UNUSED, _TOKEN_BYTE = 1, 2, 3, 4, 5, 6


def _gemma2_checks(config: Mapping[str, Any]) -> str | None:
    # llama.cpp scales Gemma 2's attention by 1/sqrt(head_dim) (by 1/sqrt(hidden_size / num_heads) for the 27B
    # model) and reads no query_pre_attn_scalar: any other value would give a different model
    head_dim, scalar = _head_dim(config), config.get("query_pre_attn_scalar", 256)
    if scalar not in (head_dim, config["hidden_size"] // config["num_attention_heads"]):
        return f"query_pre_attn_scalar {scalar} differs from head_dim {head_dim}, which llama.cpp assumes"
    return None


def _gemma2_metadata(config: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "add_attn_logit_softcapping": config.get("attn_logit_softcapping"),
        "add_final_logit_softcapping": config.get("final_logit_softcapping"),
        "add_sliding_window": config.get("sliding_window"),
    }


def _sliding_window_metadata(config: Mapping[str, Any]) -> dict[str, Any]:
    return {"add_sliding_window": config.get("sliding_window")}


@dataclass(frozen=True)
class GGUFArchitecture:
    """How llama.cpp names and lays out one Hugging Face architecture.

    Args:
        name (str): llama.cpp's architecture (``general.architecture``; Mistral is ``llama`` there).
        interleaved_rope (bool): llama.cpp rotates interleaved pairs of the head dimension for it (Meta's layout),
            so q/k projection rows are permuted from transformers' rotate_half order. Default False.
        norm_offset (float): added to every RMSNorm weight: Gemma's norms scale by ``1 + w``, llama.cpp's by ``w``.
            Default 0.
        bpe_pre (str): llama.cpp's pre-tokenizer (``tokenizer.ggml.pre``: how text is split before byte-level BPE)
            for this family's BPE tokenizers. Default ``"default"``.
        metadata (Callable | None): ``config -> {GGUFWriter method: value}`` for the architecture's own
            hyperparameters (None values are left out).
        check (Callable | None): ``config -> problem or None``: a setting llama.cpp cannot represent.
    """

    name: str
    interleaved_rope: bool = False
    norm_offset: float = 0.0
    bpe_pre: str = "default"
    metadata: Callable[[Mapping[str, Any]], dict[str, Any]] | None = field(default=None, compare=False)
    check: Callable[[Mapping[str, Any]], str | None] | None = field(default=None, compare=False)


# config.json `model_type` -> llama.cpp's architecture. Families with no row here (MoE, vision-language, Gemma 3's
# interleaved local/global attention, LongRoPE) are refused with one line naming the supported types.
GGUF_ARCHITECTURES: dict[str, GGUFArchitecture] = {
    "llama": GGUFArchitecture("llama", interleaved_rope=True, bpe_pre="llama-bpe"),  # Llama 2, 3, 3.1-3.3, Code Llama
    "mistral": GGUFArchitecture("llama", interleaved_rope=True, bpe_pre="tekken"),  # Mistral 7B, NeMo (tekken BPE)
    "qwen2": GGUFArchitecture("qwen2", bpe_pre="qwen2"),  # Qwen 2, Qwen 2.5
    "qwen3": GGUFArchitecture("qwen3", bpe_pre="qwen2"),
    # Phi-3 (SentencePiece) and Phi-4 (cl100k BPE, which splits text as Llama 3 does)
    "phi3": GGUFArchitecture("phi3", bpe_pre="llama-bpe", metadata=_sliding_window_metadata),
    "gemma": GGUFArchitecture("gemma", norm_offset=1.0),
    "gemma2": GGUFArchitecture("gemma2", norm_offset=1.0, metadata=_gemma2_metadata, check=_gemma2_checks),
}
_FILE_TYPES = {"f32": "ALL_F32", "f16": "MOSTLY_F16", "bf16": "MOSTLY_BF16", "q8_0": "MOSTLY_Q8_0"}


def gguf_architecture(hf_config: Mapping[str, Any]) -> GGUFArchitecture:
    """The GGUF architecture of a ``config.json``, or a one-line error saying why it has none.

    Args:
        hf_config (Mapping[str, Any]): ``config.json``.

    Returns:
        GGUFArchitecture: the row of :data:`GGUF_ARCHITECTURES`.

    Raises:
        CheckpointError: for a model type or setting tune cannot write as GGUF.
    """
    model_type = hf_config.get("model_type")
    architecture = GGUF_ARCHITECTURES.get(model_type)
    if architecture is None:
        raise CheckpointError(
            f"GGUF export does not support model_type {model_type!r}; supported: {', '.join(GGUF_ARCHITECTURES)}. "
            "Use --format hf and a converter for that architecture"
        )
    heads = [a for a in hf_config.get("architectures") or [] if not a.endswith("ForCausalLM")]
    if heads:
        raise CheckpointError(f"GGUF export writes causal language models; this checkpoint is a {heads[0]}")
    rope_type = _rope(hf_config).get("rope_type", "default")
    if rope_type not in ("default", "linear", "llama3"):
        raise CheckpointError(
            f"GGUF export does not support {model_type} with RoPE scaling {rope_type!r} "
            "(supported: none, linear, llama3)"
        )
    problem = architecture.check(hf_config) if architecture.check else None
    if problem:
        raise CheckpointError(f"GGUF export cannot represent this {model_type} model: {problem}")
    return architecture


def export_gguf(
    checkpoint: str | Path,
    out_path: str | Path,
    *,
    dtype: str = "f16",
    base_dir: str | Path | None = None,
) -> Path:
    """Writes a checkpoint as one GGUF file: weights, hyperparameters, tokenizer and chat template.

    Args:
        checkpoint (str | Path): a run's ``output_dir`` (its newest checkpoint), a ``step_N`` directory (a LoRA
            adapter-only one is merged into its base model) or a Hugging Face model directory.
        out_path (str | Path): the ``.gguf`` file to create (must not exist); written beside it and renamed.
        dtype (str): the matrices' type: ``"f16"``, ``"bf16"``, ``"f32"`` or ``"q8_0"``. Default ``"f16"``.
        base_dir (str | Path | None): the base model of an adapter-only checkpoint (see
            ``tune.training.checkpointing._export.open_checkpoint``).

    Returns:
        Path: ``out_path``.

    Raises:
        CheckpointError: for an architecture, RoPE scaling or tokenizer GGUF export does not support (one line),
            an unknown ``dtype``, an existing ``out_path``, or an unreadable checkpoint.
        ImportError: when the ``gguf`` package is not installed (``pip install 'tune[export]'``).
    """
    if dtype not in GGUF_EXPORT_DTYPES:
        raise CheckpointError(
            f"--dtype {dtype} is not a GGUF type tune writes; choose one of {', '.join(GGUF_EXPORT_DTYPES)}"
        )
    gguf = _import_gguf()
    source = open_checkpoint(checkpoint, base_dir)
    config = source.hf_config
    architecture = gguf_architecture(config)
    out_path = Path(out_path).expanduser()
    if out_path.exists():
        raise CheckpointError(f"{out_path} exists; choose another --out or remove it")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    temp = out_path.with_name(f".{out_path.name}.partial")
    writer = gguf.GGUFWriter(temp, architecture.name, use_temp_file=True)
    try:
        writer.add_name(_model_name(source.checkpoint_dir))
        writer.add_file_type(int(getattr(gguf.LlamaFileType, _FILE_TYPES[dtype])))
        if dtype == "q8_0":
            writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        _add_hyperparameters(writer, config, architecture)
        _add_tokenizer(writer, source, architecture)
        _add_tensors(writer, gguf, source, architecture, dtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(temp, out_path)
    finally:
        temp.unlink(missing_ok=True)
    return out_path


def llama3_rope_factors(head_dim: int, rope: Mapping[str, Any]) -> torch.Tensor:
    """What Llama 3.1's RoPE scaling divides each rotary frequency by (llama.cpp's ``rope_freqs`` tensor).

    Frequencies whose wavelength is shorter than ``original_max_position_embeddings / high_freq_factor`` are
    kept, those longer than ``original_max_position_embeddings / low_freq_factor`` are divided by ``factor``, and
    the ones between interpolate linearly in ``1 / divisor`` (Meta's Llama 3.1 release, ``apply_scaling``).

    Args:
        head_dim (int): the rotated dimensions of a head.
        rope (Mapping[str, Any]): ``rope_theta``, ``factor``, ``low_freq_factor``, ``high_freq_factor``,
            ``original_max_position_embeddings``.

    Returns:
        torch.Tensor: ``[head_dim / 2]`` float32 divisors.
    """
    inv_freq = 1.0 / rope["rope_theta"] ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    wavelength = 2 * math.pi / inv_freq
    context, factor = rope["original_max_position_embeddings"], rope["factor"]
    low, high = rope["low_freq_factor"], rope["high_freq_factor"]
    smooth = (context / wavelength - low) / (high - low)
    between = 1.0 / ((1 - smooth) / factor + smooth)
    divisor = torch.where(wavelength < context / high, 1.0, torch.where(wavelength > context / low, factor, between))
    return divisor.float()


def _model_name(checkpoint_dir: Path) -> str:
    # a run's step_500 is named after its run: "lora_single_device-step_500"
    if re.fullmatch(r"(step|epoch)_\d+", checkpoint_dir.name):
        return f"{checkpoint_dir.resolve().parent.name}-{checkpoint_dir.name}"
    return checkpoint_dir.name


def _import_gguf():
    try:
        import gguf
    except ImportError as err:
        raise ImportError(
            "GGUF export needs the optional package `gguf`, which is not installed. Run: pip install 'tune[export]'"
        ) from err
    return gguf


def _head_dim(config: Mapping[str, Any]) -> int:
    return config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]


def _rope(config: Mapping[str, Any]) -> dict[str, Any]:
    """RoPE settings from either spelling of config.json: ``rope_parameters`` (transformers 5) or ``rope_theta`` and
    ``rope_scaling`` (earlier releases)."""
    rope = dict(config.get("rope_scaling") or {})
    rope.update(config.get("rope_parameters") or {})
    rope.setdefault("rope_theta", config.get("rope_theta", 10_000.0))
    rope["rope_type"] = rope.get("rope_type") or rope.get("type") or "default"
    return rope


def _add_hyperparameters(writer, config: Mapping[str, Any], architecture: GGUFArchitecture) -> None:
    import gguf

    head_dim = _head_dim(config)
    rotary_dim = int(head_dim * config.get("partial_rotary_factor", 1.0))
    rope = _rope(config)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config.get("num_key_value_heads") or config["num_attention_heads"])
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_dimension_count(rotary_dim)
    writer.add_rope_freq_base(float(rope["rope_theta"]))
    writer.add_vocab_size(config["vocab_size"])
    if rope["rope_type"] == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(rope["factor"]))
    for method, value in (architecture.metadata(config) if architecture.metadata else {}).items():
        if value is not None:
            getattr(writer, method)(value)


def _add_tensors(writer, gguf, source: ExportSource, architecture: GGUFArchitecture, dtype: str) -> None:
    config = source.hf_config
    arch_enum = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == architecture.name)
    names = gguf.get_tensor_name_map(arch_enum, config["num_hidden_layers"])
    num_heads = config["num_attention_heads"]
    num_kv_heads = config.get("num_key_value_heads") or num_heads
    tied = config.get("tie_word_embeddings", False)
    rope = _rope(config)
    if rope["rope_type"] == "llama3":
        rotary_dim = int(_head_dim(config) * config.get("partial_rotary_factor", 1.0))
        factors = llama3_rope_factors(rotary_dim, rope).numpy()
        writer.add_tensor(gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ROPE_FREQS] + ".weight", factors)
    for _, state in source.files():
        for key, value in state.items():
            if key == "lm_head.weight" and tied:
                continue  # llama.cpp reuses token_embd when the file has no output.weight
            name = names.get_name(key, try_suffixes=(".weight", ".bias"))
            if name is None:
                raise CheckpointError(f"GGUF export: {key} has no name in llama.cpp's {architecture.name} architecture")
            value = value.float()
            if architecture.interleaved_rope and name.endswith(("attn_q.weight", "attn_q.bias")):
                value = _permute_rows(value, num_heads)
            elif architecture.interleaved_rope and name.endswith(("attn_k.weight", "attn_k.bias")):
                value = _permute_rows(value, num_kv_heads)
            if architecture.norm_offset and "norm" in name:
                value = value + architecture.norm_offset
            data, raw_dtype = _encode(value, dtype, gguf)
            writer.add_tensor(name, data, raw_dtype=raw_dtype)


def _permute_rows(value: torch.Tensor, num_heads: int) -> torch.Tensor:
    if value.dim() == 1:  # a bias: permuted like a weight of one column
        return permute_hf_to_meta(value.view(-1, 1), num_heads).view(-1)
    return permute_hf_to_meta(value, num_heads)


def _encode(value: torch.Tensor, dtype: str, gguf) -> tuple[Any, Any]:
    """A float32 tensor as the numpy array ``GGUFWriter.add_tensor`` takes, and its GGML type (None: from numpy)."""
    if value.dim() < 2 or dtype == "f32":
        return value.numpy(), None
    if dtype == "bf16":  # round to nearest even, as torch casts; written as raw bytes
        raw = value.to(torch.bfloat16).view(torch.int16).numpy().view("uint8")
        return raw, gguf.GGMLQuantizationType.BF16
    if dtype == "q8_0" and value.shape[-1] % _Q8_0_BLOCK == 0:
        return gguf.quants.quantize(value.numpy(), gguf.GGMLQuantizationType.Q8_0), gguf.GGMLQuantizationType.Q8_0
    return value.to(torch.float16).numpy(), None


@dataclass
class _Vocab:
    model: str  # "llama" (SentencePiece) or "gpt2" (byte-level BPE)
    tokens: list[str]
    types: list[int]
    scores: list[float] | None = None
    merges: list[str] | None = None
    add_space_prefix: bool | None = None
    ids: dict[str, int] = field(default_factory=dict)  # special-token ids found by the reader


def _add_tokenizer(writer, source: ExportSource, architecture: GGUFArchitecture) -> None:
    config = source.hf_config
    tokenizer_config_path = source.find_file("tokenizer_config.json")
    tokenizer_config = read_json(tokenizer_config_path, "tokenizer config") if tokenizer_config_path else {}
    tokenizer_json_path = source.find_file("tokenizer.json")
    tokenizer_json = read_json(tokenizer_json_path, "tokenizer") if tokenizer_json_path else None
    sentencepiece_path = source.find_file("tokenizer.model")
    if sentencepiece_path is not None and _is_sentencepiece(sentencepiece_path):
        vocab = _sentencepiece_vocab(sentencepiece_path, tokenizer_json, tokenizer_config)
    elif tokenizer_json is not None:
        vocab = _bpe_vocab(tokenizer_json, tokenizer_json_path)
    else:
        raise CheckpointError(
            f"GGUF export needs the tokenizer: {source.checkpoint_dir} has no tokenizer.json or SentencePiece "
            "tokenizer.model (copy the base model's tokenizer files into it)"
        )
    vocab_size = config["vocab_size"]
    if len(vocab.tokens) > vocab_size:
        raise CheckpointError(
            f"the tokenizer has {len(vocab.tokens)} tokens, more than the model's vocab_size {vocab_size}"
        )
    for index in range(len(vocab.tokens), vocab_size):  # the embedding's padding rows
        vocab.tokens.append(f"[PAD{index}]")
        vocab.types.append(_TOKEN_UNUSED)
        if vocab.scores is not None:
            vocab.scores.append(-1000.0)
    writer.add_tokenizer_model(vocab.model)
    if vocab.model == "gpt2":
        writer.add_tokenizer_pre(architecture.bpe_pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.types)
    if vocab.scores is not None:
        writer.add_token_scores(vocab.scores)
    if vocab.merges is not None:
        writer.add_token_merges(vocab.merges)
    if vocab.add_space_prefix is not None:
        writer.add_add_space_prefix(vocab.add_space_prefix)
    ids = _special_ids(vocab, tokenizer_config, config)
    for name, token_id in ids.items():
        getattr(writer, f"add_{name}_token_id")(token_id)
    add_bos = tokenizer_config.get("add_bos_token")
    if add_bos is None:  # what transformers does: tokenizer.json's post-processor, else SentencePiece's bos
        add_bos = _post_processor_adds_bos(tokenizer_json) if tokenizer_json is not None else vocab.model == "llama"
    writer.add_add_bos_token(bool(add_bos) and "bos" in ids)
    writer.add_add_eos_token(bool(tokenizer_config.get("add_eos_token", False)))
    template = next((t for d in source.file_dirs() if (t := read_chat_template(d)) is not None), None)
    if template is not None:
        writer.add_chat_template(template)


def _is_sentencepiece(path: Path) -> bool:
    # Llama 3's original/tokenizer.model is tiktoken's text format, not a SentencePiece model
    import sentencepiece

    try:
        sentencepiece.SentencePieceProcessor(model_file=str(path))
    except (RuntimeError, OSError):
        return False
    return True


def _sentencepiece_vocab(path: Path, tokenizer_json: Mapping | None, tokenizer_config: Mapping) -> _Vocab:
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor(model_file=str(path))
    tokens, scores, types = [], [], []
    for index in range(processor.vocab_size()):
        tokens.append(processor.id_to_piece(index))
        scores.append(processor.get_score(index))
        if processor.is_unknown(index):
            types.append(_TOKEN_UNKNOWN)
        elif processor.is_control(index):
            types.append(_TOKEN_CONTROL)
        elif processor.is_unused(index):
            types.append(_TOKEN_UNUSED)
        elif processor.is_byte(index):
            types.append(_TOKEN_BYTE)
        else:
            types.append(_TOKEN_NORMAL)
    # tokens added on top of the SentencePiece model (Phi-3's <|user|>, ...): control when special
    for token in _added_tokens(tokenizer_json, tokenizer_config):
        index = token["id"]
        while len(tokens) <= index:
            tokens.append(f"[PAD{len(tokens)}]")
            scores.append(-1000.0)
            types.append(_TOKEN_UNUSED)
        if index >= processor.vocab_size() or types[index] == _TOKEN_NORMAL:
            tokens[index] = token["content"]
            scores[index] = 0.0
            types[index] = _TOKEN_CONTROL if token.get("special", True) else _TOKEN_USER_DEFINED
    special = {
        "bos": processor.bos_id(),
        "eos": processor.eos_id(),
        "unk": processor.unk_id(),
        "pad": processor.pad_id(),
    }
    # the dummy prefix: "a" is "▁a" when the model prepends a space to the text
    add_space_prefix = processor.encode("a", out_type=str)[0].startswith("\u2581")
    return _Vocab(
        "llama", tokens, types, scores=scores, add_space_prefix=add_space_prefix,
        ids={name: index for name, index in special.items() if index >= 0},
    )  # fmt: skip


def _bpe_vocab(tokenizer_json: Mapping, path: Path) -> _Vocab:
    model = tokenizer_json.get("model") or {}
    if model.get("type") != "BPE" or not _is_byte_level(tokenizer_json):
        hint = (
            " with byte fallback (SentencePiece style): add its tokenizer.model" if model.get("byte_fallback") else ""
        )
        raise CheckpointError(
            f"GGUF export reads byte-level BPE tokenizers from tokenizer.json; {path} is a {model.get('type')} "
            f"tokenizer{hint}"
        )
    entries = {index: (token, _TOKEN_NORMAL) for token, index in model["vocab"].items()}
    for token in _added_tokens(tokenizer_json, {}):
        entries[token["id"]] = (token["content"], _TOKEN_CONTROL if token.get("special") else _TOKEN_USER_DEFINED)
    size = max(entries) + 1
    tokens = [entries.get(i, (f"[PAD{i}]", _TOKEN_UNUSED))[0] for i in range(size)]
    types = [entries.get(i, (None, _TOKEN_UNUSED))[1] for i in range(size)]
    # merges are "a b" strings, or [a, b] pairs in tokenizers >= 0.20
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    return _Vocab("gpt2", tokens, types, merges=merges)


def _is_byte_level(tokenizer_json: Mapping) -> bool:
    def has_byte_level(node: Any) -> bool:
        if isinstance(node, Mapping):
            return node.get("type") == "ByteLevel" or any(has_byte_level(v) for v in node.values())
        if isinstance(node, list):
            return any(has_byte_level(v) for v in node)
        return False

    return has_byte_level(tokenizer_json.get("pre_tokenizer")) or has_byte_level(tokenizer_json.get("decoder"))


def _added_tokens(tokenizer_json: Mapping | None, tokenizer_config: Mapping) -> list[dict[str, Any]]:
    """The added tokens with their ids: tokenizer.json's ``added_tokens``, else tokenizer_config.json's
    ``added_tokens_decoder``."""
    if tokenizer_json is not None and tokenizer_json.get("added_tokens"):
        return list(tokenizer_json["added_tokens"])
    decoder = tokenizer_config.get("added_tokens_decoder") or {}
    return [{"id": int(index), **token} for index, token in decoder.items()]


def _special_ids(vocab: _Vocab, tokenizer_config: Mapping, config: Mapping) -> dict[str, int]:
    """bos/eos/unk/pad ids: tokenizer_config.json's tokens, else config.json's ids, else the tokenizer model's."""
    lookup: dict[str, int] = {}
    for index, token in enumerate(vocab.tokens):
        lookup.setdefault(token, index)
    ids = {}
    for name in ("bos", "eos", "unk", "pad"):
        token = tokenizer_config.get(f"{name}_token")
        if isinstance(token, Mapping):
            token = token.get("content")
        from_config = config.get(f"{name}_token_id")
        if isinstance(from_config, list):
            from_config = from_config[0] if from_config else None
        if isinstance(token, str) and token in lookup:
            ids[name] = lookup[token]
        elif isinstance(from_config, int):
            ids[name] = from_config
        elif name in vocab.ids:
            ids[name] = vocab.ids[name]
    return ids


def _post_processor_adds_bos(tokenizer_json: Mapping | None) -> bool:
    """Whether tokenizer.json's post-processor puts a special token before the text (Llama 3's <|begin_of_text|>)."""

    def template(node: Any) -> list | None:
        if isinstance(node, Mapping):
            if node.get("type") == "TemplateProcessing":
                return node.get("single")
            for child in node.get("processors") or []:
                found = template(child)
                if found is not None:
                    return found
        return None

    single = template((tokenizer_json or {}).get("post_processor"))
    return bool(single) and "SpecialToken" in single[0]
