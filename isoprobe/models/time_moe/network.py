"""Time-MoE's network (Shi et al. 2024, "Time-MoE: Billion-Scale Time Series Foundation Models
with Mixture of Experts"; official code github.com/Time-MoE/Time-MoE, modeling_time_moe.py),
isoprobe's own implementation.

A decoder-only transformer with one token per time step:

- the point-wise gated input embedding ``e(x) = silu(x w_g) * (x w_e)`` (a SwiGLU of the value);
- pre-norm blocks (RMSNorm) of causal self-attention with rotary positions (biased q, k, v;
  unbiased o) and a sparse mixture of SwiGLU experts: a softmax router picks the top k of
  ``num_experts`` experts per token, weighted by their (not renormalised) router
  probabilities, plus a shared expert gated by ``sigmoid(x w_s)``;
- a final RMSNorm and one linear output head per forecast horizon in ``horizon_lengths``.

The submodules carry the official attribute names, so a state dict has the official
checkpoints' tensor names (``model.layers.0.ffn_layer.experts.3.up_proj.weight``,
``lm_heads.1.out_layer.weight``).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from isoprobe.models.time_moe.config import TimeMoeShape

#: the official initialisation's standard deviation (``initializer_range``)
INIT_STD = 0.02
#: an expert multiplies at least this many rows (zero rows fill up a short block): BLAS takes
#: another kernel, which rounds differently, for a product of a handful of rows, so without
#: this a token's output would depend on how many other tokens the batch routes to its expert
#: (and trainer=ddp_sim, half the batch per process, would differ from one process)
MIN_EXPERT_ROWS = 16


class RMSNorm(nn.Module):
    """``w * x / sqrt(mean(x^2) + eps)``, computed in float32."""

    def __init__(self, width: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class GatedValueEmbedding(nn.Module):
    """One value [B, T, 1] -> its token [B, T, d]: ``silu(x w_g) * (x w_e)``, no bias, so a
    value of 0 embeds to the zero vector."""

    def __init__(self, shape: TimeMoeShape) -> None:
        super().__init__()
        self.emb_layer = nn.Linear(shape.input_size, shape.hidden_size, bias=False)
        self.gate_layer = nn.Linear(shape.input_size, shape.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return F.silu(self.gate_layer(x)) * self.emb_layer(x)


class SwiGLU(nn.Module):
    """``down(silu(gate(x)) * up(x))``: an expert, and the shared expert."""

    def __init__(self, width: int, inner: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(width, inner, bias=False)
        self.up_proj = nn.Linear(width, inner, bias=False)
        self.down_proj = nn.Linear(inner, width, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def rotary_angles(positions: Tensor, head_dim: int, theta: float) -> tuple[Tensor, Tensor]:
    """cos and sin [B, T, head_dim] of RoPE at integer ``positions`` [B, T]: frequencies
    ``theta^(-2i/head_dim)``, each used for both halves of the head (the half-rotation layout)."""
    inverse = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    inverse = inverse.to(positions.device)
    angles = positions.float().unsqueeze(-1) * inverse
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """RoPE on [B, heads, T, head_dim]: ``x cos + (-x2, x1) sin`` with x1, x2 its halves."""
    half = x.shape[-1] // 2
    turned = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos.unsqueeze(1) + turned * sin.unsqueeze(1)


class RotaryAttention(nn.Module):
    """Causal multi-head self-attention with rotary positions; a key that is not observed is
    hidden from every query. A query that sees no key at all (left padding) spreads evenly over
    all keys, as the official additive ``finfo.min`` mask makes it; such positions are never
    real tokens and no real position reads them."""

    def __init__(self, shape: TimeMoeShape) -> None:
        super().__init__()
        width, head = shape.hidden_size, shape.head_dim
        self.heads, self.kv_heads, self.head_dim = shape.num_attention_heads, shape.kv_heads, head
        self.theta = shape.rope_theta
        self.q_proj = nn.Linear(width, self.heads * head, bias=True)
        self.k_proj = nn.Linear(width, self.kv_heads * head, bias=True)
        self.v_proj = nn.Linear(width, self.kv_heads * head, bias=True)
        self.o_proj = nn.Linear(self.heads * head, width, bias=False)

    def forward(self, x: Tensor, allowed: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """``x`` [B, T, d]; ``allowed`` [B, 1, T, T] (query may read key); cos, sin [B, T, hd]."""
        batch, length, _ = x.shape

        def split(y: Tensor, heads: int) -> Tensor:
            return y.view(batch, length, heads, self.head_dim).transpose(1, 2)

        q = rotate(split(self.q_proj(x), self.heads), cos, sin)
        k = rotate(split(self.k_proj(x), self.kv_heads), cos, sin)
        v = split(self.v_proj(x), self.kv_heads)
        group = self.heads // self.kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = q @ k.transpose(2, 3) / math.sqrt(self.head_dim)
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
        weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        out = (weights @ v).transpose(1, 2).reshape(batch, length, self.heads * self.head_dim)
        return self.o_proj(out)


class SparseExperts(nn.Module):
    """The mixture of experts of a block: top-k routed SwiGLU experts plus a sigmoid-gated shared
    expert. Returns the output [B, T, d] and the router logits [B T, num_experts] (for the
    balance loss)."""

    def __init__(self, shape: TimeMoeShape) -> None:
        super().__init__()
        width = shape.hidden_size
        self.top_k = shape.num_experts_per_tok
        self.gate = nn.Linear(width, shape.num_experts, bias=False)
        self.experts = nn.ModuleList(
            SwiGLU(width, shape.expert_size) for _ in range(shape.num_experts)
        )
        self.shared_expert = SwiGLU(width, shape.intermediate_size)
        self.shared_expert_gate = nn.Linear(width, 1, bias=False)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        batch, length, width = x.shape
        tokens = x.reshape(-1, width)
        logits = self.gate(tokens)
        probabilities = torch.softmax(logits, dim=1, dtype=torch.float32)
        weights, chosen = probabilities.topk(self.top_k, dim=-1)
        weights = weights.to(tokens.dtype)
        routed = torch.zeros_like(tokens)
        for index, expert in enumerate(self.experts):
            rows, slots = torch.where(chosen == index)
            block = F.pad(tokens[rows], (0, 0, 0, max(0, MIN_EXPERT_ROWS - len(rows))))
            contribution = expert(block)[: len(rows)] * weights[rows, slots, None]
            routed = routed.index_add(0, rows, contribution)
        shared = torch.sigmoid(self.shared_expert_gate(tokens)) * self.shared_expert(tokens)
        return (routed + shared).view(batch, length, width), logits


class DecoderBlock(nn.Module):
    """Pre-norm attention and mixture of experts, each added to the residual stream. Returns
    the block's output [B, T, d] and its router logits."""

    def __init__(self, shape: TimeMoeShape) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.self_attn = RotaryAttention(shape)
        self.post_attention_layernorm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.ffn_layer = SparseExperts(shape)

    def forward(
        self, x: Tensor, allowed: Tensor, cos: Tensor, sin: Tensor
    ) -> tuple[Tensor, Tensor]:
        x = x + self.self_attn(self.input_layernorm(x), allowed, cos, sin)
        mixed, logits = self.ffn_layer(self.post_attention_layernorm(x))
        return x + mixed, logits


