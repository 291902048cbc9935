"""Gemma 3 with images, component builders: the model as a function of its dimensions and of which parts train.

Three parts, with torchtune's names for the choices: the language model (``decoder``, the ``gemma3`` family's), the
SigLIP vision encoder (``encoder``) and the multimodal projector (``fusion``). A full builder takes a bool per part
and freezes (``requires_grad=False``) the parts that do not train; a LoRA builder takes ``"frozen"``, ``"lora"`` or
``"full"`` per part: LoRA layers go into the decoder and encoder where asked, a ``"lora"`` part trains its adapters
only and a ``"full"`` part every parameter. The projector is one matrix and a norm, not a linear layer, so it has
no LoRA form (Hugging Face PEFT has none either).
"""

from collections.abc import Callable, Sequence

from torch import nn

from tune.models._common import lora_spec, set_part_trainable, trainable_choice
from tune.models.gemma3 import gemma3, lora_gemma3
from tune.models.gemma3_vision._model import Gemma3MultiModalProjector, Gemma3VisionLanguageModel
from tune.modules import TransformerDecoder
from tune.modules.peft import DoRALinear, LoRALinear
from tune.modules.vision import SiglipVisionEncoder, siglip_vision_encoder

# Gemma 3's image placeholder token (``image_token_index``): the first id after its SentencePiece vocabulary.
IMAGE_TOKEN_ID = 262_144


def gemma3_vision(
    *,
    vocab_size: int,
    num_layers: int,
    num_heads: int,
    head_dim: int,
    num_kv_heads: int,
    embed_dim: int,
    intermediate_dim: int,
    max_seq_len: int,
    attn_dropout: float = 0.0,
    norm_eps: float = 1e-6,
    rope_base: float = 1_000_000.0,
    rope_local_base: float = 10_000.0,
    rope_scale_factor: float | None = None,
    sliding_window_size: int | None = 1024,
    sliding_window_pattern: int = 6,
    query_pre_attn_scalar: float | None = None,
    image_size: int = 896,
    patch_size: int = 14,
    vision_embed_dim: int = 1152,
    vision_num_layers: int = 27,
    vision_num_heads: int = 16,
    vision_intermediate_dim: int = 4304,
    vision_norm_eps: float = 1e-6,
    mm_tokens_per_image: int = 256,
    image_token_id: int = IMAGE_TOKEN_ID,
    decoder_trainable: bool = True,
    encoder_trainable: bool = False,
    fusion_trainable: bool = True,
) -> Gemma3VisionLanguageModel:
    """Gemma 3 with images (Gemma Team, 2025, https://arxiv.org/abs/2503.19786): SigLIP, the projector and the
    Gemma 3 language model.

    Args:
        vocab_size, num_layers, num_heads, head_dim, num_kv_heads, embed_dim, intermediate_dim, max_seq_len,
            attn_dropout, norm_eps, rope_base, rope_local_base, rope_scale_factor, sliding_window_size,
            sliding_window_pattern, query_pre_attn_scalar: the language model's, as in
            :func:`tune.models.gemma3.gemma3`.
        image_size (int): side of the input images in pixels. Default 896.
        patch_size (int): side of a SigLIP patch. Default 14.
        vision_embed_dim (int): SigLIP width. Default 1152.
        vision_num_layers (int): SigLIP layers. Default 27.
        vision_num_heads (int): SigLIP attention heads. Default 16.
        vision_intermediate_dim (int): SigLIP MLP width. Default 4304.
        vision_norm_eps (float): epsilon of SigLIP's LayerNorms and of the projector's RMSNorm. Default 1e-6.
        mm_tokens_per_image (int): image tokens per image: a square whose side divides
            ``image_size // patch_size``. Default 256.
        image_token_id (int): the image placeholder token. Default 262144 (Gemma 3's).
        decoder_trainable (bool): train the language model. Default True.
        encoder_trainable (bool): train the vision encoder. Default False.
        fusion_trainable (bool): train the projector. Default True.

    Returns:
        Gemma3VisionLanguageModel: the model, randomly initialised, frozen parts with ``requires_grad=False``.

    Raises:
        ValueError: for inconsistent sizes.
    """
    decoder = gemma3(
        vocab_size=vocab_size, num_layers=num_layers, num_heads=num_heads, head_dim=head_dim,
        num_kv_heads=num_kv_heads, embed_dim=embed_dim, intermediate_dim=intermediate_dim, max_seq_len=max_seq_len,
        attn_dropout=attn_dropout, norm_eps=norm_eps, rope_base=rope_base, rope_local_base=rope_local_base,
        rope_scale_factor=rope_scale_factor, sliding_window_size=sliding_window_size,
        sliding_window_pattern=sliding_window_pattern, query_pre_attn_scalar=query_pre_attn_scalar,
    )  # fmt: skip
    encoder = siglip_vision_encoder(
        image_size=image_size, patch_size=patch_size, embed_dim=vision_embed_dim, num_layers=vision_num_layers,
        num_heads=vision_num_heads, intermediate_dim=vision_intermediate_dim, norm_eps=vision_norm_eps,
    )  # fmt: skip
    model = _assemble(encoder, decoder, mm_tokens_per_image, image_token_id, vision_norm_eps)
    choices = ("full" if flag else "frozen" for flag in (decoder_trainable, encoder_trainable, fusion_trainable))
    _set_trainable(model, *choices)
    return model


