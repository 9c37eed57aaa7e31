"""A lean evaluation forward for transformers' T5 stacks (Chronos-Bolt's encoder and decoder).

At Chronos-Bolt's sizes (a few hundred thousand parameters, ten encoder positions) a good part
of a forecast is the Python of transformers' module tree: T5Stack -> T5Block -> T5Layer* ->
T5Attention -> the attention interface, with their keyword handling, config look-ups and
dropouts that do nothing in evaluation. :class:`LeanT5Stack` runs the same blocks as one
function over the same modules, with the same tensor operations in the same order, so that its
output is the official forward's bit for bit; wherever that is not assured, or something watches
the modules' calls (a forward hook of the probe, capture of attentions or hidden states), it runs
the official forward.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from transformers.integrations.sdpa_attention import create_position_bias_mask
from transformers.masking_utils import create_bidirectional_mask
from transformers.modeling_outputs import BaseModelOutputWithPastAndCrossAttentions
from transformers.models.t5.modeling_t5 import (
    T5Attention,
    T5DenseActDense,
    T5LayerNorm,
    T5Stack,
)
from transformers.utils.output_capturing import _CAN_RECORD_REGISTRY

from isoprobe.models.t5_attention import OnePositionSelfAttention
from isoprobe.models.watched import watched_or_training

#: the keywords the lean forward reads; any other runs the official forward
LEAN_KEYWORDS = frozenset(
    {
        "input_ids",
        "attention_mask",
        "encoder_hidden_states",
        "encoder_attention_mask",
        "inputs_embeds",
        "past_key_values",
        "use_cache",
        "output_attentions",
        "output_hidden_states",
        "return_dict",
    }
)


class LeanT5Stack(T5Stack):
    """A ``T5Stack`` whose evaluation forward is one function over its blocks.

    The lean forward runs in evaluation mode (the stack's and every submodule's), in float32
    without autocast, under the ``sdpa`` attention implementation, without a cache, without
    attentions or hidden states asked for, returning a dict, and with no hook (forward,
    pre-forward or backward, on a submodule or global) that would see the modules' calls; an
    encoder's self-attention must be ``T5Attention``, a decoder must read one position with
    :class:`OnePositionSelfAttention` and cross-attend to an encoder output, the feed-forward
    must be ``T5DenseActDense`` and the layer norms ``T5LayerNorm``. Then it computes what the
    official forward computes: ``T5LayerNorm``'s float32 root mean square, the relative
    position bias of the first block's ``compute_bias`` (zeros for cross-attention) made into
    sdpa's additive mask with the stack's attention mask as ``sdpa_attention_forward`` makes it
    (once per stack rather than per layer: the same values), ``scaled_dot_product_attention``
    with T5's scale 1, the residual additions, the feed-forward, the final layer norm; the
    dropouts, which do nothing in evaluation, are left out. Projections that are plain
    ``nn.Linear`` are applied as ``F.linear`` over their weight and bias (their forward); any
    other (a LoRA layer, a factored projection) is called, as is the activation. Everything
    else runs the official forward.
    """

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if args or not self._lean(kwargs):
            return super().forward(*args, **kwargs)
        return self._lean_forward(
            kwargs.get("input_ids"),
            kwargs.get("attention_mask"),
            kwargs.get("encoder_hidden_states"),
            kwargs.get("encoder_attention_mask"),
            kwargs.get("inputs_embeds"),
        )

    def _lean(self, kwargs: dict[str, Any]) -> bool:
        """Whether the lean forward computes exactly what the official one would (see the class)."""
        config = self.config
        embeds, ids = kwargs.get("inputs_embeds"), kwargs.get("input_ids")
        if self.training or not kwargs.keys() <= LEAN_KEYWORDS or (ids is None) == (embeds is None):
            return False
        use_cache = kwargs.get("use_cache")
        asked = (
            kwargs.get("past_key_values") is not None
            or (config.use_cache if use_cache is None else use_cache)
            or kwargs.get("output_attentions", config.output_attentions)
            or kwargs.get("output_hidden_states", config.output_hidden_states)
            or kwargs.get("return_dict", config.return_dict) is False
        )
        if asked or config._attn_implementation != "sdpa":
            return False
        if getattr(config, "is_causal", None) is not None:
            return False
        weight = self.embed_tokens.weight
        dtype = weight.dtype if embeds is None else embeds.dtype
        if dtype != torch.float32 or torch.is_autocast_enabled(weight.device.type):
            return False
        if self.is_decoder:
            positions = (ids if embeds is None else embeds).shape[1]
            if positions != 1 or kwargs.get("encoder_hidden_states") is None:
                return False
        return self._lean_structure() and not watched_or_training(self)

    def _lean_structure(self) -> bool:
        """Every block is made of the modules the lean forward reproduces."""
        attention = OnePositionSelfAttention if self.is_decoder else T5Attention
        norms = [self.final_layer_norm]
        for block in self.block:
            self_attention, *cross_attention, feed_forward = block.layer
            if type(self_attention.SelfAttention) is not attention:
                return False
            if self.is_decoder and type(cross_attention[0].EncDecAttention) is not T5Attention:
                return False
            if type(feed_forward.DenseReluDense) is not T5DenseActDense:
                return False
            norms.extend(layer.layer_norm for layer in block.layer)
        return all(type(norm) is T5LayerNorm for norm in norms)

    def _lean_forward(
        self,
        input_ids: Tensor | None,
        attention_mask: Tensor | None,
        encoder_hidden_states: Tensor | None,
        encoder_attention_mask: Tensor | None,
        inputs_embeds: Tensor | None,
    ) -> BaseModelOutputWithPastAndCrossAttentions:
        hidden = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        if self.is_decoder:
            cross_mask = create_bidirectional_mask(
                config=self.config,
                inputs_embeds=hidden,
                attention_mask=encoder_attention_mask,
                encoder_hidden_states=encoder_hidden_states,
            )
            hidden = self._decoder_blocks(hidden, encoder_hidden_states, cross_mask)
        else:
            mask = create_bidirectional_mask(
                config=self.config, inputs_embeds=hidden, attention_mask=attention_mask
            )
            hidden = self._encoder_blocks(hidden, mask)
        return BaseModelOutputWithPastAndCrossAttentions(
            last_hidden_state=_norm(self.final_layer_norm, hidden)
        )

    def _encoder_blocks(self, hidden: Tensor, mask: Tensor | None) -> Tensor:
        """Self-attention over every position (the first block's relative position bias), then
        the feed-forward, block by block."""
        scores_mask = None
        for block in self.block:
            layer, feed_forward = block.layer
            attention = layer.SelfAttention
            normed = _norm(layer.layer_norm, hidden)
            query = _heads(attention, attention.q, normed)
            key = _heads(attention, attention.k, normed)
            value = _heads(attention, attention.v, normed)
            if scores_mask is None:
                scores_mask = _scores_mask(attention, mask, query, key)
            hidden = hidden + _attend(attention, query, key, value, scores_mask)
            hidden = _feed_forward(feed_forward, hidden)
        return hidden

    def _decoder_blocks(self, hidden: Tensor, encoder: Tensor, mask: Tensor | None) -> Tensor:
        """One position: its self-attention is its own value (:class:`OnePositionSelfAttention`),
        then the cross-attention to the encoder's output and the feed-forward, block by block."""
        scores_mask = None
        for block in self.block:
            layer, cross, feed_forward = block.layer
            attention = layer.SelfAttention
            normed = _norm(layer.layer_norm, hidden)
            hidden = hidden + _project(attention.o, _project(attention.v, normed))
            attention = cross.EncDecAttention
            query = _heads(attention, attention.q, _norm(cross.layer_norm, hidden))
            key = _heads(attention, attention.k, encoder)
            value = _heads(attention, attention.v, encoder)
            if scores_mask is None:
                scores_mask = _scores_mask(attention, mask, query, key)
            hidden = hidden + _attend(attention, query, key, value, scores_mask)
            hidden = _feed_forward(feed_forward, hidden)
        return hidden


def _norm(norm: T5LayerNorm, hidden: Tensor) -> Tensor:
    """``T5LayerNorm.forward``."""
    variance = hidden.to(torch.float32).pow(2).mean(-1, keepdim=True)
    hidden = hidden * torch.rsqrt(variance + norm.variance_epsilon)
    if norm.weight.dtype in (torch.float16, torch.bfloat16):
        hidden = hidden.to(norm.weight.dtype)
    return norm.weight * hidden


def _project(projection: nn.Module, hidden: Tensor) -> Tensor:
    """A projection's forward: ``nn.Linear``'s own ``F.linear``, any other module called."""
    if type(projection) is nn.Linear:
        return F.linear(hidden, projection.weight, projection.bias)
    return projection(hidden)


def _heads(attention: T5Attention, projection: nn.Module, hidden: Tensor) -> Tensor:
    """[B, N, d_model] -> the projection per head [B, H, N, d_kv]."""
    shape = (*hidden.shape[:-1], -1, attention.key_value_proj_dim)
    return _project(projection, hidden).view(shape).transpose(1, 2)


def _scores_mask(attention: T5Attention, mask: Tensor | None, query: Tensor, key: Tensor) -> Tensor:
    """sdpa's additive mask of T5: the position bias (the block's relative one, or zeros as
    ``T5Attention`` makes them) with the attention mask, as ``sdpa_attention_forward`` makes it."""
    queries, keys = query.shape[-2], key.shape[-2]
    if attention.has_relative_attention_bias:
        bias = attention.compute_bias(queries, keys, device=query.device)
    else:
        bias = torch.zeros(
            (1, attention.n_heads, queries, keys), device=query.device, dtype=query.dtype
        )
    return create_position_bias_mask(bias, mask, False, query, key)


def _attend(
    attention: T5Attention, query: Tensor, key: Tensor, value: Tensor, scores_mask: Tensor
) -> Tensor:
    """The attention's output after its ``o`` projection, [B, N, d_model]."""
    heads = F.scaled_dot_product_attention(
        query, key, value, attn_mask=scores_mask, dropout_p=0.0, scale=attention.scaling
    )
    batch, _, positions, _ = query.shape
    return _project(attention.o, heads.transpose(1, 2).reshape(batch, positions, -1))


def _feed_forward(layer: nn.Module, hidden: Tensor) -> Tensor:
    """``T5LayerFF`` with ``T5DenseActDense``: the residual plus ``wo(act(wi(norm(x))))``."""
    dense = layer.DenseReluDense
    inner = dense.act(_project(dense.wi, _norm(layer.layer_norm, hidden)))
    return hidden + _project(dense.wo, inner)


def lean_t5_stacks(*stacks: T5Stack) -> None:
    """Make each stack a :class:`LeanT5Stack`, in place (the same modules, parameters and
    names: checkpoints and exports do not change). transformers records which outputs a model
    can capture under its class's name, so the stack is registered again under the new one.
    The registry is a plain dict up to transformers 5.22 and a dict whose ``__setitem__`` takes
    the model from 5.23; both store the class's name, which is written here directly."""
    for stack in stacks:
        stack.__class__ = LeanT5Stack
        dict.__setitem__(_CAN_RECORD_REGISTRY, str(LeanT5Stack), stack._can_record_outputs)
