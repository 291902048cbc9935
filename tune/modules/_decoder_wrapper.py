"""What recipes, losses and generation read on a decoder, for a model that wraps one (a vision-language model).

The recipes call ``model.set_num_output_chunks``, losses set ``model.skip_output_layer`` and read ``model.output``,
generation sets up ``model``'s KV caches; a model whose language model is its ``decoder`` answers all of them with
the decoder's. A model that keeps state for cached decoding (an encoder output, a position shift) forgets it in
:meth:`DecoderWrapper._forget_decoding_state`, which every change of the caches calls.
"""

import torch
from torch import nn


class DecoderWrapper:
    """Mix-in for an ``nn.Module`` with a ``decoder`` attribute (a ``TransformerDecoder``): its output settings and
    KV caches are the decoder's."""

    decoder: nn.Module

    @property
    def skip_output_layer(self) -> bool:
        """Whether ``forward`` returns the final hidden states instead of logits (the decoder's setting)."""
        return self.decoder.skip_output_layer

    @skip_output_layer.setter
    def skip_output_layer(self, value: bool) -> None:
        self.decoder.skip_output_layer = value

    @property
    def output(self) -> nn.Module:
        """The decoder's output projection."""
        return self.decoder.output

    @property
    def tok_embeddings(self) -> nn.Module:
        """The decoder's token embeddings."""
        return self.decoder.tok_embeddings

    def set_num_output_chunks(self, num_output_chunks: int) -> None:
        """As :meth:`tune.modules.TransformerDecoder.set_num_output_chunks`."""
        self.decoder.set_num_output_chunks(num_output_chunks)

    def setup_caches(
        self,
        batch_size: int,
        dtype: torch.dtype,
        *,
        encoder_max_seq_len: int | None = None,
        decoder_max_seq_len: int | None = None,
    ) -> None:
        """Allocates the decoder's KV caches for generation.

        Args:
            batch_size (int): rows generated at once.
            dtype (torch.dtype): cache dtype.
            encoder_max_seq_len (int | None): accepted for torchtune's signature; no model here caches the
                encoder's keys. Default None.
            decoder_max_seq_len (int | None): capacity in tokens. Default: the decoder's ``max_seq_len``.
        """
        self.decoder.setup_caches(batch_size, dtype, decoder_max_seq_len=decoder_max_seq_len)
        self._forget_decoding_state()

    def caches_are_setup(self) -> bool:
        """Whether the decoder's KV caches are set up."""
        return self.decoder.caches_are_setup()

    def caches_are_enabled(self) -> bool:
        """Whether the decoder's KV caches are set up and in use."""
        return self.decoder.caches_are_enabled()

    def reset_caches(self) -> None:
        """Empties the decoder's KV caches.

        Raises:
            RuntimeError: if no caches are set up.
        """
        self.decoder.reset_caches()
        self._forget_decoding_state()

    def delete_caches(self) -> None:
        """Removes the decoder's KV caches."""
        self.decoder.delete_caches()
        self._forget_decoding_state()

    def _forget_decoding_state(self) -> None:
        """Drops what the model keeps between cached decoding calls (nothing here)."""