def lora_gemma3_vision(
    lora_attn_modules: Sequence[str],
    decoder_trainable: str = "lora",
    encoder_trainable: str = "frozen",
    fusion_trainable: str = "frozen",
    apply_lora_to_mlp: bool = False,
    apply_lora_to_output: bool = False,
    *,
    vocab_size: int,
    num_layers: int,
    num_heads: int,
    head_dim: int,
    num_kv_heads: int,
    embed_dim: int,
    intermediate_dim: int,
    max_seq_len: int,
    attn_dropout: float = 0.0,
    norm_eps: float = 1e-6,
    rope_base: float = 1_000_000.0,
    rope_local_base: float = 10_000.0,
    rope_scale_factor: float | None = None,
    sliding_window_size: int | None = 1024,
    sliding_window_pattern: int = 6,
    query_pre_attn_scalar: float | None = None,
    image_size: int = 896,
    patch_size: int = 14,
    vision_embed_dim: int = 1152,
    vision_num_layers: int = 27,
    vision_num_heads: int = 16,
    vision_intermediate_dim: int = 4304,
    vision_norm_eps: float = 1e-6,
    mm_tokens_per_image: int = 256,
    image_token_id: int = IMAGE_TOKEN_ID,
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
    quantize_base: bool = False,
) -> Gemma3VisionLanguageModel:
    """:func:`gemma3_vision` with LoRA (or DoRA, or QLoRA) layers in the parts that ask for them.

    Args:
        lora_attn_modules (Sequence[str]): attention projections to adapt in the LoRA parts, from
            ``q_proj, k_proj, v_proj, output_proj`` (SigLIP's ``out_proj`` is ``output_proj``).
        decoder_trainable (str): the language model: ``"frozen"``, ``"lora"`` or ``"full"``. Default "lora".
        encoder_trainable (str): the vision encoder: ``"frozen"``, ``"lora"`` or ``"full"``. Default "frozen".
        fusion_trainable (str): the projector: ``"frozen"`` or ``"full"`` (it has no linear layer to adapt).
            Default "frozen".
        apply_lora_to_mlp (bool): adapt the feed-forward projections of the LoRA parts too. Default False.
        apply_lora_to_output (bool): only False is accepted: the output is tied to the token embeddings.
        vocab_size, num_layers, num_heads, head_dim, num_kv_heads, embed_dim, intermediate_dim, max_seq_len,
            attn_dropout, norm_eps, rope_base, rope_local_base, rope_scale_factor, sliding_window_size,
            sliding_window_pattern, query_pre_attn_scalar, image_size, patch_size, vision_embed_dim,
            vision_num_layers, vision_num_heads, vision_intermediate_dim, vision_norm_eps, mm_tokens_per_image,
            image_token_id: as in :func:`gemma3_vision`.
        lora_rank (int): adapter rank. Default 8.
        lora_alpha (float): adapter scale numerator (scale = alpha / rank). Default 16.
        lora_dropout (float): dropout on the adapter input. Default 0.0.
        use_dora (bool): DoRA instead of LoRA. Default False.
        quantize_base (bool): NF4 base weights of the adapted layers (QLoRA). Default False.

    Returns:
        Gemma3VisionLanguageModel: the model; a ``"lora"`` part trains its adapters only, a ``"frozen"`` one
        nothing. tune's LoRA recipes train the adapters only (``prepare_lora_model``), so ``"full"`` takes effect in
        a training loop of one's own.

    Raises:
        ValueError: for a choice outside ``frozen, lora, full`` (``lora`` on the projector), an unknown module in
            ``lora_attn_modules``, or LoRA on the tied output.
    """
    decoder_choice, encoder_choice, fusion_choice = _check_trainable_choices(
        decoder_trainable, encoder_trainable, fusion_trainable
    )
    lora = dict(
        lora_attn_modules=lora_attn_modules, apply_lora_to_mlp=apply_lora_to_mlp,
        apply_lora_to_output=apply_lora_to_output, lora_rank=lora_rank, lora_alpha=lora_alpha,
        lora_dropout=lora_dropout, use_dora=use_dora, quantize_base=quantize_base,
    )  # fmt: skip
    text_dims = dict(
        vocab_size=vocab_size, num_layers=num_layers, num_heads=num_heads, head_dim=head_dim,
        num_kv_heads=num_kv_heads, embed_dim=embed_dim, intermediate_dim=intermediate_dim, max_seq_len=max_seq_len,
        attn_dropout=attn_dropout, norm_eps=norm_eps, rope_base=rope_base, rope_local_base=rope_local_base,
        rope_scale_factor=rope_scale_factor, sliding_window_size=sliding_window_size,
        sliding_window_pattern=sliding_window_pattern, query_pre_attn_scalar=query_pre_attn_scalar,
    )  # fmt: skip
    if apply_lora_to_output:
        lora_spec(**lora)  # the module names first, as every LoRA builder checks them
        raise ValueError(
            "apply_lora_to_output=True needs an untied output projection, but Gemma 3 ties it to the token "
            "embeddings; set apply_lora_to_output=False."
        )
    decoder = lora_gemma3(**lora, **text_dims) if decoder_choice == "lora" else gemma3(**text_dims)
    encoder = siglip_vision_encoder(
        image_size=image_size, patch_size=patch_size, embed_dim=vision_embed_dim, num_layers=vision_num_layers,
        num_heads=vision_num_heads, intermediate_dim=vision_intermediate_dim, norm_eps=vision_norm_eps,
        linear=_lora_vision_linear(**lora) if encoder_choice == "lora" else None,
    )  # fmt: skip
    model = _assemble(encoder, decoder, mm_tokens_per_image, image_token_id, vision_norm_eps)
    _set_trainable(model, decoder_choice, encoder_choice, fusion_choice)
    # read by the LoRA recipes, which train and save adapters only (tune.training.prepare_lora_model)
    model.trainable_parts = {"decoder": decoder_choice, "encoder": encoder_choice, "fusion": fusion_choice}
    return model


