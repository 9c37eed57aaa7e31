"""The collector keeps the masked rows of outputs of any leading shape."""

from __future__ import annotations

import pytest
import torch

from isoprobe.probing.capture import masked_rows


def test_rows_of_a_patch_model_output_b_c_p_d():
    hidden = torch.arange(2 * 3 * 4 * 5, dtype=torch.float64).reshape(2, 3, 4, 5)
    mask = torch.zeros(2, 3, 4, dtype=torch.bool)
    mask[0, 1, 2] = mask[1, 0, 0] = mask[1, 2, 3] = True
    rows, counts = masked_rows("encoder.0", [hidden], mask)
    expected = torch.stack([hidden[0, 1, 2], hidden[1, 0, 0], hidden[1, 2, 3]])
    assert torch.equal(rows, expected) and counts == [1, 2]


def test_all_positions_without_a_mask_and_a_mask_of_the_wrong_shape_is_named():
    hidden = torch.randn(2, 3, 4)
    rows, counts = masked_rows("encoder.0", [hidden], None)
    assert torch.equal(rows, hidden.reshape(6, 4)) and counts == [3, 3]
    with pytest.raises(RuntimeError, match=r"token_masks\(batch, \.\.\.\)\['encoder.0'\]"):
        masked_rows("encoder.0", [hidden], torch.ones(2, 4, dtype=torch.bool))
