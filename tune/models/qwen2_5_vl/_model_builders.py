"""Qwen2.5-VL model builders: the released sizes.

``MODEL_SIZES`` holds each size's dimensions (keyword arguments of :func:`qwen2_5_vl`) and the Hugging Face repo
whose ``config.json`` they are: the language model's keys at the top level of the file, the vision transformer's
under ``vision_config`` (all four sizes share it, except the merger's output width and, from 32B up, the
vision feed-forward width 3456 instead of 3420). ``max_position_embeddings`` is 128000 in every file. The
builders read the table. A ``lora_*`` builder is the size's LoRA builder (each part frozen, adapted or fully
trained); a ``qlora_*`` builder is the ``lora_*`` one with ``quantize_base=True``.
"""

from collections.abc import Sequence

from tune.models._common import ModelSize, qlora_builder
from tune.models.qwen2_5_vl._component_builders import Trainable, lora_qwen2_5_vl, qwen2_5_vl
from tune.models.qwen2_5_vl._model import Qwen2_5_VisionLanguageModel

# One size per row (kept as written: the formatter would give every argument a line of its own). The values are
# those of each repo's config.json; where a file leaves a key out, transformers' Qwen2_5_VLConfig default is the
# same as tune's (patch 14, temporal patch 2, merge 2, window 112, vision RoPE theta 1e4).
# fmt: off
MODEL_SIZES: dict[str, ModelSize] = {
    "qwen2_5_vl_3b": ModelSize("Qwen/Qwen2.5-VL-3B-Instruct", dict(
        vocab_size=151936, num_layers=36, num_heads=16, num_kv_heads=2, embed_dim=2048, intermediate_dim=11008,
        max_seq_len=128000, norm_eps=1e-6, rope_base=1_000_000.0, tie_word_embeddings=True,
        mrope_section=(16, 24, 24), vision_embed_dim=1280, vision_num_layers=32, vision_num_heads=16,
        vision_intermediate_dim=3420, vision_full_attention_layers=(7, 15, 23, 31), vision_window_size=112)),
    "qwen2_5_vl_7b": ModelSize("Qwen/Qwen2.5-VL-7B-Instruct", dict(
        vocab_size=152064, num_layers=28, num_heads=28, num_kv_heads=4, embed_dim=3584, intermediate_dim=18944,
        max_seq_len=128000, norm_eps=1e-6, rope_base=1_000_000.0, tie_word_embeddings=False,
        mrope_section=(16, 24, 24), vision_embed_dim=1280, vision_num_layers=32, vision_num_heads=16,
        vision_intermediate_dim=3420, vision_full_attention_layers=(7, 15, 23, 31), vision_window_size=112)),
    "qwen2_5_vl_32b": ModelSize("Qwen/Qwen2.5-VL-32B-Instruct", dict(
        vocab_size=152064, num_layers=64, num_heads=40, num_kv_heads=8, embed_dim=5120, intermediate_dim=27648,
        max_seq_len=128000, norm_eps=1e-6, rope_base=1_000_000.0, tie_word_embeddings=False,
        mrope_section=(16, 24, 24), vision_embed_dim=1280, vision_num_layers=32, vision_num_heads=16,
        vision_intermediate_dim=3456, vision_full_attention_layers=(7, 15, 23, 31), vision_window_size=112)),
    "qwen2_5_vl_72b": ModelSize("Qwen/Qwen2.5-VL-72B-Instruct", dict(
        vocab_size=152064, num_layers=80, num_heads=64, num_kv_heads=8, embed_dim=8192, intermediate_dim=29568,
        max_seq_len=128000, norm_eps=1e-6, rope_base=1_000_000.0, tie_word_embeddings=False,
        mrope_section=(16, 24, 24), vision_embed_dim=1280, vision_num_layers=32, vision_num_heads=16,
        vision_intermediate_dim=3456, vision_full_attention_layers=(7, 15, 23, 31), vision_window_size=112)),
}
# fmt: on


def _full(name: str, decoder: bool, encoder: bool, fusion: bool) -> Qwen2_5_VisionLanguageModel:
    dims = MODEL_SIZES[name].dims
    return qwen2_5_vl(**dims, decoder_trainable=decoder, encoder_trainable=encoder, fusion_trainable=fusion)


def _lora(name: str, lora_attn_modules: Sequence[str], **kwargs: object) -> Qwen2_5_VisionLanguageModel:
    return lora_qwen2_5_vl(lora_attn_modules, **kwargs, **MODEL_SIZES[name].dims)


