"""The attention of T5 encoder-decoders (Chronos-T5, Chronos-Bolt, the LLM's T5): the weights
as :meth:`~isoprobe.models.base.ForecastModule.attention_weights` and
:meth:`~isoprobe.models.base.ForecastModule.cross_attention_weights` return them, and the
self-attention of a decoder that reads one position (:class:`OnePositionSelfAttention`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torch import Tensor, nn
from transformers.models.t5.modeling_t5 import T5Attention

from isoprobe.models.base import ATTENTION_PROJECTIONS


def t5_cross_attention_weights(decoder_blocks: Iterable[nn.Module]) -> dict[str, dict[str, Tensor]]:
    """``decoder.<i>`` -> q, k, v, o of each T5 decoder block's cross-attention
    (``EncDecAttention``, the block's second layer): ``q`` [H d_kv, d_model] on the decoder's
    stream, ``k`` and ``v`` on the encoder's output, ``o`` [d_model, H d_kv]; no bias. What
    ``cross_attention_weights()`` returns for every T5-based model."""
    return {
        f"decoder.{i}": {
            p: getattr(block.layer[1].EncDecAttention, p).weight for p in ATTENTION_PROJECTIONS
        }
        for i, block in enumerate(decoder_blocks)
    }


def t5_self_attention_weights(t5: nn.Module) -> dict[str, dict[str, Tensor]]:
    """``encoder.<i>`` / ``decoder.<i>`` -> q, k, v ([H d_kv, d_model]) and o ([d_model, H d_kv])
    of each block's self-attention (the block's first layer) in a T5 encoder-decoder ``t5``
    (anything with ``encoder.block`` and ``decoder.block``); T5's projections have no bias."""
    stacks = {"encoder": t5.encoder.block, "decoder": t5.decoder.block}
    return {
        f"{stack}.{i}": {
            p: getattr(block.layer[0].SelfAttention, p).weight for p in ATTENTION_PROJECTIONS
        }
        for stack, blocks in stacks.items()
        for i, block in enumerate(blocks)
    }


class OnePositionSelfAttention(T5Attention):
    """T5 self-attention that skips the attention when it reads a single position.

    With one query and one key, the softmax of the one score (plus any position bias) is
    exactly 1, so the attention returns the position's own value: the output is ``o(v(x))``,
    the official computation's bits without its query, key and attention. Chronos-Bolt's
    decoder reads one position per forward (the learned query). Anything else (more positions,
    a cache, cross-attention, training with its dropout, attention weights asked for) runs the
    official forward.
    """

    def forward(
        self,
        hidden_states: Tensor,
        mask: Tensor | None = None,
        key_value_states: Tensor | None = None,
        position_bias: Tensor | None = None,
        past_key_values: Any = None,
        **kwargs: Any,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        official = (
            self.training
            or hidden_states.shape[1] != 1
            or key_value_states is not None
            or past_key_values is not None
            or kwargs.get("output_attentions")
        )
        if official:
            return super().forward(
                hidden_states, mask, key_value_states, position_bias, past_key_values, **kwargs
            )
        return self.o(self.v(hidden_states)), position_bias, None


def skip_one_position_self_attention(decoder_blocks: Iterable[nn.Module]) -> None:
    """Make each T5 decoder block's self-attention a :class:`OnePositionSelfAttention`, in
    place (the same parameters and names: checkpoints and exports do not change)."""
    for block in decoder_blocks:
        block.layer[0].SelfAttention.__class__ = OnePositionSelfAttention
