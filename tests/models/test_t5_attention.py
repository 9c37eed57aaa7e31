"""T5 self-attention of one position: the official module's output without its attention."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import T5Config
from transformers.models.t5.modeling_t5 import T5Attention

from isoprobe.models.t5_attention import OnePositionSelfAttention


def attention_pair() -> tuple[T5Attention, OnePositionSelfAttention]:
    """A seeded decoder self-attention with relative position bias, and a copy made
    isoprobe's."""
    torch.manual_seed(0)
    config = T5Config(d_model=16, d_kv=4, num_heads=4, is_decoder=True, dropout_rate=0.1)
    official = T5Attention(config, has_relative_attention_bias=True, layer_idx=0, is_causal=True)
    own = copy.deepcopy(official.eval())
    own.__class__ = OnePositionSelfAttention
    return official, own


def test_one_position_is_the_official_output_bit_for_bit():
    official, own = attention_pair()
    hidden = torch.randn(5, 1, 16)
    expected, _, _ = official(hidden)
    got, _, weights = own(hidden)
    assert torch.equal(got, expected)
    assert weights is None


@pytest.mark.parametrize("case", ["three positions", "training", "cross-attention"])
def test_anything_else_runs_the_official_forward(case):
    official, own = attention_pair()
    hidden = torch.randn(5, 3 if case == "three positions" else 1, 16)
    kwargs = {"key_value_states": torch.randn(5, 6, 16)} if case == "cross-attention" else {}
    if case == "training":
        official.train(), own.train()
    torch.manual_seed(1)
    expected = official(hidden, **kwargs)[0]
    torch.manual_seed(1)
    assert torch.equal(own(hidden, **kwargs)[0], expected)
    if case == "training":  # dropout on the one weight: not the value itself
        torch.manual_seed(1)
        assert not torch.equal(own(hidden)[0], own.o(own.v(hidden)))
