"""GGUF export (tune/training/checkpointing/_gguf.py) checked against transformers' GGUF loader.

Each case is a tiny randomly initialised ``transformers`` checkpoint of one architecture with a tiny tokenizer of
its kind (SentencePiece or byte-level BPE) and a chat template. The exported file is loaded back with
``AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)`` (transformers' reader, independent of the writer):

- f16/bf16: its logits equal, within float32 tolerance, those of the original model with its matrices rounded to
  f16/bf16 (the only change the format makes), and differ from the float32 model by no more than the bound measured
  in ``_F16_BOUND``;
- q8_0: its logits equal those of the original model with its matrices put through q8_0 (written in the test from
  GGML's definition), and are within ``_Q8_0_BOUND`` of the float32 model's (measured, see below);
- the tokenizer read back from the file (``AutoTokenizer.from_pretrained(dir, gguf_file=...)``) gives the original
  tokenizer's ids, and the chat template is in the file.

Gemma (1) is written but transformers has no GGUF reader for it: its tensors are read back with ``gguf``'s reader.
Slow: every family of the recipe tests' tiny assets is written, or refused in one line naming the reason.
"""

import copy
import json
import shutil
from pathlib import Path

import pytest
import torch

pytest.importorskip("gguf")

from tests.tune.data import _tiny_tokenizers  # noqa: E402
from tests.tune.models._hf_cases import build_hf_model  # noqa: E402
from tune.training.checkpointing import CheckpointError, export_gguf  # noqa: E402
from tune.training.checkpointing._gguf import llama3_rope_factors  # noqa: E402

CHAT_TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
TEXTS = ["Hello world, 12 + 30 = 42.", "the answer is seven", "a b  c\nnew line", "café déjà vu"]
# Bounds on max |logits - float32 logits| over 2 x 24 tokens, 2.5-3 times the largest difference measured over the
# six architectures below (transformers 5.23, gguf 0.19; each test prints its numbers), on models whose logits reach
# 2.6 (llama2) to 10 (gemma2) with standard deviation 0.6-1.6: f16 1.7e-3 to 5.1e-3 (qwen2), bf16 1.3e-2 to 3.6e-2
# (qwen2), q8_0 4.8e-2 to 1.0e-1 (qwen2)
_F16_BOUND = 1.5e-2
_BF16_BOUND = 1e-1
_Q8_0_BOUND = 2.5e-1
# tiny dimensions: 2 layers, hidden 64, 4 heads of 16, 2 kv heads, MLP 128 (rows of 64 and 128: whole q8_0 blocks)
_DIMS = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)


def _sentencepiece_tokenizer(directory: Path, gemma: bool = False) -> int:
    """tokenizer.model and the transformers files made from it; returns the vocabulary size."""
    import transformers

    source = _tiny_tokenizers.sentencepiece_model(dummy_prefix=not gemma, gemma=gemma)
    shutil.copy(source / "tokenizer.model", directory / "tokenizer.model")
    tokenizer_class = transformers.GemmaTokenizer if gemma else transformers.LlamaTokenizer
    tokenizer = tokenizer_class.from_pretrained(directory)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(directory)
    return len(tokenizer)


def _phi3_tokenizer(directory: Path) -> int:
    """Phi-3's kind: tokenizer.model, and a tokenizer.json of the same model with Phi-3's special tokens after the
    SentencePiece vocabulary and its pipeline (the prefix space from a normaliser)."""
    from tokenizers import Tokenizer

    source = _tiny_tokenizers.phi3_tokenizer_dir()
    for name in ("tokenizer.model", "tokenizer.json"):
        shutil.copy(source / name, directory / name)
    config = json.loads((source / "tokenizer_config.json").read_text())
    (directory / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": CHAT_TEMPLATE}))
    return Tokenizer.from_file(str(source / "tokenizer.json")).get_vocab_size(with_added_tokens=True)


def _qwen_tokenizer(directory: Path, qwen3: bool = False) -> int:
    source = _tiny_tokenizers.qwen_tokenizer_json(qwen3=qwen3)
    shutil.copy(source / "tokenizer.json", directory / "tokenizer.json")
    config = json.loads((source / "tokenizer_config.json").read_text())
    config["chat_template"] = CHAT_TEMPLATE
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(source / "tokenizer.json")).get_vocab_size(with_added_tokens=True)


