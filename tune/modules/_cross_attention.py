"""A pre-norm cross-attention block: text tokens attend to an encoder's outputs (image features).

Llama 3.2 Vision puts such a block before every few decoder layers (``tune.modules.model_fusion.FusionLayer``); its
residual branches pass through tanh gates that start closed, so a fresh block leaves the language model unchanged.
"""

import torch
from torch import nn

from tune.modules._attention import MultiHeadAttention


class TransformerCrossAttentionLayer(nn.Module):
    """``h = x + ca_scale(attn(ca_norm(x), encoder_input))``, ``out = h + mlp_scale(mlp(mlp_norm(h)))``.

    A token whose row of ``encoder_mask`` is all False (text before the first image, padding, a row without images)
    leaves the block unchanged: both branches are zeroed for it, as in Meta's reference implementation of Llama 3.2
    Vision. Without ``encoder_input`` the block is skipped (a text-only batch).

    Args:
        attn (MultiHeadAttention): the attention, built with ``is_causal=False`` and no position embedding; it
            is called as ``attn(x, encoder_input, mask=encoder_mask)``.
        mlp (nn.Module): the feed-forward block.
        ca_norm (nn.Module | None): norm before attention. Default: identity.
        mlp_norm (nn.Module | None): norm before the feed-forward block. Default: identity.
        ca_scale (nn.Module | None): applied to the attention output before the residual add (a ``TanhGate``).
            Default: identity.
        mlp_scale (nn.Module | None): applied to the feed-forward output before the residual add. Default:
            identity.
    """

    def __init__(
        self,
        attn: MultiHeadAttention,
        mlp: nn.Module,
        *,
        ca_norm: nn.Module | None = None,
        mlp_norm: nn.Module | None = None,
        ca_scale: nn.Module | None = None,
        mlp_scale: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.attn = attn
        self.mlp = mlp
        self.ca_norm = ca_norm if ca_norm is not None else nn.Identity()
        self.mlp_norm = mlp_norm if mlp_norm is not None else nn.Identity()
        self.ca_scale = ca_scale if ca_scale is not None else nn.Identity()
        self.mlp_scale = mlp_scale if mlp_scale is not None else nn.Identity()

    def forward(
        self,
        x: torch.Tensor,
        *,
        encoder_input: torch.Tensor | None = None,
        encoder_mask: torch.Tensor | None = None,
        **kwargs: object,
    ) -> torch.Tensor:
        """Attends the tokens to the encoder's outputs.

        Args:
            x (torch.Tensor): [b, s, embed_dim] token hidden states.
            encoder_input (torch.Tensor | None): [b, s_e, embed_dim] encoder outputs; None skips the block.
            encoder_mask (torch.Tensor | None): [b, s, s_e] bool, True where a token may attend an encoder token;
                None lets every token attend every encoder token.
            **kwargs: the self-attention arguments a decoder passes every layer (``mask``, ``input_pos``); unused.

        Returns:
            torch.Tensor: [b, s, embed_dim].

        Raises:
            ValueError: for an ``encoder_mask`` that is not [b, s, s_e] bool.
        """
        if encoder_input is None:
            return x
        keep = None  # [b, s, 1] True for tokens that attend at least one encoder token
        if encoder_mask is not None:
            expected = (x.shape[0], x.shape[1], encoder_input.shape[1])
            if encoder_mask.dtype != torch.bool or tuple(encoder_mask.shape) != expected:
                raise ValueError(
                    f"encoder_mask must be a bool tensor of shape [batch, seq, encoder_seq] = {list(expected)}, got "
                    f"{encoder_mask.dtype} {list(encoder_mask.shape)}."
                )
            keep = encoder_mask.any(dim=-1, keepdim=True)
            # a row with nothing to attend would give NaN in the softmax: let it attend everything, then zero it
            encoder_mask = encoder_mask | ~keep
        attn_out = self.attn(self.ca_norm(x), encoder_input, mask=encoder_mask)
        if keep is not None:
            attn_out = attn_out * keep
        h = x + self.ca_scale(attn_out)
        mlp_out = self.mlp(self.mlp_norm(h))
        if keep is not None:
            mlp_out = mlp_out * keep
        return h + self.mlp_scale(mlp_out)
