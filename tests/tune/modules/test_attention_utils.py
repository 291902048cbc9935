import pytest
import torch

from tune.modules import (
    causal_mask,
    create_block_causal_mask,
    get_block_causal_mask_from_document_ids,
    get_causal_mask_from_padding_mask,
    get_position_ids_from_padding_mask,
    packed_block_causal_mask,
)

T, F = True, False


def test_causal_mask():
    assert torch.equal(causal_mask(3), torch.tensor([[T, F, F], [T, T, F], [T, T, T]]))


def test_left_padded_causal_mask_lets_padding_attend_only_itself():
    padding = torch.tensor([[F, T, T]])
    expected = torch.tensor([[[T, F, F], [F, T, F], [F, T, T]]])
    assert torch.equal(get_causal_mask_from_padding_mask(padding), expected)


def test_right_padded_mask_and_wider_target():
    padding = torch.tensor([[T, T, F]])
    mask = get_causal_mask_from_padding_mask(padding, target_seq_len=5)
    expected = torch.tensor([[[T, F, F, F, F], [T, T, F, F, F], [F, F, T, F, F]]])
    assert torch.equal(mask, expected)


def test_padding_mask_validation():
    with pytest.raises(ValueError, match="bool"):
        get_causal_mask_from_padding_mask(torch.ones(2, 3))
    with pytest.raises(ValueError, match="target_seq_len"):
        get_causal_mask_from_padding_mask(torch.ones(2, 3, dtype=torch.bool), target_seq_len=2)


def test_position_ids_skip_left_padding():
    padding = torch.tensor([[F, F, T, T], [T, T, T, T]])
    assert torch.equal(get_position_ids_from_padding_mask(padding), torch.tensor([[0, 0, 0, 1], [0, 1, 2, 3]]))


def test_block_causal_from_document_ids_and_from_lengths_agree():
    ids = torch.tensor([[0, 0, 1, 1, 1], [0, 1, 1, 2, 2]])
    expected_row0 = torch.tensor([[T, F, F, F, F], [T, T, F, F, F], [F, F, T, F, F], [F, F, T, T, F], [F, F, T, T, T]])
    mask = get_block_causal_mask_from_document_ids(ids)
    assert torch.equal(mask[0], expected_row0)
    assert torch.equal(create_block_causal_mask([torch.tensor([2, 3]), [1, 2, 2]]), mask)


def test_block_causal_rows_must_have_equal_length():
    with pytest.raises(ValueError, match="same packed length"):
        create_block_causal_mask([[2, 3], [2, 2]])


def test_packed_block_causal_mask_is_causal_within_documents_only():
    mask = packed_block_causal_mask([torch.tensor([2, 3]), torch.tensor([5])])
    first_row = torch.tensor(
        [
            [1, 0, 0, 0, 0],
            [1, 1, 0, 0, 0],
            [0, 0, 1, 0, 0],
            [0, 0, 1, 1, 0],
            [0, 0, 1, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert mask.shape == (2, 5, 5) and mask.dtype == torch.bool
    assert torch.equal(mask[0], first_row)
    assert torch.equal(mask[1], torch.ones(5, 5, dtype=torch.bool).tril())