def _llama3_tokenizer(directory: Path) -> int:
    """A Llama-3-style tokenizer.json: byte-level BPE with Llama 3's split and <|begin_of_text|> added first."""
    from tokenizers import AddedToken, processors

    from tune.models.llama3._tokenizer import LLAMA3_PATTERN

    tokenizer = _tiny_tokenizers._train_byte_level_bpe(LLAMA3_PATTERN, vocab_size=600, nfc=False)
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    bos = tokenizer.token_to_id("<|begin_of_text|>")
    tokenizer.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", bos)]),
        ]
    )
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "chat_template": CHAT_TEMPLATE}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return tokenizer.get_vocab_size()


def _hf_config(family: str, vocab_size: int):
    import transformers

    common = dict(vocab_size=vocab_size, max_position_embeddings=256, **_DIMS)
    if family == "llama2":
        return transformers.LlamaConfig(
            rope_theta=10_000.0, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, **common
        )
    if family == "llama3_2":
        scaling = dict(
            rope_type="llama3", rope_theta=500_000.0, factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
            original_max_position_embeddings=16,
        )  # fmt: skip
        return transformers.LlamaConfig(rope_parameters=scaling, tie_word_embeddings=True, rms_norm_eps=1e-5, **common)
    if family == "mistral":
        return transformers.MistralConfig(rope_theta=1_000_000.0, rms_norm_eps=1e-5, sliding_window=None, **common)
    if family == "qwen2":
        return transformers.Qwen2Config(rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, **common)
    if family == "qwen3":  # head_dim 128 as released: transformers' GGUF reader takes Qwen3Config's default
        return transformers.Qwen3Config(head_dim=128, rope_theta=1_000_000.0, rms_norm_eps=1e-6, **common)
    if family == "phi3":
        return transformers.Phi3Config(
            rope_theta=10_000.0, rms_norm_eps=1e-5, tie_word_embeddings=False, pad_token_id=None, **common
        )
    if family == "gemma":
        return transformers.GemmaConfig(head_dim=16, rms_norm_eps=1e-6, hidden_act="gelu_pytorch_tanh", **common)
    if family == "gemma2":  # head_dim 256 = query_pre_attn_scalar, as in Gemma 2 2B/9B (llama.cpp assumes it)
        return transformers.Gemma2Config(
            head_dim=256, query_pre_attn_scalar=256, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
            sliding_window=4096, rms_norm_eps=1e-6, **common,
        )  # fmt: skip
    raise ValueError(family)


def _tokenizer_files(family: str, directory: Path) -> int:
    if family in ("llama2", "mistral"):
        return _sentencepiece_tokenizer(directory)
    if family == "phi3":
        return _phi3_tokenizer(directory)
    if family in ("gemma", "gemma2"):
        return _sentencepiece_tokenizer(directory, gemma=True)
    if family in ("qwen2", "qwen3"):
        return _qwen_tokenizer(directory, qwen3=family == "qwen3")
    return _llama3_tokenizer(directory)


