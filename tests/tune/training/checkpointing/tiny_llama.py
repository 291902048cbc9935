"""A tiny Llama written in tune's module names, with its HF converters, registered as a test model family.

The checkpointers find converters only through ``tune.registry``; this family lets their tests run against
``transformers.LlamaForCausalLM`` (the reference) without depending on ``tune.models``.
"""

import json
import re
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from tune.modules.peft import DoRALinear, LoRALinear
from tune.registry import ModelFamily, register_model_family

FAMILY = "ckpt_test_llama"
HF_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "max_position_embeddings": 64,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "mlp_bias": False,
    "hidden_act": "silu",
}

# (tune key pattern, HF key template)
_KEYS = [
    (r"tok_embeddings\.weight", "model.embed_tokens.weight"),
    (r"norm\.scale", "model.norm.weight"),
    (r"output\.weight", "lm_head.weight"),
    (r"layers\.(\d+)\.attn\.q_proj\.weight", "model.layers.{}.self_attn.q_proj.weight"),
    (r"layers\.(\d+)\.attn\.k_proj\.weight", "model.layers.{}.self_attn.k_proj.weight"),
    (r"layers\.(\d+)\.attn\.v_proj\.weight", "model.layers.{}.self_attn.v_proj.weight"),
    (r"layers\.(\d+)\.attn\.output_proj\.weight", "model.layers.{}.self_attn.o_proj.weight"),
    (r"layers\.(\d+)\.mlp\.w1\.weight", "model.layers.{}.mlp.gate_proj.weight"),
    (r"layers\.(\d+)\.mlp\.w2\.weight", "model.layers.{}.mlp.down_proj.weight"),
    (r"layers\.(\d+)\.mlp\.w3\.weight", "model.layers.{}.mlp.up_proj.weight"),
    (r"layers\.(\d+)\.sa_norm\.scale", "model.layers.{}.input_layernorm.weight"),
    (r"layers\.(\d+)\.mlp_norm\.scale", "model.layers.{}.post_attention_layernorm.weight"),
]


def _rename(state_dict, table):
    out = {}
    for key, value in state_dict.items():
        for pattern, template in table:
            match = re.fullmatch(pattern, key)
            if match:
                out[template.format(*match.groups())] = value
                break
        else:
            raise ValueError(f"unexpected key {key}")
    return out


def tune_to_hf(state_dict, config):
    return _rename(state_dict, _KEYS)


def hf_to_tune(state_dict, config):
    inverse = [(re.escape(t).replace(r"\{\}", r"(\d+)"), p.replace(r"(\d+)", "{}").replace("\\", "")) for p, t in _KEYS]
    return _rename(state_dict, inverse)


def register() -> ModelFamily:
    return register_model_family(
        ModelFamily(name=FAMILY, hf_to_tune=hf_to_tune, tune_to_hf=tune_to_hf, hf_model_types=("llama",)),
        overwrite=True,
    )


class _RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.scale


def _linear(in_dim, out_dim, lora):
    if lora is None:
        return nn.Linear(in_dim, out_dim, bias=False)
    cls = DoRALinear if lora.get("use_dora") else LoRALinear
    return cls(in_dim, out_dim, rank=lora["rank"], alpha=lora["alpha"])


class _Attention(nn.Module):
    def __init__(self, cfg, lora, lora_modules):
        super().__init__()
        dim, self.heads, self.kv_heads, self.head_dim = (
            cfg["hidden_size"],
            cfg["num_attention_heads"],
            cfg["num_key_value_heads"],
            cfg["head_dim"],
        )
        pick = lambda name: lora if lora is not None and name in lora_modules else None  # noqa: E731
        self.q_proj = _linear(dim, self.heads * self.head_dim, pick("q_proj"))
        self.k_proj = _linear(dim, self.kv_heads * self.head_dim, pick("k_proj"))
        self.v_proj = _linear(dim, self.kv_heads * self.head_dim, pick("v_proj"))
        self.output_proj = _linear(self.heads * self.head_dim, dim, pick("output_proj"))
        self.theta = cfg["rope_theta"]

    def _rope(self, x):  # x [b, h, s, d], rotate_half layout as in transformers
        s, d = x.shape[-2], x.shape[-1]
        inv_freq = 1.0 / (self.theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
        freqs = torch.outer(torch.arange(s).float(), inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)
        x1, x2 = x[..., : d // 2], x[..., d // 2 :]
        return x * emb.cos() + torch.cat([-x2, x1], dim=-1) * emb.sin()

    def forward(self, x):
        b, s, _ = x.shape
        q = self._rope(self.q_proj(x).view(b, s, self.heads, self.head_dim).transpose(1, 2))
        k = self._rope(self.k_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2))
        v = self.v_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        repeat = self.heads // self.kv_heads
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.output_proj(out.transpose(1, 2).reshape(b, s, -1))


class _MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.w1 = nn.Linear(cfg["hidden_size"], cfg["intermediate_size"], bias=False)
        self.w2 = nn.Linear(cfg["intermediate_size"], cfg["hidden_size"], bias=False)
        self.w3 = nn.Linear(cfg["hidden_size"], cfg["intermediate_size"], bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class _Layer(nn.Module):
    def __init__(self, cfg, lora, lora_modules):
        super().__init__()
        self.sa_norm = _RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.attn = _Attention(cfg, lora, lora_modules)
        self.mlp_norm = _RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.mlp = _MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.sa_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class TinyLlama(nn.Module):
    """Llama in tune's names; ``lora={"rank": r, "alpha": a, "use_dora": bool}`` adapts ``lora_modules``."""

    def __init__(self, cfg=HF_CONFIG, lora=None, lora_modules=("q_proj", "v_proj")):
        super().__init__()
        self.tok_embeddings = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
        self.layers = nn.ModuleList(_Layer(cfg, lora, lora_modules) for _ in range(cfg["num_hidden_layers"]))
        self.norm = _RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.output = nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False)

    def forward(self, tokens):
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.output(self.norm(x))


def make_hf_checkpoint(directory: Path, *, dtype=torch.float32, max_shard_size="40KB", seed=0, bin_format=False):
    """Writes a random tiny LlamaForCausalLM with transformers' own save_pretrained, plus tokenizer-like files."""
    import transformers

    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**HF_CONFIG)).to(dtype)
    if bin_format:  # transformers 5 writes only safetensors: write the legacy sharded .bin layout by hand
        model.config.save_pretrained(directory)
        state = model.state_dict()
        names = ["pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin"]
        weight_map = {key: names[i * 2 // len(state)] for i, key in enumerate(state)}
        for name in names:
            torch.save({k: v.clone() for k, v in state.items() if weight_map[k] == name}, directory / name)
        index = {"metadata": {}, "weight_map": weight_map}
        (directory / "pytorch_model.bin.index.json").write_text(json.dumps(index))
    else:
        model.save_pretrained(directory, max_shard_size=max_shard_size)
    (directory / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 64}))
    (directory / "special_tokens_map.json").write_text(json.dumps({"bos_token": "<s>"}))
    (directory / "tokenizer.json").write_text(json.dumps({"version": "1.0"}))
    return model


def reference_model(directory: Path):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(directory, torch_dtype=torch.float32).eval()
