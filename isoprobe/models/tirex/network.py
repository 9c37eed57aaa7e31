"""TiRex's network (Auer et al. 2025, "TiRex: Zero-Shot Forecasting Across Long and Short
Horizons"), written for isoprobe from the architecture the official package builds.

A window's patches of ``p`` steps, each with its missing-step flags (``2p`` inputs), pass a
residual layer into width ``d``; ``num_blocks`` pre-norm sLSTM blocks follow, each
``x + sLSTM(RMSNorm(x))`` then ``x + FFN(RMSNorm(x))``; a final RMSNorm and a residual layer give
every token ``Q x p`` outputs, the quantiles of the next patch.

The sLSTM (Beck et al. 2024, "xLSTM", eqs. 8-17) runs per head over the tokens in order, its
recurrent state ``(h, c, n, m)`` carried from token to token and starting at 0. At token t
the pre-activations of the four gates are ``W x_t + R h_{t-1} + b`` (``W`` block-diagonal per
head, ``R`` per head) and, with the stabiliser ``m``,

    m_t = max(ĩ_t, m_{t-1} + log σ(f̃_t))      (m_1 = ĩ_1)
    i_t = exp(ĩ_t - m_t),  f_t = exp(m_{t-1} + log σ(f̃_t) - m_t)   (each at most 1)
    c_t = f_t c_{t-1} + i_t tanh(z̃_t),  n_t = f_t n_{t-1} + i_t,  h_t = σ(õ_t) c_t / n_t

(``f̃`` clipped at 15 first). The layer's output is ``h`` normalised per head (a group norm whose
scale is ``1 + w``). The recurrence runs in float32 here; the package's pure-torch path runs it
in bfloat16 (docs/models.md gives the difference).

Parameter names are the published checkpoint's, so the published state dict loads unrenamed. In
that layout the four headwise projections are stored, in order, as ``fgate``, ``igate``,
``zgate``, ``ogate`` and their outputs fill the gate slots (input, forget, cell, output) in that
order: the tensor named ``fgate`` makes the input gate's pre-activation and ``igate`` the forget
gate's. :data:`GATE_SLOTS` records this.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from isoprobe.models.tirex.config import TirexShape

#: the published projections' names, in the order of the gate slots they fill
GATE_SLOTS = ("fgate", "igate", "zgate", "ogate")
#: the forget gate's pre-activation is clipped at this value before its log-sigmoid
FORGET_CLIP = 15.0
RMS_EPS = 1e-6
GROUP_NORM_EPS = 1e-5


class ResidualBlock(nn.Module):
    """``W_o relu(W_h x + b_h) + b_o + W_r x + b_r``: the input and the output layer."""

    def __init__(self, inputs: int, hidden: int, outputs: int) -> None:
        super().__init__()
        self.hidden_layer = nn.Linear(inputs, hidden)
        self.output_layer = nn.Linear(hidden, outputs)
        self.residual_layer = nn.Linear(inputs, outputs)

    def forward(self, x: Tensor) -> Tensor:
        return self.output_layer(F.relu(self.hidden_layer(x))) + self.residual_layer(x)


class RMSNorm(nn.Module):
    """``w x / sqrt(mean(x^2) + eps)`` over the last axis."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + RMS_EPS) * self.weight