def _tiny_checkpoint(family: str, directory: Path):
    """A tiny HF checkpoint of ``family`` in ``directory`` (vocab padded to a multiple of 64); returns the model."""
    directory.mkdir(parents=True)
    num_tokens = _tokenizer_files(family, directory)
    model = build_hf_model(_hf_config(family, -(-num_tokens // 64) * 64), seed=0)
    model.save_pretrained(directory)
    return model


def _load_gguf(path: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32, attn_implementation="eager"
    ).eval()


def _logits(model, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=tokens).logits


def _rounded(model, dtype: torch.dtype):
    """The model with its matrices rounded to ``dtype`` (norms and biases stay float32, as the export keeps them)."""
    rounded = copy.deepcopy(model)
    with torch.no_grad():
        for param in rounded.parameters():
            if param.dim() >= 2:
                param.copy_(param.to(dtype).float())
    return rounded


def _q8_0_round_trip(weight: torch.Tensor) -> torch.Tensor:
    """GGML's q8_0, written here from its definition (ggml-quants.c ``quantize_row_q8_0_ref``): blocks of 32
    weights, scale ``d = max|x| / 127`` stored as f16, ``q = round(x / d)`` (half away from zero), read as ``q * d``."""
    blocks = weight.reshape(-1, 32)
    scale = blocks.abs().amax(dim=1, keepdim=True) / 127
    inverse = torch.where(scale > 0, 1 / scale, torch.zeros_like(scale))
    scaled = blocks * inverse
    quantized = torch.sign(scaled) * torch.floor(scaled.abs() + 0.5)
    return (quantized * scale.half().float()).reshape(weight.shape)


def _q8_0_model(model):
    rounded = copy.deepcopy(model)
    with torch.no_grad():
        for param in rounded.parameters():
            if param.dim() >= 2:
                param.copy_(_q8_0_round_trip(param))
    return rounded


def _tokens(vocab_size: int) -> torch.Tensor:
    return torch.randint(3, vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("family", ["llama2", "qwen2", "qwen3", "mistral", "phi3", "gemma2"])
def test_f16_logits_match_the_rounded_model(tmp_path, family):
    model = _tiny_checkpoint(family, tmp_path / "hf")
    path = export_gguf(tmp_path / "hf", tmp_path / "model.f16.gguf", dtype="f16")
    tokens = _tokens(model.config.vocab_size)
    loaded = _logits(_load_gguf(path), tokens)
    exact = (loaded - _logits(_rounded(model, torch.float16), tokens)).abs().max().item()
    rounding = (loaded - _logits(model, tokens)).abs().max().item()
    print(f"{family} f16: vs f16-rounded model {exact:.2e}, vs float32 model {rounding:.2e}")
    assert exact < 1e-5
    assert rounding < _F16_BOUND


@pytest.mark.parametrize("family", ["llama2", "qwen2", "qwen3", "mistral", "phi3", "gemma2"])
def test_q8_0_and_bf16_logits_within_measured_bounds(tmp_path, family):
    model = _tiny_checkpoint(family, tmp_path / "hf")
    tokens = _tokens(model.config.vocab_size)
    reference = _logits(model, tokens)
    q8 = _logits(_load_gguf(export_gguf(tmp_path / "hf", tmp_path / "model.q8_0.gguf", dtype="q8_0")), tokens)
    bf16 = _logits(_load_gguf(export_gguf(tmp_path / "hf", tmp_path / "model.bf16.gguf", dtype="bf16")), tokens)
    bf16_exact = (bf16 - _logits(_rounded(model, torch.bfloat16), tokens)).abs().max().item()
    q8_exact = (q8 - _logits(_q8_0_model(model), tokens)).abs().max().item()
    q8_diff, bf16_diff = (q8 - reference).abs().max().item(), (bf16 - reference).abs().max().item()
    print(
        f"{family}: q8_0 vs float32 {q8_diff:.2e}, vs q8_0-rounded {q8_exact:.2e}; "
        f"bf16 vs float32 {bf16_diff:.2e}, vs bf16-rounded {bf16_exact:.2e}"
    )
    assert q8_exact < 1e-4 and q8_diff < _Q8_0_BOUND
    assert bf16_exact < 1e-5 and bf16_diff < _BF16_BOUND
    # q8_0 stores 34 bytes per 32 weights, f16 64: the file is about half the size
    f16 = export_gguf(tmp_path / "hf", tmp_path / "model.f16.gguf", dtype="f16")
    assert (tmp_path / "model.q8_0.gguf").stat().st_size < 0.6 * f16.stat().st_size


@pytest.mark.parametrize("family", ["llama2", "qwen2", "phi3", "gemma2", "llama3_2"])
def test_tokenizer_and_chat_template_inside_the_file(tmp_path, family):
    from transformers import AutoTokenizer

    _tiny_checkpoint(family, tmp_path / "hf")
    path = export_gguf(tmp_path / "hf", tmp_path / "model.gguf")
    original = AutoTokenizer.from_pretrained(tmp_path / "hf")
    loaded = AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    texts = TEXTS + ([f"<|user|>{TEXTS[0]}<|end|>"] if family == "phi3" else [])
    for text in texts:
        for add_special_tokens in (False, True):  # True: the bos the tokenizer adds (or not) too
            expected = original(text, add_special_tokens=add_special_tokens).input_ids
            assert loaded(text, add_special_tokens=add_special_tokens).input_ids == expected, text
    assert (loaded.bos_token, loaded.eos_token) == (original.bos_token, original.eos_token)
    if family == "llama3_2":  # its post-processor adds <|begin_of_text|>: the file says to add bos
        assert loaded(TEXTS[0]).input_ids[0] == loaded.convert_tokens_to_ids("<|begin_of_text|>")
    assert loaded.chat_template == CHAT_TEMPLATE

    from gguf import GGUFReader

    fields = GGUFReader(path).fields
    assert bytes(fields["tokenizer.chat_template"].parts[-1]).decode() == CHAT_TEMPLATE
    assert len(fields["tokenizer.ggml.tokens"].data) == original_vocab_size(tmp_path / "hf")


def original_vocab_size(directory: Path) -> int:
    return json.loads((directory / "config.json").read_text())["vocab_size"]


def test_llama3_rope_factors_are_transformers_frequency_ratios(tmp_path):
    # Llama 3.1/3.2 RoPE scaling is the `rope_freqs` tensor in GGUF (llama.cpp divides each frequency by it);
    # transformers' GGUF reader ignores it, so the weights are checked through the unscaled model and the
    # factors against transformers' own llama3 frequencies
    from gguf import GGUFReader
    from transformers import LlamaForCausalLM
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    model = _tiny_checkpoint("llama3_2", tmp_path / "hf")
    path = export_gguf(tmp_path / "hf", tmp_path / "model.gguf")
    tensors = {t.name: t for t in GGUFReader(path).tensors}
    assert "output.weight" not in tensors  # tied embeddings: llama.cpp reuses token_embd
    factors = torch.from_numpy(tensors["rope_freqs.weight"].data.copy())

    scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](model.config, "cpu")
    unscaled = 1.0 / 500_000.0 ** (torch.arange(0, 16, 2, dtype=torch.float32) / 16)
    torch.testing.assert_close(factors, unscaled / scaled, rtol=1e-5, atol=0)
    # the original context of 16 puts the head's 8 frequencies in both bands: interpolated and divided by 32
    assert 1.0 < factors[0] < 32.0 and factors[-1] == 32.0

    unscaled_config = copy.deepcopy(model.config)
    unscaled_config.rope_parameters = {"rope_type": "default", "rope_theta": 500_000.0}
    reference = LlamaForCausalLM(unscaled_config).eval()
    reference.load_state_dict(_rounded(model, torch.float16).state_dict())
    tokens = _tokens(model.config.vocab_size)
    diff = (_logits(_load_gguf(path), tokens) - _logits(reference, tokens)).abs().max().item()
    assert diff < 1e-5


def test_gemma_tensors_read_back(tmp_path):
    # transformers reads no Gemma (1) GGUF: the tensors are read back with gguf's reader, names mapped by hand
    from gguf import GGUFReader

    model = _tiny_checkpoint("gemma", tmp_path / "hf")
    path = export_gguf(tmp_path / "hf", tmp_path / "model.gguf", dtype="f32")
    reader = GGUFReader(path)
    tensors = {t.name: torch.from_numpy(t.data.copy()) for t in reader.tensors}
    state = model.state_dict()
    assert "output.weight" not in tensors
    torch.testing.assert_close(tensors["token_embd.weight"], state["model.embed_tokens.weight"], rtol=0, atol=0)
    # llama.cpp's Gemma norms scale by w, transformers' by 1 + w
    torch.testing.assert_close(
        tensors["blk.1.ffn_norm.weight"], state["model.layers.1.post_attention_layernorm.weight"] + 1
    )
    torch.testing.assert_close(tensors["output_norm.weight"], state["model.norm.weight"] + 1)
    # Gemma keeps transformers' rotate_half layout in llama.cpp: q is not permuted
    torch.testing.assert_close(
        tensors["blk.0.attn_q.weight"], state["model.layers.0.self_attn.q_proj.weight"], rtol=0, atol=0
    )
    assert bytes(reader.fields["general.architecture"].parts[-1]).decode() == "gemma"
    assert int(reader.fields["gemma.attention.key_length"].parts[-1][0]) == 16


def test_unsupported_architecture_is_one_line(tmp_path):
    directory = tmp_path / "hf"
    directory.mkdir()
    (directory / "config.json").write_text(
        json.dumps({"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"]})
    )
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(1)}, str(directory / "model.safetensors"))
    with pytest.raises(CheckpointError, match="does not support model_type 'qwen3_moe'; supported: llama, mistral"):
        export_gguf(directory, tmp_path / "model.gguf")
    assert not (tmp_path / "model.gguf").exists()


