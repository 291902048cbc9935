"""Tiny Hugging Face configs, one per architecture feature set, shared by the model tests.

Sizes are small and deliberately odd (vocab 101, head_dim 10, intermediate 94, ...), with grouped-query attention
and each family's special features switched on. Windows and soft-caps are set small enough to change the
result on 12-token sequences.
"""

import torch

VOCAB = 101


def _llama(**overrides):
    from transformers import LlamaConfig

    kwargs = dict(
        vocab_size=VOCAB,
        hidden_size=60,
        intermediate_size=94,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rms_norm_eps=1e-5,
    )
    kwargs.update(overrides)
    return LlamaConfig(**kwargs)


def llama2_config():
    return _llama(num_key_value_heads=6, rope_theta=10_000.0)  # multi-head attention, plain RoPE


def llama3_1_config():
    # Llama 3.1 frequency scaling with a short original context so every band (kept, interpolated, scaled) occurs
    scaling = dict(
        rope_type="llama3", factor=4.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=16
    )
    return _llama(rope_theta=5_000.0, rope_scaling=scaling)


def llama3_2_config():
    scaling = dict(
        rope_type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=16
    )
    return _llama(num_key_value_heads=3, rope_theta=500_000.0, rope_scaling=scaling, tie_word_embeddings=True)


def mistral_config():
    from transformers import MistralConfig

    return MistralConfig(
        vocab_size=VOCAB,
        hidden_size=60,
        intermediate_size=94,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        max_position_embeddings=64,
        sliding_window=5,
        rope_theta=10_000.0,
    )


def mistral_nemo_config():
    from transformers import MistralConfig

    # Mistral NeMo: head_dim 14 != hidden_size / heads (60 / 6 = 10), as 128 != 5120 / 32; no window, theta 1e6
    return MistralConfig(
        vocab_size=VOCAB,
        hidden_size=60,
        intermediate_size=94,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        head_dim=14,
        max_position_embeddings=64,
        sliding_window=None,
        rope_theta=1_000_000.0,
    )


def qwen2_config():
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=60,
        intermediate_size=94,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rope_theta=1_000_000.0,
        tie_word_embeddings=True,
    )


def qwen3_config():
    from transformers import Qwen3Config

    # head_dim 16 != hidden_size / heads (60 / 6 = 10), as in the released Qwen3 sizes
    return Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=60,
        intermediate_size=94,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=64,
        rope_theta=1_000_000.0,
        tie_word_embeddings=False,
    )


def gemma_config():
    from transformers import GemmaConfig

    # head_dim 14 != hidden_size / heads (60 / 4 = 15), as at Gemma 7B (256 != 3072 / 16)
    return GemmaConfig(
        vocab_size=VOCAB,
        hidden_size=60,
        intermediate_size=94,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=14,
        max_position_embeddings=64,
        rope_theta=10_000.0,
        hidden_act="gelu_pytorch_tanh",
    )


def gemma2_config():
    from transformers import Gemma2Config

    return Gemma2Config(
        vocab_size=VOCAB,
        hidden_size=60,
        intermediate_size=94,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=14,
        max_position_embeddings=64,
        sliding_window=5,
        query_pre_attn_scalar=20,
        attn_logit_softcapping=3.0,
        final_logit_softcapping=4.0,
    )


def gemma3_config():
    from transformers import Gemma3TextConfig

    # 7 layers: the 6th is global, the others local (window 5 < 12 tokens); global RoPE linearly scaled, its theta
    # and the local one away from the defaults so that a swap of the two tables changes the logits
    return Gemma3TextConfig(
        vocab_size=VOCAB,
        hidden_size=60,
        intermediate_size=94,
        num_hidden_layers=7,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=14,
        max_position_embeddings=64,
        sliding_window=5,
        query_pre_attn_scalar=20,
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 5_000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 50.0},
        },
    )


def phi3_config():
    from transformers import Phi3Config

    return Phi3Config(
        vocab_size=VOCAB,
        hidden_size=60,
        intermediate_size=94,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        max_position_embeddings=64,
        original_max_position_embeddings=64,
        sliding_window=6,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )


def llama4_config():
    from transformers import Llama4TextConfig

    # 4 layers: dense and MoE alternating (sigmoid top-2 of 4 experts, a shared expert), the 4th without RoPE;
    # the RoPE layers attend in chunks of 4 tokens (< 12) with q/k norm; Llama 3 RoPE scaling as Scout's (factor 16,
    # equal frequency factors) over an 8-token original context. The NoPE layer's query temperature keeps the
    # release's floor_scale (8192: 1 at these positions; tests/tune/models/test_llama4.py checks it at 2)
    return Llama4TextConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=32,
        intermediate_size_mlp=96,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_local_experts=4,
        num_experts_per_tok=2,
        interleave_moe_layer_step=2,
        max_position_embeddings=64,
        attention_chunk_size=4,
        rope_parameters=dict(
            rope_type="llama3",
            rope_theta=500_000.0,
            factor=16.0,
            low_freq_factor=1.0,
            high_freq_factor=1.0,
            original_max_position_embeddings=8,
        ),
    )


CASES = {
    "llama2": llama2_config,
    "llama3_1": llama3_1_config,
    "llama3_2": llama3_2_config,
    "llama4": llama4_config,
    "mistral": mistral_config,
    "mistral_nemo": mistral_nemo_config,
    "qwen2_5": qwen2_config,
    "qwen3": qwen3_config,
    "gemma": gemma_config,
    "gemma2": gemma2_config,
    "gemma3": gemma3_config,
    "phi3": phi3_config,
}


def decoder_dims(config) -> dict:
    """The component-builder arguments (``vocab_size``, ``num_layers``, ...) of a transformers decoder config."""
    return dict(
        vocab_size=config.vocab_size,
        num_layers=config.num_hidden_layers,
        num_heads=config.num_attention_heads,
        num_kv_heads=config.num_key_value_heads,
        embed_dim=config.hidden_size,
        intermediate_dim=config.intermediate_size,
        max_seq_len=config.max_position_embeddings,
        norm_eps=config.rms_norm_eps,
    )


def build_hf_model(config, seed: int = 0):
    """A transformers causal LM with weights large enough that every feature changes the logits."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32)
    # Gemma's RMSNorm scales by (1 + weight), so its neutral weight is 0, not 1
    norm_center = 0.0 if config.model_type in ("gemma", "gemma2", "gemma3_text") else 1.0
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(norm_center + 0.2 * torch.randn_like(param))
            else:
                param.normal_(0.0, 0.2 if "embed" in name else 0.08)
    return model.eval()


def padded_batch(seed: int = 1):
    """Three left-padded rows of 12 tokens: the attention mask and positions that skip the padding."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(3, VOCAB, (3, 12), generator=generator)
    attention_mask = torch.ones(3, 12, dtype=torch.long)
    attention_mask[1, :3] = 0
    attention_mask[2, :7] = 0
    tokens[attention_mask == 0] = 0
    positions = ((attention_mask.cumsum(-1) - 1) * attention_mask).clamp(min=0)
    return tokens, attention_mask, positions
