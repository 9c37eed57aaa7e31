"""Moirai 2.0's network (Salesforce 2025; official code: uni2ts 2.0, ``uni2ts/model/moirai2/
module.py`` and ``uni2ts/module/``), isoprobe's own implementation.

A decoder-only transformer over patches of ``p`` steps of one variate:

- ``in_proj``, a residual block ``W_o silu(W_h z + b_h) + b_o + W_r z + b_r`` of a patch's ``p``
  standardised values and its ``p`` observed-step indicators, ``z`` [2p];
- pre-norm blocks ``y = x + attn(norm1(x))``, ``y + ffn(norm2(y))`` (RMSNorm
  ``w x / sqrt(mean(x^2) + 1e-5)``), then a final RMSNorm. The attention has ``d / 64`` heads
  of 64, separate q/k/v/out projections without biases, an RMSNorm of each head's q and k,
  then rotary positions on the first half of each head's features (pairs ``(x_{2i},
  x_{2i+1})`` turned by ``t / 10000^(4i/64)``, ``t`` the patch's time index), scores scaled by
  ``1/sqrt(64)`` plus a learned per-head bias for "same variate" (one variate here, so a
  constant per head that the softmax ignores). A patch attends to the patches of its own
  sample (left padding is a sample of its own) whose time index is not later (causal by time
  index, uni2ts' ``packed_causal_attention_mask``). The feed-forward is gated:
  ``fc2(silu(fc_gate(x)) * fc1(x))``;
- ``out_proj``, a residual block to ``num_predict_token x len(quantile_levels) x p`` outputs:
  the quantiles of the next ``num_predict_token`` patches, in the window's standardised units.

The submodules carry the official attribute names, so the state dict has the published tensor
names (``encoder.layers.3.self_attn.q_proj.weight``, ``out_proj.hidden_layer.bias``). Scratch
weights are PyTorch's default initialisation (the official ``reset_parameters`` is the same
Kaiming-uniform rule for the residual blocks), norm scales 1.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from isoprobe.models.moirai2.config import HEAD_WIDTH, Moirai2Shape

#: RMSNorm's epsilon and the rotary base (uni2ts' ``RMSNorm`` and ``RotaryProjection``)
EPSILON, ROTARY_BASE = 1e-5, 10000.0


class RMSNorm(nn.Module):
    """``weight * x / sqrt(mean(x^2) + 1e-5)`` over the last axis."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPSILON) * self.weight


class ResidualBlock(nn.Module):
    """``output_layer(silu(hidden_layer(x))) + residual_layer(x)``, with biases."""

    def __init__(self, inputs: int, hidden: int, outputs: int) -> None:
        super().__init__()
        self.hidden_layer = nn.Linear(inputs, hidden)
        self.output_layer = nn.Linear(hidden, outputs)
        self.residual_layer = nn.Linear(inputs, outputs)

    def forward(self, x: Tensor) -> Tensor:
        return self.output_layer(F.silu(self.hidden_layer(x))) + self.residual_layer(x)


def rotate_first_half(x: Tensor, time_id: Tensor) -> Tensor:
    """Rotary positions on the first half of ``x`` [B, H, N, d]: pair ``i`` of it,
    ``(x_{2i}, x_{2i+1})``, becomes ``(a cos - b sin, b cos + a sin)`` at angle
    ``t theta_i``, ``theta_i = 10000^(-2i / (d/2))``, ``t`` = ``time_id`` [B, N]; the second
    half is left as it is."""
    return rotate_first_half_at(x, *rotary_angles(time_id, x.shape[-1]))


def rotary_angles(time_id: Tensor, head_width: int) -> tuple[Tensor, Tensor]:
    """The cosines and sines [B, 1, N, head_width / 4] of :func:`rotate_first_half`'s angles,
    the same in every layer."""
    width = head_width // 2
    theta = 1.0 / ROTARY_BASE ** (torch.arange(0, width, 2, device=time_id.device).float() / width)
    angles = time_id[:, None, :, None].float() * theta
    return angles.cos(), angles.sin()