def test_longrope_is_refused(tmp_path):
    directory = tmp_path / "hf"
    directory.mkdir()
    config = {"model_type": "phi3", "rope_scaling": {"type": "longrope", "short_factor": [1.0], "long_factor": [1.0]}}
    (directory / "config.json").write_text(json.dumps(config))
    (directory / "model.safetensors").write_bytes(b"")
    with pytest.raises(CheckpointError, match="RoPE scaling 'longrope'"):
        export_gguf(directory, tmp_path / "model.gguf")


def test_llama3_rope_factors_bands():
    rope = dict(
        rope_theta=500_000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=8192,
    )  # fmt: skip
    factors = llama3_rope_factors(128, rope)  # Llama 3.1 8B
    assert factors.shape == (64,) and factors[0] == 1.0 and factors[-1] == 8.0
    assert ((factors[1:] - factors[:-1]) >= 0).all()  # longer wavelengths are divided more


# Every family of the recipe tests' tiny assets (tests/recipes/_family_assets.py: each family's released settings at
# tiny sizes, with a tiny tokenizer of its kind): written as GGUF, or refused with the reason. Llama 3's tiny
# tokenizer is a tiktoken file (the release's original/tokenizer.model), which GGUF export does not read: the Hugging
# Face repositories ship tokenizer.json beside it (test_tokenizer_and_chat_template_inside_the_file[llama3_2]).
_EVERY_FAMILY = {
    "llama2": None, "code_llama2": None, "mistral": None, "mistral_v0_3": None, "mistral_nemo": None,
    "qwen2": None, "qwen2_5": None, "qwen3": None, "phi3": None, "phi4": None, "gemma": None,
    "llama3": "needs the tokenizer", "llama3_1": "needs the tokenizer", "llama3_2": "needs the tokenizer",
    "llama3_3": "needs the tokenizer",
    "gemma2": "query_pre_attn_scalar 256 differs from head_dim 16",  # the tiny head size; Gemma 2's own is 256
    "gemma3": "does not support model_type 'gemma3_text'",
    "qwen3_moe": "does not support model_type 'qwen3_moe'",
    "llama4": "does not support model_type 'llama4_text'",
    "llama4_maverick": "does not support model_type 'llama4_text'",
    "phi3_128k": "RoPE scaling 'longrope'",
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(_EVERY_FAMILY))
def test_every_family_is_written_or_refused_in_one_line(tmp_path, family):
    from gguf import GGUFReader

    from tests.recipes._family_assets import FAMILIES, hf_config, tokenizer_file

    directory = tmp_path / "hf"
    model = build_hf_model(hf_config(family), seed=0)
    model.save_pretrained(directory)
    tokenizer = tokenizer_file(FAMILIES[family].tokenizer)
    for name in ("tokenizer.model", "tokenizer.json", "tokenizer_config.json"):
        if (tokenizer.parent / name).is_file():
            shutil.copy(tokenizer.parent / name, directory / name)
    expected = _EVERY_FAMILY[family]
    if expected is not None:
        with pytest.raises(CheckpointError, match=expected) as error:
            export_gguf(directory, tmp_path / "model.gguf")
        assert "\n" not in str(error.value)
        return
    reader = GGUFReader(export_gguf(directory, tmp_path / "model.gguf"))
    tied = model.config.tie_word_embeddings
    assert len(reader.tensors) == sum(1 for k in model.state_dict() if not (tied and k == "lm_head.weight"))
    assert len(reader.fields["tokenizer.ggml.tokens"].data) == model.config.vocab_size
