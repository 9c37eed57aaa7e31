"""Sundial's network (Liu et al. 2025, "Sundial: A Family of Highly Capable Time Series
Foundation Models"; official code: the Hugging Face remote code of ``thuml/sundial-base-128m``,
``modeling_sundial.py`` and ``flow_loss.py``), isoprobe's own implementation.

- **Patch embedding** (:class:`PatchEmbedding`): a series [B, T] (T a multiple of the token
  length p) is cut into tokens of p steps; each token's values ``x`` and its mask ``m`` (1 where
  a step holds an observed value, 0 at left padding or a gap; the value there reads 0) are
  concatenated, ``u = [x, m]`` (2p features), and embedded as
  ``W_out silu(W_hid u + b_hid) + b_out + W_res u + b_res``.
- **Decoder layers** (:class:`DecoderLayer`, pre-norm): ``h = x + W_O attn(LN_1(x))``,
  ``y = h + W_down(silu(W_gate z) * W_up z)`` with ``z = LN_2(h)`` (LayerNorm, eps 1e-5).
  The attention is causal, with biased q, k, v and an unbiased output projection; rotary
  positions turn q and k of each head at token n by angles ``n / 10000^(2i/d_h)``, pairing
  feature ``i`` with feature ``i + d_h/2`` (the halves layout); scores ``q·k / sqrt(d_h)``.
  A final LayerNorm follows the last layer.
- **Flow-matching network** (:class:`FlowNet`, the official ``SimpleMLPAdaLN``): given a token's
  final state ``z``, a noisy output ``x_t`` of P steps and a time ``t`` in [0, 1), it predicts the
  clean output ``x_1``. ``y = MLP(sinusoid(1000 t)) + W_c z`` conditions every block (adaptive
  LayerNorm): ``x_0 = W_in x_t``; per residual block ``(s, c, g) = W_mod silu(y)``,
  ``x ← x + g · MLP(LN(x) (1 + c) + s)``; finally ``(s, c) = W_mod silu(y)``,
  ``W_lin (LN(x) (1 + c) + s)`` (LayerNorms eps 1e-6, the final one without affine weights).
  The sinusoid of dimension 256: ``[cos(τ f_k), sin(τ f_k)]`` with ``f_k = 10000^(-k/128)``.
- **Training** (:func:`flow_matching_loss`): for a target ``x_1`` (the P steps after a token),
  noise ``ε ~ N(0, I)`` and ``t ~ U[0, 1)``, the head sees ``x_t = t x_1 + (1 - t) ε`` and is
  trained on ``Σ_j m_j (x̂_1,j - x_1,j)^2 / j`` (steps ``j = 1..P`` weighted by ``1/j``, ``m``
  the observed steps), averaged over the tokens that count.
- **Sampling** (:meth:`FlowHead.sample`): from ``x = ε ~ N(0, I)``, ``K`` Euler steps
  ``x ← x + (x̂_1(x, t_i) - ε) / K`` at ``t_i = i / K``: the velocity of the straight path from
  the draw's own noise to the predicted output.

isoprobe's head (:class:`FlowHead`) holds the final LayerNorm with the flow network, so that
it maps the last layer's output to the forecast (``model.adapt=head_only`` trains both).
Tensor names follow the published checkpoint's after the prefixes (:func:`official_name`): the
backbone's and the final norm's under ``model.``, the flow network's under ``flow_loss.net.``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from isoprobe.models.sundial.config import ROTARY_BASE, SundialShape

#: the time embedding's sinusoid width, the scale of its times, and the head's LayerNorm eps
TIME_FEATURES, TIME_SCALE, HEAD_EPSILON = 256, 1000.0, 1e-6
#: state-dict prefixes, isoprobe's -> the published ones (the rest of the backbone's get
#: ``model.``)
PREFIXES = {"head.norm.": "model.norm.", "head.net.": "flow_loss.net."}
OFFICIAL_BACKBONE_PREFIX = "model."


class PatchEmbedding(nn.Module):
    """Tokens of ``p`` values and their ``p`` mask bits -> ``hidden_size`` (module docstring)."""

    def __init__(self, shape: SundialShape) -> None:
        super().__init__()
        features = 2 * shape.input_token_len
        self.token_length = shape.input_token_len
        self.hidden_layer = nn.Linear(features, shape.intermediate_size)
        self.output_layer = nn.Linear(shape.intermediate_size, shape.hidden_size)
        self.residual_layer = nn.Linear(features, shape.hidden_size)
        self.dropout = nn.Dropout(shape.dropout_rate)

    def forward(self, values: Tensor, observed: Tensor) -> Tensor:
        """``values`` [B, T] (0 where not observed) and ``observed`` [B, T] -> [B, N, d]."""
        tokens = torch.cat(
            [
                values.unflatten(-1, (-1, self.token_length)),
                observed.to(values.dtype).unflatten(-1, (-1, self.token_length)),
            ],
            dim=-1,
        )
        inner = self.output_layer(F.silu(self.hidden_layer(tokens)))
        return self.dropout(inner) + self.residual_layer(tokens)


def rotate_halves(x: Tensor) -> Tensor:
    """Rotary positions on ``x`` [B, heads, N, d_h], feature ``i`` paired with ``i + d_h/2``."""
    length, width = x.shape[-2], x.shape[-1]
    exponents = torch.arange(0, width, 2, device=x.device).float() / width
    frequencies = 1.0 / ROTARY_BASE**exponents
    positions = torch.arange(length, device=x.device).float()
    angles = torch.outer(positions, frequencies).repeat(1, 2)
    first, second = x.chunk(2, dim=-1)
    turned = torch.cat([-second, first], dim=-1)
    return x * angles.cos().to(x.dtype) + turned * angles.sin().to(x.dtype)


class SelfAttention(nn.Module):
    """Causal multi-head rotary self-attention; returns the output after ``o_proj``."""

    def __init__(self, shape: SundialShape) -> None:
        super().__init__()
        width = shape.hidden_size
        self.heads, self.dropout = shape.num_attention_heads, shape.dropout_rate
        self.q_proj = nn.Linear(width, width)
        self.k_proj = nn.Linear(width, width)
        self.v_proj = nn.Linear(width, width)
        self.o_proj = nn.Linear(width, width, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        """[B, N, d] -> [B, N, d]."""

        def split(t: Tensor) -> Tensor:
            return t.unflatten(-1, (self.heads, -1)).transpose(1, 2)

        q = rotate_halves(split(self.q_proj(x)))
        k = rotate_halves(split(self.k_proj(x)))
        mixed = F.scaled_dot_product_attention(
            q,
            k,
            split(self.v_proj(x)),
            dropout_p=self.dropout if self.training else 0.0,
            is_causal=True,
        )
        return self.o_proj(mixed.transpose(1, 2).flatten(-2))


class GatedFeedForward(nn.Module):
    """``down(silu(gate(x)) * up(x))``, without biases."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(width, hidden, bias=False)
        self.up_proj = nn.Linear(width, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, width, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """``h = x + attn(norm1(x))``, ``h + ffn_layer(norm2(h))``."""

    def __init__(self, shape: SundialShape) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(shape.hidden_size)
        self.self_attn = SelfAttention(shape)
        self.norm2 = nn.LayerNorm(shape.hidden_size)
        self.ffn_layer = GatedFeedForward(shape.hidden_size, shape.intermediate_size)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.self_attn(self.norm1(x))
        return x + self.ffn_layer(self.norm2(x))


def time_features(t: Tensor) -> Tensor:
    """The sinusoid [N, 256] of times ``t`` [N] in [0, 1), read at ``1000 t``."""
    half = TIME_FEATURES // 2
    frequencies = torch.exp(
        -math.log(10000.0) * torch.arange(half, dtype=torch.float32, device=t.device) / half
    )
    angles = (t.float() * TIME_SCALE)[:, None] * frequencies
    return torch.cat([angles.cos(), angles.sin()], dim=-1)


class TimeEmbedding(nn.Module):
    """``mlp(sinusoid(1000 t))``: Linear, SiLU, Linear."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.mlp = nn.Sequential(
            nn.Linear(TIME_FEATURES, width), nn.SiLU(), nn.Linear(width, width)
        )

    def forward(self, t: Tensor) -> Tensor:
        return self.mlp(time_features(t))


def modulated(x: Tensor, shift: Tensor, scale: Tensor) -> Tensor:
    """Adaptive LayerNorm's affine map ``x (1 + scale) + shift``."""
    return x * (1 + scale) + shift


class ResidualBlock(nn.Module):
    """``x + g · mlp(LN(x) (1 + c) + s)`` with ``(s, c, g)`` read from the condition."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.in_ln = nn.LayerNorm(width, eps=HEAD_EPSILON)
        self.mlp = nn.Sequential(nn.Linear(width, width), nn.SiLU(), nn.Linear(width, width))
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(width, 3 * width))

    def forward(self, x: Tensor, modulation: Tensor) -> Tensor:
        """``x`` [..., N, w] under the modulation [N, 3w] of its rows' condition."""
        shift, scale, gate = modulation.chunk(3, dim=-1)
        return x + gate * self.mlp(modulated(self.in_ln(x), shift, scale))


class FinalLayer(nn.Module):
    """``linear(LN(x) (1 + c) + s)`` (LayerNorm without weights)."""

    def __init__(self, width: int, out: int) -> None:
        super().__init__()
        self.norm_final = nn.LayerNorm(width, elementwise_affine=False, eps=HEAD_EPSILON)
        self.linear = nn.Linear(width, out)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(width, 2 * width))

    def forward(self, x: Tensor, modulation: Tensor) -> Tensor:
        """``x`` [..., N, w] under the modulation [N, 2w] of its rows' condition."""
        shift, scale = modulation.chunk(2, dim=-1)
        return self.linear(modulated(self.norm_final(x), shift, scale))


