"""``Llama3ScaledRoPE`` under torchtune's name and defaults."""

from tune.modules import Llama3ScaledRoPE as _ModuleLlama3ScaledRoPE


class Llama3ScaledRoPE(_ModuleLlama3ScaledRoPE):
    """:class:`tune.modules.Llama3ScaledRoPE` with torchtune's constructor defaults (``max_seq_len=4096``,
    ``base=10000``; the module in ``tune.modules`` defaults to Llama 3.1's 131072 and 500000).

    Features are rotated in Hugging Face's layout (the first half of each head against the second), as everywhere
    in tune; torchtune's module rotates interleaved pairs. The two agree once a head's features are permuted
    (evens, then odds), which is what Hugging Face checkpoints already are.

    Args:
        dim (int): rotated features per head (the head dimension).
        max_seq_len (int): the largest position + 1 that will be looked up. Default 4096.
        base (float): the RoPE theta. Default 10000.
        scale_factor (float): how much longer than ``old_context_len`` the context becomes. Default 8.
        low_freq_factor (float): wavelengths above ``old_context_len / low_freq_factor`` are scaled. Default 1.
        high_freq_factor (float): wavelengths below ``old_context_len / high_freq_factor`` are kept. Default 4.
        old_context_len (int): the context length of the unscaled model. Default 8192.
    """

    def __init__(
        self,
        dim: int,
        max_seq_len: int = 4096,
        base: float = 10_000.0,
        scale_factor: float = 8.0,
        low_freq_factor: float = 1.0,
        high_freq_factor: float = 4.0,
        old_context_len: int = 8192,
    ) -> None:
        super().__init__(
            dim,
            max_seq_len=max_seq_len,
            base=base,
            scale_factor=scale_factor,
            low_freq_factor=low_freq_factor,
            high_freq_factor=high_freq_factor,
            old_context_len=old_context_len,
        )
