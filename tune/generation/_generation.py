"""Autoregressive generation for a ``TransformerDecoder``, with left-padded batches and an optional KV cache."""

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from tune.generation._sampling import _check_sampling_args, sample
from tune.modules import get_causal_mask_from_padding_mask, get_position_ids_from_padding_mask


def left_pad(
    prompts: Sequence[Sequence[int]], pad_id: int, device: torch.device | str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stacks prompts of different lengths into one left-padded batch.

    Args:
        prompts (Sequence[Sequence[int]]): token ids per prompt, each non-empty.
        pad_id (int): the padding id.
        device (torch.device | str | None): device of the result. Default CPU.

    Returns:
        tuple[torch.Tensor, torch.Tensor]: tokens [b, s] int64 and padding mask [b, s] bool (True = real).

    Raises:
        ValueError: if there are no prompts or one is empty.
    """
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("generate needs at least one prompt and every prompt needs at least one token.")
    seq_len = max(len(p) for p in prompts)
    tokens = torch.full((len(prompts), seq_len), pad_id, dtype=torch.long, device=device)
    mask = torch.zeros((len(prompts), seq_len), dtype=torch.bool, device=device)
    for row, prompt in enumerate(prompts):
        tokens[row, seq_len - len(prompt) :] = torch.as_tensor(list(prompt), dtype=torch.long)
        mask[row, seq_len - len(prompt) :] = True
    return tokens, mask


def _as_batch(
    prompt: torch.Tensor | Sequence[Sequence[int]], pad_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(prompt, torch.Tensor):
        if prompt.dim() not in (1, 2) or prompt.dtype not in (torch.int32, torch.int64):
            raise ValueError(
                f"prompt must be [seq] or [batch, seq] integer token ids, got shape {tuple(prompt.shape)} and dtype "
                f"{prompt.dtype}."
            )
        tokens = (prompt[None] if prompt.dim() == 1 else prompt).long().to(device)
        # Only leading pad ids are padding; a pad id after the first real token is an ordinary token.
        mask = (tokens != pad_id).long().cumsum(dim=-1) > 0
        if not mask[:, -1].all():
            rows = (~mask[:, -1]).nonzero().flatten().tolist()
            raise ValueError(f"prompt rows {rows} are all padding (pad_id={pad_id}); give each row a real token.")
        return tokens, mask
    return left_pad(prompt, pad_id, device)


def _model_dtype_device(model: nn.Module) -> tuple[torch.dtype, torch.device]:
    param = next(model.parameters())
    return param.dtype, param.device


def generate(
    model: nn.Module,
    prompt: torch.Tensor | Sequence[Sequence[int]],
    *,
    max_generated_tokens: int,
    pad_id: int = 0,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    stop_tokens: Sequence[int] | None = None,
    rng: torch.Generator | Sequence[torch.Generator] | None = None,
    use_cache: bool = True,
    custom_generate_next_token: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None = None,
    return_logits: bool = True,
    encoder_input: dict[str, Any] | None = None,
    encoder_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Generates tokens after each prompt of a batch; returns the prompt followed by them, and their logits.

    The return value means what torchtune's ``generate`` returns. Prompts of different lengths are left-padded:
    padding is never attended and positions start at 0 at each row's first real token, so every row computes
    what it would alone. A row that produced one of ``stop_tokens`` keeps that token; the tokens after it are 0
    and so are their logits. Generation ends when every row stopped or ``max_generated_tokens`` were produced.
    The new tokens of a prompt of length ``s`` are ``tokens[:, s:]``.

    With ``use_cache`` the prompt is run once and each new token attends the KV cache (set up here for the
    batch when the model has none, and removed again afterwards; caches the caller set up are reset and kept).
    Without it, the whole sequence is recomputed at every step (slow; a reference for tests).

    A vision-language model gets its images as ``encoder_input`` (the batch layout of the family's collate) with
    the prompt: with a KV cache only when the prompt is run, without one at every step. Llama 3.2 Vision's
    ``encoder_mask`` says which images each prompt token attends; every generated token attends what the last
    prompt token does.

    Args:
        model (nn.Module): a ``TransformerDecoder`` or anything with its interface: ``forward(tokens, *, mask,
            input_pos)`` returning [b, s, vocab] logits, and for ``use_cache`` ``setup_caches``,
            ``caches_are_enabled``, ``reset_caches`` (and ``delete_caches``).
        prompt (torch.Tensor | Sequence[Sequence[int]]): token ids: [s] or [b, s] already left-padded with
            ``pad_id`` (leading pad ids are padding), or a list of token-id lists of any lengths (left-padded
            here with ``pad_id``).
        max_generated_tokens (int): most tokens to generate per row.
        pad_id (int): padding id of the prompt. Default 0.
        temperature (float): 0 for greedy; otherwise the sampling temperature. Default 1.0.
        top_k (int | None): sample among the k most likely tokens only. Default None.
        top_p (float | None): nucleus sampling mass. Default None.
        stop_tokens (Sequence[int] | None): ids that end a row (e.g. the tokenizer's ``stop_tokens``). Default None.
        rng (torch.Generator | Sequence[torch.Generator] | None): generator for reproducible sampling, or one per
            row: each row's noise is then drawn from its own generator, so its tokens do not depend on the other
            rows of the batch (which rank or micro-batch generates a prompt). Default None.
        use_cache (bool): use a KV cache. Default True.
        custom_generate_next_token (Callable | None): replaces :func:`generate_next_token` for every token after
            the first (typically a ``torch.compile``-d copy of it); called with the same arguments and returning
            ``(tokens [b, 1], logits [b, 1, vocab])``. ``top_p`` cannot be combined with it. Default None.
        return_logits (bool): keep the logits of every generated token and return them. False returns None in
            their place and holds one step's logits at a time: ``[b, n, vocab]`` float32 is large at real
            vocabularies (16 rows of 512 new tokens over 152k entries are 5 GB). Default True.
        encoder_input (dict[str, Any] | None): the images of the prompts, for a vision-language model. Default None.
        encoder_mask (torch.Tensor | None): [b, s, n_image_tokens] bool cross-attention mask of the prompt
            (Llama 3.2 Vision), aligned with a tensor ``prompt``. Default None.

    Returns:
        tuple[torch.Tensor, torch.Tensor | None]: ``tokens`` [b, s + n], the (left-padded) prompt followed by the
        ``n`` generated tokens (``n <= max_generated_tokens``), in the prompt's integer dtype (int64 for a list
        prompt); and ``logits`` [b, n, vocab], the logits each generated token was drawn from (None when
        ``return_logits`` is False).

    Raises:
        ValueError: for bad sampling arguments, an empty or all-padding prompt, a sequence longer than the
            model's ``max_seq_len``, ``top_p`` or images with ``custom_generate_next_token``, or an
            ``encoder_mask`` whose shape does not match the prompt's.
        TypeError: if ``use_cache`` is set and the model has no KV-cache methods.
    """
    _check_sampling_args(temperature, top_k, top_p)
    if custom_generate_next_token is not None and top_p is not None:
        raise ValueError(
            "custom_generate_next_token takes generate_next_token's arguments, which have no top_p; drop top_p or "
            "the custom function."
        )
    if custom_generate_next_token is not None and (encoder_input is not None or encoder_mask is not None):
        raise ValueError("custom_generate_next_token takes no images; drop encoder_input/encoder_mask or the function.")
    if max_generated_tokens < 1:
        raise ValueError(f"max_generated_tokens must be at least 1, got {max_generated_tokens}.")
    dtype, device = _model_dtype_device(model)
    tokens, padding_mask = _as_batch(prompt, pad_id, device)
    batch_size, prompt_len = tokens.shape
    total_len = prompt_len + max_generated_tokens
    max_seq_len = getattr(model, "max_seq_len", None)
    if max_seq_len is not None and total_len > max_seq_len:
        raise ValueError(
            f"The prompt ({prompt_len} tokens, padded) plus max_generated_tokens ({max_generated_tokens}) is "
            f"{total_len} tokens, more than the model's max_seq_len {max_seq_len}. Shorten the prompt or generate "
            "fewer tokens."
        )
    if use_cache and not all(hasattr(model, m) for m in ("setup_caches", "caches_are_enabled", "reset_caches")):
        raise TypeError(
            f"{type(model).__name__} has no KV-cache methods (setup_caches, caches_are_enabled, reset_caches); "
            "pass use_cache=False."
        )
    # Generated tokens are always real, so the full-sequence mask and positions are known up front.
    full_mask = torch.cat([padding_mask, padding_mask.new_ones(batch_size, max_generated_tokens)], dim=1)
    attn_mask = get_causal_mask_from_padding_mask(full_mask)  # [b, total, total]
    positions = get_position_ids_from_padding_mask(full_mask)  # [b, total]
    stop = torch.tensor(list(stop_tokens or []), dtype=torch.long, device=device)
    if use_cache and hasattr(model, "caches_are_setup") and model.caches_are_setup() and not model.caches_are_enabled():
        use_cache = False  # the caller disabled the caches (disable_kv_cache): recompute instead
    row_generators = None
    if rng is not None and not isinstance(rng, torch.Generator):
        row_generators = list(rng)
        if len(row_generators) != batch_size:
            raise ValueError(f"rng holds {len(row_generators)} generators for a batch of {batch_size} prompts.")
    step = _CachedStep(model, batch_size, dtype, total_len) if use_cache else _FullStep(model)
    images = _ImageInputs(encoder_input, encoder_mask, (batch_size, prompt_len), max_generated_tokens, device)
    sequence = torch.cat([tokens, tokens.new_zeros((batch_size, max_generated_tokens))], dim=1)
    done = torch.zeros(batch_size, dtype=torch.bool, device=device)
    new_logits, running = [], []  # per step: [b, vocab] logits, [b] rows not yet stopped before the step
    num_generated = 0
    try:
        with torch.no_grad():
            for cur in range(prompt_len, total_len):
                x, mask, input_pos = step.inputs(sequence, cur, attn_mask, positions)
                if custom_generate_next_token is None or cur == prompt_len:
                    extra = images.kwargs(cur - x.shape[1], cur, with_images=not use_cache or cur == prompt_len)
                    logits = model(x, mask=mask, input_pos=input_pos, **extra)[:, -1]  # [b, vocab], predicts `cur`
                    if row_generators is None:
                        next_token = sample(logits, temperature, top_k, top_p, rng)
                    else:
                        q = _row_noise(row_generators, logits.shape[-1], device) if temperature != 0 else None
                        next_token = sample(logits, temperature, top_k, top_p, q=q)
                else:
                    if row_generators is not None:
                        q = _row_noise(row_generators, model.tok_embeddings.num_embeddings, device)
                    else:
                        q = None if rng is None else _exponential_noise(batch_size, model, rng, device)
                    next_token, logits = custom_generate_next_token(
                        model, input_pos=input_pos, x=x, mask=mask, temperature=temperature, top_k=top_k, q=q
                    )
                    logits = logits[:, -1]
                next_token = next_token.reshape(batch_size).long()
                # a stopped row's later tokens are 0, as torchtune leaves them (whatever pad_id is)
                sequence[:, cur] = next_token.masked_fill(done, 0)
                num_generated += 1
                if return_logits:
                    new_logits.append(logits)
                    running.append(~done)
                done = done | torch.isin(next_token, stop)
                if done.all():  # one host sync per step; generation is sequential anyway
                    break
    finally:
        step.close()
    logits = None
    if return_logits:
        logits = torch.stack(new_logits, dim=1).masked_fill(~torch.stack(running, dim=1)[..., None], 0.0)
    out_dtype = prompt.dtype if isinstance(prompt, torch.Tensor) else torch.long
    return sequence[:, : prompt_len + num_generated].to(out_dtype), logits


def generate_next_token(
    model: nn.Module,
    input_pos: torch.Tensor,
    x: torch.Tensor,
    q: torch.Tensor | None = None,
    *,
    mask: torch.Tensor | None = None,
    temperature: float = 1.0,
    top_k: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Runs the model on ``x`` and samples the token that follows its last position.

    Args:
        model (nn.Module): a ``TransformerDecoder`` (or anything called as ``model(x, input_pos=..., mask=...)``
            returning ``[b, s, vocab]`` logits).
        input_pos (torch.Tensor): ``[b, s]`` positions of ``x``.
        x (torch.Tensor): ``[b, s]`` token ids (with a KV cache: only the tokens not in the cache yet).
        q (torch.Tensor | None): ``[b, vocab]`` Exponential(1) noise for :func:`sample`; None draws it from the
            global generator.
        mask (torch.Tensor | None): ``[b, s, s_kv]`` bool attention mask; None for causal attention.
        temperature (float): sampling temperature; 0 for greedy. Default 1.0.
        top_k (int | None): sample among the k most likely tokens only. Default None.

    Returns:
        tuple[torch.Tensor, torch.Tensor]: the next tokens ``[b, 1]`` int32 (as :func:`sample` returns them) and
        their logits ``[b, 1, vocab]``.
    """
    logits = model(x, input_pos=input_pos, mask=mask)[:, -1]  # [b, vocab]
    return sample(logits, temperature, top_k, q=q), logits[:, None]


def _row_noise(generators: list[torch.Generator], vocab_size: int, device: torch.device) -> torch.Tensor:
    """[b, vocab] Exponential(1) noise, row i drawn from ``generators[i]``."""
    return torch.stack([torch.empty(vocab_size, device=device).exponential_(1, generator=g) for g in generators])


def _exponential_noise(batch_size: int, model: nn.Module, rng: torch.Generator, device: torch.device) -> torch.Tensor:
    vocab_size = model.tok_embeddings.num_embeddings
    return torch.empty(batch_size, vocab_size, device=device).exponential_(1, generator=rng)


class _ImageInputs:
    """The image arguments of each forward call of :func:`generate` (none for a text model)."""

    def __init__(
        self,
        encoder_input: dict[str, Any] | None,
        encoder_mask: torch.Tensor | None,
        prompt_shape: tuple[int, int],
        max_generated_tokens: int,
        device: torch.device,
    ) -> None:
        self.encoder_input = encoder_input
        self.encoder_mask = None
        if encoder_mask is not None:
            if encoder_mask.dim() != 3 or tuple(encoder_mask.shape[:2]) != prompt_shape:
                raise ValueError(
                    f"encoder_mask must be [batch, prompt length, image tokens] = [{prompt_shape[0]}, "
                    f"{prompt_shape[1]}, n], got shape {tuple(encoder_mask.shape)}."
                )
            encoder_mask = encoder_mask.to(device)
            # a generated token attends the images the last prompt token attends
            new_rows = encoder_mask[:, -1:].expand(-1, max_generated_tokens, -1)
            self.encoder_mask = torch.cat([encoder_mask, new_rows], dim=1)

    def kwargs(self, start: int, end: int, *, with_images: bool) -> dict[str, Any]:
        """The arguments of the forward call over positions ``start:end``; the images themselves only
        ``with_images`` (every call without a KV cache, the prompt's call with one)."""
        out: dict[str, Any] = {}
        if with_images and self.encoder_input is not None:
            out["encoder_input"] = self.encoder_input
        if self.encoder_mask is not None:
            out["encoder_mask"] = self.encoder_mask[:, start:end]
        return out


class _FullStep:
    """Recomputes the whole sequence each step (no cache)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def inputs(
        self, sequence: torch.Tensor, cur: int, attn_mask: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The model inputs that predict position ``cur``: the whole sequence so far."""
        return sequence[:, :cur], attn_mask[:, :cur, :cur], positions[:, :cur]

    def close(self) -> None:
        pass


class _CachedStep:
    """Runs the prompt once, then one token per step against the KV cache."""

    def __init__(self, model: nn.Module, batch_size: int, dtype: torch.dtype, total_len: int) -> None:
        self.model = model
        self.owns_cache = not model.caches_are_enabled()
        if self.owns_cache:
            model.setup_caches(batch_size=batch_size, dtype=dtype, decoder_max_seq_len=total_len)
        else:
            model.reset_caches()
        self.filled = 0

    def inputs(
        self, sequence: torch.Tensor, cur: int, attn_mask: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The model inputs that predict position ``cur``: the tokens not yet in the cache (the whole prompt
        first, then the last generated token)."""
        start, self.filled = self.filled, cur
        return sequence[:, start:cur], attn_mask[:, start:cur, :], positions[:, start:cur]

    def close(self) -> None:
        if self.owns_cache and hasattr(self.model, "delete_caches"):
            self.model.delete_caches()