class FlowNet(nn.Module):
    """The official ``SimpleMLPAdaLN``: predicts a token's clean output from a noisy one
    (module docstring)."""

    def __init__(self, shape: SundialShape) -> None:
        super().__init__()
        width, out = shape.hidden_size, shape.output_length
        self.time_embed = TimeEmbedding(width)
        self.cond_embed = nn.Linear(width, width)
        self.input_proj = nn.Linear(out, width)
        self.res_blocks = nn.ModuleList(ResidualBlock(width) for _ in range(shape.flow_loss_depth))
        self.final_layer = FinalLayer(width, out)

    def forward(self, state: Tensor, noisy: Tensor, t: Tensor) -> Tensor:
        """Given token states ``state`` [N, d], ``noisy`` outputs [N, P] at times ``t`` [N] ->
        the predicted clean outputs [N, P]."""
        condition = self.time_embed(t) + self.cond_embed(state)
        return self.denoise(noisy, self.modulations(condition))

    def modulations(self, condition: Tensor) -> list[Tensor]:
        """Each residual block's and the final layer's adaptive-norm parameters [N, k w] of
        the conditions [N, w] (time embedding plus state embedding)."""
        blocks = [block.adaLN_modulation(condition) for block in self.res_blocks]
        return [*blocks, self.final_layer.adaLN_modulation(condition)]

    def denoise(self, noisy: Tensor, modulations: list[Tensor]) -> Tensor:
        """The predicted clean outputs [..., N, P] of ``noisy`` [..., N, P] under the
        ``modulations`` of their rows' conditions (leading dimensions broadcast: the samples
        of one token share its condition)."""
        x = self.input_proj(noisy)
        for block, modulation in zip(self.res_blocks, modulations[:-1], strict=True):
            x = block(x, modulation)
        return self.final_layer(x, modulations[-1])