def qwen2_5_vl_3b(
    decoder_trainable: bool = True, encoder_trainable: bool = False, fusion_trainable: bool = True
) -> Qwen2_5_VisionLanguageModel:
    """Qwen2.5-VL 3B, randomly initialised (load weights with a checkpointer); each part trains or is frozen."""
    return _full("qwen2_5_vl_3b", decoder_trainable, encoder_trainable, fusion_trainable)


def lora_qwen2_5_vl_3b(
    lora_attn_modules: Sequence[str],
    decoder_trainable: Trainable = "lora",
    encoder_trainable: Trainable = "frozen",
    fusion_trainable: Trainable = "lora",
    apply_lora_to_mlp: bool = False,
    apply_lora_to_output: bool = False,
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
    quantize_base: bool = False,
) -> Qwen2_5_VisionLanguageModel:
    """:func:`qwen2_5_vl_3b` with LoRA where each part asks for it; arguments as in :func:`lora_qwen2_5_vl`."""
    return _lora("qwen2_5_vl_3b", **locals())


qlora_qwen2_5_vl_3b = qlora_builder(lora_qwen2_5_vl_3b)


def qwen2_5_vl_7b(
    decoder_trainable: bool = True, encoder_trainable: bool = False, fusion_trainable: bool = True
) -> Qwen2_5_VisionLanguageModel:
    """Qwen2.5-VL 7B, randomly initialised (load weights with a checkpointer); each part trains or is frozen."""
    return _full("qwen2_5_vl_7b", decoder_trainable, encoder_trainable, fusion_trainable)


def lora_qwen2_5_vl_7b(
    lora_attn_modules: Sequence[str],
    decoder_trainable: Trainable = "lora",
    encoder_trainable: Trainable = "frozen",
    fusion_trainable: Trainable = "lora",
    apply_lora_to_mlp: bool = False,
    apply_lora_to_output: bool = False,
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
    quantize_base: bool = False,
) -> Qwen2_5_VisionLanguageModel:
    """:func:`qwen2_5_vl_7b` with LoRA where each part asks for it; arguments as in :func:`lora_qwen2_5_vl`."""
    return _lora("qwen2_5_vl_7b", **locals())


qlora_qwen2_5_vl_7b = qlora_builder(lora_qwen2_5_vl_7b)


def qwen2_5_vl_32b(
    decoder_trainable: bool = True, encoder_trainable: bool = False, fusion_trainable: bool = True
) -> Qwen2_5_VisionLanguageModel:
    """Qwen2.5-VL 32B, randomly initialised (load weights with a checkpointer); each part trains or is frozen."""
    return _full("qwen2_5_vl_32b", decoder_trainable, encoder_trainable, fusion_trainable)


def lora_qwen2_5_vl_32b(
    lora_attn_modules: Sequence[str],
    decoder_trainable: Trainable = "lora",
    encoder_trainable: Trainable = "frozen",
    fusion_trainable: Trainable = "lora",
    apply_lora_to_mlp: bool = False,
    apply_lora_to_output: bool = False,
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
    quantize_base: bool = False,
) -> Qwen2_5_VisionLanguageModel:
    """:func:`qwen2_5_vl_32b` with LoRA where each part asks for it; arguments as in :func:`lora_qwen2_5_vl`."""
    return _lora("qwen2_5_vl_32b", **locals())


qlora_qwen2_5_vl_32b = qlora_builder(lora_qwen2_5_vl_32b)


def qwen2_5_vl_72b(
    decoder_trainable: bool = True, encoder_trainable: bool = False, fusion_trainable: bool = True
) -> Qwen2_5_VisionLanguageModel:
    """Qwen2.5-VL 72B, randomly initialised (load weights with a checkpointer); each part trains or is frozen."""
    return _full("qwen2_5_vl_72b", decoder_trainable, encoder_trainable, fusion_trainable)


def lora_qwen2_5_vl_72b(
    lora_attn_modules: Sequence[str],
    decoder_trainable: Trainable = "lora",
    encoder_trainable: Trainable = "frozen",
    fusion_trainable: Trainable = "lora",
    apply_lora_to_mlp: bool = False,
    apply_lora_to_output: bool = False,
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
    quantize_base: bool = False,
) -> Qwen2_5_VisionLanguageModel:
    """:func:`qwen2_5_vl_72b` with LoRA where each part asks for it; arguments as in :func:`lora_qwen2_5_vl`."""
    return _lora("qwen2_5_vl_72b", **locals())


qlora_qwen2_5_vl_72b = qlora_builder(lora_qwen2_5_vl_72b)