def _assemble(
    encoder: SiglipVisionEncoder, decoder: TransformerDecoder, tokens_per_image: int, image_token_id: int, eps: float
) -> Gemma3VisionLanguageModel:
    """The model around an encoder and a decoder, with a projector between their widths."""
    projector = Gemma3MultiModalProjector(
        vision_dim=encoder.embed_dim,
        text_dim=decoder.tok_embeddings.embedding_dim,
        patches_per_side=encoder.patches_per_side,
        tokens_per_image=tokens_per_image,
        norm_eps=eps,
    )
    return Gemma3VisionLanguageModel(
        encoder=encoder, projector=projector, decoder=decoder, image_token_id=image_token_id
    )


def _check_trainable_choices(decoder: str, encoder: str, fusion: str) -> tuple[str, str, str]:
    """The three LoRA-builder choices, lower-cased and checked.

    Raises:
        ValueError: naming the argument for a choice outside ``frozen, lora, full``, or ``lora`` on the projector.
    """
    choices = (("decoder_trainable", decoder), ("encoder_trainable", encoder), ("fusion_trainable", fusion))
    checked = tuple(trainable_choice(name, value) for name, value in choices)
    if checked[2] == "lora":
        raise ValueError(
            "fusion_trainable='lora' is not possible for Gemma 3: its projector is one matrix and a norm, with no "
            "linear layer to adapt; use 'frozen' or 'full'."
        )
    return checked


def _lora_vision_linear(
    *,
    lora_attn_modules: Sequence[str],
    apply_lora_to_mlp: bool = False,
    apply_lora_to_output: bool = False,
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
    quantize_base: bool = False,
) -> Callable[[str, int, int], nn.Module]:
    """The ``linear`` argument of ``siglip_vision_encoder`` that puts LoRA layers on the chosen projections."""
    spec = lora_spec(
        lora_attn_modules, apply_lora_to_mlp, apply_lora_to_output, lora_rank, lora_alpha, lora_dropout, use_dora,
        quantize_base,
    )  # fmt: skip
    adapted = set(spec.attn_modules) | ({"fc1", "fc2"} if spec.apply_to_mlp else set())

    def linear(name: str, in_dim: int, out_dim: int) -> nn.Module:
        if name not in adapted:
            return nn.Linear(in_dim, out_dim)
        cls = DoRALinear if spec.use_dora else LoRALinear
        return cls(
            in_dim, out_dim, rank=spec.rank, alpha=spec.alpha, dropout=spec.dropout, use_bias=True,
            quantize_base=spec.quantize_base,
        )  # fmt: skip

    return linear


def _set_trainable(model: Gemma3VisionLanguageModel, decoder: str, encoder: str, fusion: str) -> None:
    """Sets ``requires_grad`` part by part: ``"full"`` every parameter, ``"lora"`` the adapters only, ``"frozen"``
    none."""
    for part, choice in ((model.decoder, decoder), (model.encoder, encoder), (model.projector, fusion)):
        set_part_trainable(part, choice)
