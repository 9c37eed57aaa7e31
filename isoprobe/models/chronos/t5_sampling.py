"""Sampled decoding of a T5 encoder-decoder that shares each window's work across its samples.

``transformers``' ``generate(num_return_sequences=S)`` copies every window's encoder states S
times and projects each copy to cross-attention keys and values, so each decoding step reads
S identical copies of them, and it draws every token with ``torch.multinomial`` over the whole
vocabulary. Chronos-T5 forecasts with S = 20 samples and a 4096-token vocabulary, and those
two costs are most of its forecasting time on a CPU. :func:`sample_tokens` decodes the same
model and draws from the same distribution, with three differences in how:

- cross-attention keys and values are computed once per window, and the S samples of a window
  attend to them as S queries of one attention call;
- self-attention keys and values go into a cache allocated once for the whole horizon;
- a token is drawn among the ``top_k`` tokens the top-k filter keeps (softmax over their
  logits), which is the filtered distribution over the vocabulary, without the draws for the
  rest of it.

So forecasts follow the model's distribution exactly, but not the random stream of
``ChronosPipeline``: the same seed gives other samples. The decoder step is the network's
computation, and :func:`decode_step` is that step alone.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn.functional import scaled_dot_product_attention
from transformers import T5ForConditionalGeneration


class DecoderCache:
    """What the decoder reads at every step: per layer, the cross-attention keys and values of
    each window [B, H, T, d_kv] and the self-attention keys and values written so far
    [B * S, H, steps, d_kv]; the encoder padding as an additive bias [B, 1, 1, T]; the
    decoder's relative position bias [1, H, steps, steps]."""

    def __init__(
        self,
        t5: T5ForConditionalGeneration,
        encoder_states: Tensor,
        encoder_mask: Tensor,
        steps: int,
        num_samples: int,
    ) -> None:
        config = t5.config
        windows, tokens, _ = encoder_states.shape
        self.heads, self.width = config.num_heads, config.d_kv
        self.windows, self.num_samples = windows, num_samples
        blocks = t5.get_decoder().block
        self.cross = []
        for block in blocks:
            attention = block.layer[1].EncDecAttention
            self.cross.append(
                tuple(
                    project(encoder_states)
                    .view(windows, tokens, self.heads, self.width)
                    .transpose(1, 2)
                    for project in (attention.k, attention.v)
                )
            )
        shape = (len(blocks), windows * num_samples, self.heads, steps, self.width)
        self.keys = encoder_states.new_empty(shape)
        self.values = encoder_states.new_empty(shape)
        padding = ~encoder_mask.bool()[:, None, None, :]
        self.padding = torch.zeros(padding.shape, dtype=encoder_states.dtype, device=padding.device)
        self.padding.masked_fill_(padding, torch.finfo(encoder_states.dtype).min)
        self.position_bias = (
            blocks[0]
            .layer[0]
            .SelfAttention.compute_bias(steps, steps, device=encoder_states.device)
        )


def decode_step(
    t5: T5ForConditionalGeneration, token: Tensor, step: int, cache: DecoderCache
) -> Tensor:
    """Next-token logits [B * S, vocab] of the decoder reading ``token`` [B * S] at position
    ``step``, its keys and values for that position written into ``cache``; the same
    computation as ``T5ForConditionalGeneration.forward`` (eval mode) at that position."""
    decoder = t5.get_decoder()
    heads, width = cache.heads, cache.width
    sequences = token.shape[0]
    hidden = decoder.embed_tokens(token)[:, None, :]
    bias = cache.position_bias[:, :, step : step + 1, : step + 1]
    for index, block in enumerate(decoder.block):
        self_layer, cross_layer, feed_forward = block.layer
        attention = self_layer.SelfAttention
        normed = self_layer.layer_norm(hidden)
        query = attention.q(normed).view(sequences, 1, heads, width).transpose(1, 2)
        cache.keys[index, :, :, step] = attention.k(normed).view(sequences, heads, width)
        cache.values[index, :, :, step] = attention.v(normed).view(sequences, heads, width)
        keys = cache.keys[index, :, :, : step + 1]
        values = cache.values[index, :, :, : step + 1]
        mixed = scaled_dot_product_attention(query, keys, values, attn_mask=bias, scale=1.0)
        hidden = hidden + attention.o(mixed.transpose(1, 2).reshape(sequences, 1, -1))

        attention = cross_layer.EncDecAttention
        normed = cross_layer.layer_norm(hidden)
        query = attention.q(normed).view(cache.windows, cache.num_samples, heads, width)
        keys, values = cache.cross[index]
        mixed = scaled_dot_product_attention(
            query.transpose(1, 2), keys, values, attn_mask=cache.padding, scale=1.0
        )
        hidden = hidden + attention.o(mixed.transpose(1, 2).reshape(sequences, 1, -1))
        hidden = feed_forward(hidden)
    hidden = decoder.final_layer_norm(hidden)
    if getattr(t5.config, "scale_decoder_outputs", t5.config.tie_word_embeddings):
        hidden = hidden * t5.config.d_model**-0.5  # tied embeddings: transformers' scaling
    return t5.lm_head(hidden)[:, 0]


def draw(logits: Tensor, temperature: float, top_k: int, top_p: float) -> Tensor:
    """One token per row of ``logits`` [N, vocab] from transformers' sampling distribution:
    logits / temperature, the ``top_k`` largest kept (all when ``top_k`` <= 0), then the
    smallest set of those whose probability reaches ``top_p``, then softmax. Ties at the k-th
    logit keep exactly k tokens (transformers keeps every tied one)."""
    if temperature != 1.0:
        logits = logits / temperature
    kept = logits.shape[-1] if top_k <= 0 else min(top_k, logits.shape[-1])
    top, index = logits.topk(kept, dim=-1)
    if top_p < 1.0:
        probabilities = top.softmax(dim=-1)
        before = probabilities.cumsum(dim=-1) - probabilities
        top = top.masked_fill(before >= top_p, float("-inf"))
    choice = torch.multinomial(top.softmax(dim=-1), 1)
    return index.gather(-1, choice)[:, 0]


@torch.no_grad()
def sample_tokens(
    t5: T5ForConditionalGeneration,
    encoder_states: Tensor,
    encoder_mask: Tensor,
    *,
    steps: int,
    num_samples: int,
    start_token: int,
    banned_token: int | None,
    temperature: float = 1.0,
    top_k: int = 50,
    top_p: float = 1.0,
) -> Tensor:
    """``num_samples`` sampled continuations [B, S, steps] of each window, decoded from the
    encoder's output [B, T, d_model] with its attention mask [B, T]. The decoder starts from
    ``start_token``; ``banned_token`` (EOS, when every forecast runs the whole horizon, as
    ``generate``'s ``min_new_tokens`` does) is never drawn."""
    cache = DecoderCache(t5, encoder_states, encoder_mask, steps, num_samples)
    sequences = encoder_states.shape[0] * num_samples
    token = torch.full((sequences,), start_token, dtype=torch.long, device=encoder_states.device)
    tokens = torch.empty((sequences, steps), dtype=torch.long, device=encoder_states.device)
    for step in range(steps):
        logits = decode_step(t5, token, step, cache)
        if banned_token is not None:
            logits[:, banned_token] = float("-inf")
        token = draw(logits, temperature, top_k, top_p)
        tokens[:, step] = token
    return tokens.view(-1, num_samples, steps)
