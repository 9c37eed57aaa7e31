"""The attention weights of T5 encoder-decoders (Chronos-T5, Chronos-Bolt, the LLM's T5), as
:meth:`~isoprobe.models.base.ForecastModule.attention_weights` and
:meth:`~isoprobe.models.base.ForecastModule.cross_attention_weights` return them."""

from __future__ import annotations

from collections.abc import Iterable

from torch import Tensor, nn

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
