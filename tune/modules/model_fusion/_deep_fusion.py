"""A pretrained encoder joined to a pretrained decoder through fusion layers inside the decoder (deep fusion, as in
Flamingo and Llama 3.2 Vision): the decoder's tokens attend the encoder's outputs by cross-attention."""

from typing import Any

import torch
from torch import nn

from tune.modules._decoder_wrapper import DecoderWrapper
from tune.modules._transformer import TransformerDecoder
from tune.modules.model_fusion._fusion_utils import get_fusion_params


class DeepFusionModel(DecoderWrapper, nn.Module):
    """An encoder and a ``TransformerDecoder`` some of whose layers are ``FusionLayer``s.

    ``forward`` encodes ``encoder_input`` (when given) into a sequence of vectors in the decoder's width and runs the
    decoder, passing that sequence and ``encoder_mask`` to each fusion layer. Everything about the output
    (``skip_output_layer``, ``set_num_output_chunks``, ``output_hidden_states``) and the KV caches is the decoder's:
    the model delegates to it. With KV caches enabled, the encoder's output of the last call that had
    ``encoder_input`` is kept and reused by later calls without it (decoding step by step).

    The constructor sets ``requires_grad`` by part: the encoder, the decoder, and the fusion parameters
    (:func:`get_fusion_params`: projection head, cross-attention layers, new token embeddings), which follow
    ``fusion_trainable`` wherever they sit.

    Args:
        decoder (TransformerDecoder): the language model with fusion layers.
        encoder (nn.Module): called as ``encoder(**encoder_input)``; returns [b, s_e, decoder embed_dim].
        decoder_trainable (bool): train the decoder's own parameters. Default False.
        encoder_trainable (bool): train the encoder's own parameters. Default False.
        fusion_trainable (bool): train the fusion parameters. Default True.
    """

    def __init__(
        self,
        decoder: TransformerDecoder,
        encoder: nn.Module,
        *,
        decoder_trainable: bool = False,
        encoder_trainable: bool = False,
        fusion_trainable: bool = True,
    ) -> None:
        super().__init__()
        self.decoder = decoder
        self.encoder = encoder
        for param in self.encoder.parameters():
            param.requires_grad_(encoder_trainable)
        for param in self.decoder.parameters():
            param.requires_grad_(decoder_trainable)
        for param in get_fusion_params(self).values():
            param.requires_grad_(fusion_trainable)
        self._cached_encoder_output: torch.Tensor | None = None

    def _forget_decoding_state(self) -> None:
        self._cached_encoder_output = None

    def forward(
        self,
        tokens: torch.Tensor,
        *,
        mask: torch.Tensor | None = None,
        encoder_input: dict[str, Any] | None = None,
        encoder_mask: torch.Tensor | None = None,
        input_pos: torch.Tensor | None = None,
    ) -> torch.Tensor | list[torch.Tensor]:
        """Computes logits (or what the decoder's output settings ask for).

        Args:
            tokens (torch.Tensor): [b, s] int64 token ids.
            mask (torch.Tensor | None): [b, s, s_kv] bool self-attention mask (True = may attend); None for causal.
            encoder_input (dict[str, Any] | None): keyword arguments of the encoder (Llama 3.2 Vision: ``images``
                and ``aspect_ratio``); None for a text-only batch (the fusion layers are then skipped, unless an
                encoder output is kept from an earlier call with caches enabled).
            encoder_mask (torch.Tensor | None): [b, s, s_e] bool, True where a token may attend an encoder
                output; None lets every token attend every one.
            input_pos (torch.Tensor | None): [b, s] int64 positions; None for ``0..s-1``.

        Returns:
            torch.Tensor | list[torch.Tensor]: as ``TransformerDecoder.forward``: [b, s, vocab] float32 logits,
            their chunks, or hidden states.

        Raises:
            ValueError: for tokens that are not [b, s] or a sequence longer than the decoder's ``max_seq_len``.
        """
        if tokens.dim() != 2:
            raise ValueError(f"tokens must be [batch, seq] token ids, got shape {tuple(tokens.shape)}.")
        if tokens.shape[1] > self.decoder.max_seq_len:
            raise ValueError(
                f"Sequence length {tokens.shape[1]} exceeds the model's max_seq_len {self.decoder.max_seq_len}; "
                "truncate the inputs (e.g. tokenizer.max_seq_len) or build the model with a larger max_seq_len."
            )
        encoder_output = None
        if encoder_input is not None:
            encoder_output = self.encoder(**encoder_input)  # [b, s_e, embed_dim]
            if self.decoder.caches_are_enabled():
                self._cached_encoder_output = encoder_output
        elif self.decoder.caches_are_enabled():
            encoder_output = self._cached_encoder_output
        return self._decode(tokens, mask, input_pos, encoder_output, encoder_mask)

    def _decode(
        self,
        tokens: torch.Tensor,
        mask: torch.Tensor | None,
        input_pos: torch.Tensor | None,
        encoder_output: torch.Tensor | None,
        encoder_mask: torch.Tensor | None,
    ) -> torch.Tensor | list[torch.Tensor]:
        # TransformerDecoder.forward, with the encoder's output handed to the fusion layers
        decoder = self.decoder
        h = decoder.embed(tokens)
        hidden = []
        for i, layer in enumerate(decoder.layers):
            if i in decoder.output_hidden_states:
                hidden.append(h)
            # fusion layers, also inside activation-checkpoint wrappers (which forward attributes)
            if getattr(layer, "fusion_layer", None) is not None:
                h = layer(h, mask=mask, input_pos=input_pos, encoder_input=encoder_output, encoder_mask=encoder_mask)
            else:
                h = layer(h, mask=mask, input_pos=input_pos)
        h = decoder.norm(h)
        if decoder.skip_output_layer:
            output = h
        elif decoder.num_output_chunks > 0:
            output = [decoder.output(chunk).float() for chunk in h.chunk(decoder.num_output_chunks, dim=1)]
        else:
            output = decoder.output(h).float()
        return [*hidden, output] if hidden else output