class FlowHead(nn.Module):
    """The output head: the final LayerNorm (``norm``, the official backbone's last module)
    and the flow network (``net``), from the last layer's output to the clean outputs."""

    def __init__(self, shape: SundialShape) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(shape.hidden_size)
        self.net = FlowNet(shape)
        self.output_length, self.sampling_steps = shape.output_length, shape.num_sampling_steps

    def forward(self, hidden: Tensor, noisy: Tensor, t: Tensor) -> Tensor:
        """The last layer's outputs ``hidden`` [N, d], ``noisy`` outputs [N, P] at times ``t``
        [N] -> the predicted clean outputs [N, P]."""
        return self.net(self.norm(hidden), noisy, t)

    def sample(self, hidden: Tensor, num_samples: int) -> Tensor:
        """``num_samples`` draws [B, S, P] from the last layer's outputs ``hidden`` [B, d] by
        Euler steps (module docstring); the noise is one draw of [S · B, P], sample-major.

        The official code repeats each state for its samples and embeds every copy, and the
        time of a step, at every step. A token's condition, and hence its modulations, is the
        same for all its samples and the time the same for all tokens, so here the state is
        embedded once, the time once per step, the modulations once per step and token, and
        broadcast over the samples: the same numbers (to float rounding), S times fewer rows
        through everything but the noisy outputs' path."""
        state = self.norm(hidden)
        embedded = self.net.cond_embed(state)
        shape = (num_samples, len(state), self.output_length)
        noise = torch.randn(shape[0] * shape[1], shape[2], device=state.device).view(shape)
        x, step = noise, 1.0 / self.sampling_steps
        for i in range(self.sampling_steps):
            t = torch.full((1,), i / self.sampling_steps, device=state.device)
            modulations = self.net.modulations(self.net.time_embed(t) + embedded)
            x = x + (self.net.denoise(x, modulations) - noise) * step
        return x.transpose(0, 1)