def rotate_first_half_at(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """:func:`rotate_first_half` at the angles of :func:`rotary_angles`."""
    width = x.shape[-1] // 2
    turned, kept = x[..., :width], x[..., width:]
    a, b = turned[..., 0::2], turned[..., 1::2]
    pairs = torch.stack([a * cos - b * sin, b * cos + a * sin], dim=-1).flatten(-2)
    return torch.cat([pairs, kept], dim=-1)


class VariateBias(nn.Module):
    """The learned per-head score bias: ``emb[1]`` between patches of the same variate,
    ``emb[0]`` across variates. Every patch here is of the one variate."""

    def __init__(self, heads: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(2, heads)

    def forward(self) -> Tensor:
        """[H, 1, 1]: the bias every pair of patches (one variate) gets."""
        return self.emb.weight[1][:, None, None]


class Attention(nn.Module):
    """Self-attention over patches (module docstring); returns the output after ``out_proj``."""

    def __init__(self, shape: Moirai2Shape) -> None:
        super().__init__()
        width = shape.d_model
        self.heads = shape.num_heads
        self.var_attn_bias = VariateBias(self.heads)
        self.q_proj = nn.Linear(width, width, bias=False)
        self.k_proj = nn.Linear(width, width, bias=False)
        self.v_proj = nn.Linear(width, width, bias=False)
        self.q_norm = RMSNorm(HEAD_WIDTH)
        self.k_norm = RMSNorm(HEAD_WIDTH)
        self.out_proj = nn.Linear(width, width, bias=False)
        self.dropout = nn.Dropout(shape.attn_dropout_p)

    def _heads(self, x: Tensor) -> Tensor:
        return x.view(*x.shape[:2], self.heads, HEAD_WIDTH).transpose(1, 2)

    def forward(self, x: Tensor, allowed: Tensor, rotary: tuple[Tensor, Tensor]) -> Tensor:
        """``x`` [B, N, d]; ``allowed`` [B, N, N] (query, key); ``rotary``: the cosines and
        sines of the patches' rotary angles (:func:`rotary_angles`)."""
        q = rotate_first_half_at(self.q_norm(self._heads(self.q_proj(x))), *rotary)
        k = rotate_first_half_at(self.k_norm(self._heads(self.k_proj(x))), *rotary)
        v = self._heads(self.v_proj(x))
        scores = q @ k.transpose(-2, -1) / math.sqrt(HEAD_WIDTH) + self.var_attn_bias()
        scores = scores.masked_fill(~allowed[:, None], float("-inf"))
        weights = self.dropout(torch.softmax(scores, dim=-1))
        mixed = (weights @ v).transpose(1, 2).reshape(x.shape)
        return self.out_proj(mixed)


class FeedForward(nn.Module):
    """``fc2(silu(fc_gate(x)) * fc1(x))``, no biases, dropout after the product and after
    ``fc2``."""

    def __init__(self, width: int, hidden: int, dropout: float) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, hidden, bias=False)
        self.fc2 = nn.Linear(hidden, width, bias=False)
        self.fc_gate = nn.Linear(width, hidden, bias=False)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        hidden = self.dropout1(F.silu(self.fc_gate(x)) * self.fc1(x))
        return self.dropout2(self.fc2(hidden))


class Block(nn.Module):
    """``y = x + dropout(attn(norm1(x)))``, then ``y + ffn(norm2(y))``."""

    def __init__(self, shape: Moirai2Shape) -> None:
        super().__init__()
        self.self_attn = Attention(shape)
        self.ffn = FeedForward(shape.d_model, shape.d_ff, shape.dropout_p)
        self.norm1 = RMSNorm(shape.d_model)
        self.norm2 = RMSNorm(shape.d_model)
        self.dropout = nn.Dropout(shape.dropout_p)

    def forward(self, x: Tensor, allowed: Tensor, rotary: tuple[Tensor, Tensor]) -> Tensor:
        x = x + self.dropout(self.self_attn(self.norm1(x), allowed, rotary))
        return x + self.ffn(self.norm2(x))


class Encoder(nn.Module):
    """The blocks and the final norm (uni2ts' ``TransformerEncoder``)."""

    def __init__(self, shape: Moirai2Shape) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Block(shape) for _ in range(shape.num_layers))
        self.norm = RMSNorm(shape.d_model)

    def forward(self, x: Tensor, allowed: Tensor, time_id: Tensor) -> Tensor:
        rotary = rotary_angles(time_id, HEAD_WIDTH)  # once for every layer
        for layer in self.layers:
            x = layer(x, allowed, rotary)
        return self.norm(x)


class Moirai2Network(nn.Module):
    """``in_proj``, the encoder and ``out_proj`` (the official module's weights)."""

    def __init__(self, shape: Moirai2Shape) -> None:
        super().__init__()
        self.shape = shape
        width, patch = shape.d_model, shape.patch_size
        self.in_proj = ResidualBlock(2 * patch, width, width)
        self.encoder = Encoder(shape)
        self.out_proj = ResidualBlock(width, width, shape.outputs)

    def forward(
        self,
        scaled: Tensor,
        observed: Tensor,
        sample_id: Tensor,
        time_id: Tensor,
        last_only: bool = False,
    ) -> tuple[Tensor, Tensor]:
        """Standardised patches ``scaled`` [B, N, p], ``observed`` [B, N, p], ``sample_id`` and
        ``time_id`` [B, N] -> the final norm's output [B, N, d] and the quantiles
        [B, N, num_predict_token, Q, p] of the patches after each, standardised;
        ``last_only``: the quantiles after the last patch alone (N = 1 in them: all a
        forecast reads)."""
        same_sample = sample_id[:, :, None] == sample_id[:, None, :]
        allowed = same_sample & (time_id[:, None, :] <= time_id[:, :, None])
        x = self.in_proj(torch.cat([scaled, observed.to(scaled.dtype)], dim=-1))
        x = self.encoder(x, allowed, time_id)
        shape = self.shape
        ends = x[:, -1:] if last_only else x
        out = self.out_proj(ends).view(
            *ends.shape[:2], shape.num_predict_token, len(shape.quantile_levels), shape.patch_size
        )
        return x, out