class HeadwiseLinear(nn.Module):
    """A block-diagonal linear map without bias: head ``h``'s slice of the input times its own
    ``[head_dim, head_dim]`` matrix (``weight[h, out, in]``)."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.weight = nn.Parameter(torch.empty(heads, width // heads, width // heads))
        nn.init.normal_(self.weight, std=(width // heads) ** -0.5)

    def forward(self, x: Tensor) -> Tensor:
        split = x.unflatten(-1, (self.heads, -1))
        return torch.einsum("...hi,hoi->...ho", split, self.weight).flatten(-2)


class SLstmCell(nn.Module):
    """The recurrence of the module docstring. ``_recurrent_kernel_`` [heads, head_dim,
    4 head_dim] maps a head's ``h_{t-1}`` to its four gates (slot-major); ``_bias_`` is stored
    [heads, 4, head_dim] flat."""

    def __init__(self, shape: TirexShape) -> None:
        super().__init__()
        heads, head_dim = shape.num_heads, shape.head_dim
        self.heads, self.head_dim = heads, head_dim
        self._recurrent_kernel_ = nn.Parameter(torch.empty(heads, head_dim, 4 * head_dim))
        self._bias_ = nn.Parameter(torch.zeros(heads * 4 * head_dim))
        nn.init.normal_(self._recurrent_kernel_, std=head_dim**-0.5)

    def forward(self, gates: Tensor) -> Tensor:
        """``gates`` [B, T, 4, heads, head_dim] (the input projections, slot-major) ->
        ``h`` [B, T, heads, head_dim] at every token."""
        batch, tokens = gates.shape[:2]
        bias = self._bias_.view(self.heads, 4, self.head_dim).transpose(0, 1)
        h, c, n, m = (gates.new_zeros(batch, self.heads, self.head_dim) for _ in range(4))
        outputs = []
        for t in range(tokens):
            recurrent = torch.einsum("bhi,hio->bho", h, self._recurrent_kernel_)
            recurrent = recurrent.unflatten(-1, (4, self.head_dim)).transpose(1, 2)
            i_raw, f_raw, z_raw, o_raw = (gates[:, t] + recurrent + bias).unbind(dim=1)
            log_forget = m + F.logsigmoid(f_raw.clamp(max=FORGET_CLIP))
            m_new = i_raw if t == 0 else torch.maximum(i_raw, log_forget)
            i = torch.exp(i_raw - m_new).clamp(max=1.0)
            f = torch.exp(log_forget - m_new).clamp(max=1.0)
            c = f * c + i * torch.tanh(z_raw)
            n = f * n + i
            h = torch.sigmoid(o_raw) * c / n
            m = m_new
            outputs.append(h)
        return torch.stack(outputs, dim=1)


class SLstmLayer(nn.Module):
    """The four headwise input projections, the cell and the per-head group norm."""

    def __init__(self, shape: TirexShape) -> None:
        super().__init__()
        width, heads = shape.embedding_dim, shape.num_heads
        for name in GATE_SLOTS:
            setattr(self, name, HeadwiseLinear(width, heads))
        self.slstm_cell = SLstmCell(shape)
        self.group_norm_weight = nn.Parameter(torch.zeros(width))
        self.heads = heads

    def forward(self, x: Tensor) -> Tensor:
        slots = [getattr(self, name)(x).unflatten(-1, (self.heads, -1)) for name in GATE_SLOTS]
        h = self.slstm_cell(torch.stack(slots, dim=2))
        flat = h.flatten(0, 1).flatten(-2)
        normed = F.group_norm(
            flat, self.heads, weight=1.0 + self.group_norm_weight, eps=GROUP_NORM_EPS
        )
        return normed.view(x.shape)


class FeedForward(nn.Module):
    """``W_down (silu(W_gate x) * W_up x)``, without biases."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.proj_up_gate = nn.Linear(width, hidden, bias=False)
        self.proj_up = nn.Linear(width, hidden, bias=False)
        self.proj_down = nn.Linear(hidden, width, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj_down(F.silu(self.proj_up_gate(x)) * self.proj_up(x))


class SLstmBlock(nn.Module):
    """``x + sLSTM(RMSNorm(x))``, then ``x + FFN(RMSNorm(x))``."""

    def __init__(self, shape: TirexShape) -> None:
        super().__init__()
        self.norm_slstm = RMSNorm(shape.embedding_dim)
        self.slstm_layer = SLstmLayer(shape)
        self.norm_ffn = RMSNorm(shape.embedding_dim)
        self.ffn = FeedForward(shape.embedding_dim, shape.ffn_dim)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.slstm_layer(self.norm_slstm(x))
        return x + self.ffn(self.norm_ffn(x))


class TirexNetwork(nn.Module):
    """Tokens [B, N, 2p] (the patch's values, 0 where missing, then its observed flags) ->
    quantiles of the next patch [B, N, Q, p], in the tokens' units."""

    def __init__(self, shape: TirexShape) -> None:
        super().__init__()
        self.shape = shape
        width, patch = shape.embedding_dim, shape.input_patch_size
        self.input_patch_embedding = ResidualBlock(2 * patch, shape.input_ff_dim, width)
        self.blocks = nn.ModuleList(SLstmBlock(shape) for _ in range(shape.num_blocks))
        self.out_norm = RMSNorm(width)
        outputs = len(shape.quantiles) * shape.output_patch_size
        self.output_patch_embedding = ResidualBlock(width, shape.input_ff_dim, outputs)

    def forward(self, tokens: Tensor) -> Tensor:
        hidden = self.input_patch_embedding(tokens)
        for block in self.blocks:
            hidden = block(hidden)
        out = self.output_patch_embedding(self.out_norm(hidden))
        return out.unflatten(-1, (len(self.shape.quantiles), self.shape.output_patch_size))


def official_name(name: str) -> str:
    """isoprobe's parameter name -> the published one (only the group norm's differs)."""
    return name.replace("slstm_layer.group_norm_weight", "slstm_layer.group_norm.weight")


def isoprobe_name(name: str) -> str:
    """The published parameter name -> isoprobe's (``block_stack.`` prefixes of older
    checkpoints dropped, as the package does)."""
    name = name.replace("block_stack.", "")
    return name.replace("slstm_layer.group_norm.weight", "slstm_layer.group_norm_weight")