def flow_matching_loss(
    head: FlowHead,
    hidden: Tensor,
    targets: Tensor,
    observed: Tensor,
    noise: Tensor,
    t: Tensor,
) -> Tensor:
    """The flow-matching objective (module docstring) of the last layer's outputs ``hidden``
    [R, d] at tokens whose next ``P`` steps are ``targets`` [R, P] (finite), ``observed``
    [R, P] where they hold a value, with ``noise`` [R, P] and times ``t`` [R]: the mean, over
    the rows holding an observed step, of ``Σ_j observed_j (x̂_j - x_j)^2 / j``."""
    noisy = t[:, None] * targets + (1 - t[:, None]) * noise
    predicted = head(hidden, noisy, t)
    weights = 1.0 / torch.arange(1, targets.shape[-1] + 1, device=targets.device)
    per_row = (observed * weights * (predicted - targets) ** 2).sum(-1)
    counted = observed.any(-1).to(per_row.dtype)
    return (per_row * counted).sum() / counted.sum().clamp_min(1.0)


class SundialNetwork(nn.Module):
    """Patch embedding, decoder layers and the head (final norm and flow network): the
    official weights."""

    def __init__(self, shape: SundialShape) -> None:
        super().__init__()
        self.shape = shape
        self.embed_layer = PatchEmbedding(shape)
        self.layers = nn.ModuleList(DecoderLayer(shape) for _ in range(shape.num_hidden_layers))
        self.head = FlowHead(shape)

    def forward(self, values: Tensor, observed: Tensor) -> Tensor:
        """A normalised series [B, T] (T a multiple of the token length; 0 where not
        ``observed``) -> the last layer's output [B, N, d] (the head's final norm follows)."""
        x = self.embed_layer(values, observed)
        for layer in self.layers:
            x = layer(x)
        return x


def official_name(name: str) -> str:
    """A state-dict name of :class:`SundialNetwork` -> the published one."""
    for ours, official in PREFIXES.items():
        if name.startswith(ours):
            return official + name[len(ours) :]
    return OFFICIAL_BACKBONE_PREFIX + name


def isoprobe_names(weights: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Published tensors -> :class:`SundialNetwork`'s names; a name under neither prefix keeps
    its own, so that the fit check names it."""
    renamed = {}
    for name, tensor in weights.items():
        ours = [
            mine + name[len(theirs) :]
            for mine, theirs in PREFIXES.items()
            if name.startswith(theirs)
        ]
        if ours:
            name = ours[0]
        elif name.startswith(OFFICIAL_BACKBONE_PREFIX):
            name = name[len(OFFICIAL_BACKBONE_PREFIX) :]
        renamed[name] = tensor
    return renamed