class TimeMoeBackbone(nn.Module):
    """Embedding, blocks and final norm (the official ``TimeMoeModel``)."""

    def __init__(self, shape: TimeMoeShape) -> None:
        super().__init__()
        self.shape = shape
        self.embed_layer = GatedValueEmbedding(shape)
        self.layers = nn.ModuleList(DecoderBlock(shape) for _ in range(shape.num_hidden_layers))
        self.norm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)

    def forward(
        self, values: Tensor, observed: Tensor, positions: Tensor
    ) -> tuple[Tensor, list[Tensor]]:
        """``values`` [B, T] (normalised, 0 where missing), ``observed`` [B, T] bool,
        ``positions`` [B, T] -> the final-norm hidden states [B, T, d] and every block's router
        logits."""
        length = values.shape[1]
        causal = torch.ones(length, length, dtype=torch.bool, device=values.device).tril()
        allowed = (causal & observed[:, None, :]).unsqueeze(1)
        cos, sin = rotary_angles(positions, self.shape.head_dim, self.shape.rope_theta)
        x = self.embed_layer(values.unsqueeze(-1))
        router_logits = []
        for layer in self.layers:
            x, logits = layer(x, allowed, cos, sin)
            router_logits.append(logits)
        return self.norm(x), router_logits


class OutputHead(nn.Module):
    """A horizon's head: the hidden state at step t -> the next ``horizon`` values."""

    def __init__(self, width: int, horizon: int) -> None:
        super().__init__()
        self.out_layer = nn.Linear(width, horizon, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.out_layer(x)


class TimeMoeNetwork(nn.Module):
    """The backbone and its output heads (the official ``TimeMoeForPrediction``'s weights)."""

    def __init__(self, shape: TimeMoeShape) -> None:
        super().__init__()
        self.shape = shape
        self.model = TimeMoeBackbone(shape)
        self.lm_heads = nn.ModuleList(
            OutputHead(shape.hidden_size, horizon) for horizon in shape.horizon_lengths
        )
        self.apply(_initialise)


def _initialise(module: nn.Module) -> None:
    """The official initialisation: linear weights ~ N(0, 0.02^2), biases 0 (norms: 1)."""
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, std=INIT_STD)
        if module.bias is not None:
            nn.init.zeros_(module.bias)


def balance_loss(router_logits: list[Tensor], top_k: int, observed: Tensor) -> Tensor:
    """The router's auxiliary load-balancing loss (Switch Transformer, Fedus et al. 2021, eqs.
    4-6; the official ``load_balancing_loss_func``) over every block's tokens that are
    ``observed``: ``E * sum_e f_e P_e``, with ``f_e`` [top_k, E] the share of tokens whose j-th
    choice is expert e and ``P_e`` the mean router probability of e."""
    logits = torch.cat(router_logits, dim=0)
    experts = logits.shape[-1]
    probabilities = torch.softmax(logits, dim=-1)
    chosen = probabilities.topk(top_k, dim=-1).indices
    picked = F.one_hot(chosen, experts).float()
    weight = observed.reshape(-1).float().repeat(len(router_logits))
    total = weight.sum().clamp_min(1.0)
    share = (picked * weight[:, None, None]).sum(dim=0) / total
    mean_probability = (probabilities * weight[:, None]).sum(dim=0) / total
    return (share * mean_probability.unsqueeze(0)).sum() * experts
