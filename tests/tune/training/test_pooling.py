"""The last unpadded position of each row."""

import torch

from tune.training import get_unmasked_sequence_lengths


def test_last_unmasked_position_per_row():
    tokens = torch.tensor([[5, 6, 0, 0], [5, 6, 7, 0], [5, 6, 7, 8], [0, 0, 0, 0], [0, 5, 6, 0]])
    # right padding, none, all padding (0, as torchtune), and a gap before the sequence (the last real token counts)
    assert get_unmasked_sequence_lengths(tokens == 0).tolist() == [1, 2, 3, 0, 2]
    assert get_unmasked_sequence_lengths(tokens == 0).dtype == torch.long
