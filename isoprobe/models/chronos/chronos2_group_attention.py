"""Chronos-2's group attention when every window is its own group, without the attention.

Chronos-2's group self-attention attends, at each position t, across the windows of a batch,
with the additive mask ``M[t, q, b] = 0`` where windows q and b share a group and b observes
position t, and ``finfo.min`` elsewhere (``Chronos2Encoder._construct_and_invert_group_time_mask``).
isoprobe gives every window its own group, so row (q, t) keeps at most one key, q's own:

- where q observes t, the softmax over the row is exactly 1 on q (``exp(0)``; every other score
  is ``finfo.min``, whose exponential underflows to 0), so the output is q's value ``v_q``;
- where it does not, every score is ``finfo.min`` plus a score too small to change it, the
  softmax is uniform, and the output is the mean of the batch's values at t.

:class:`OwnGroupSelfAttention` computes those two cases directly: the value projection and the
output projection, not the query, key and [T, H, B, B] attention. The forecast is the official
module's bit for bit, about 1.35x faster for Chronos-2 ``mini`` on 64 windows
(``bench/forecast_throughput.py``). In training (attention dropout draws on the whole [B, B]
matrix), when attention weights are asked for, or when the mask keeps any key of another window
(windows grouped by someone else's ``group_ids``), the official forward runs.
"""

from __future__ import annotations

from chronos.chronos2.layers import AttentionOutput, GroupSelfAttention
from torch import Tensor, nn


class OwnGroupSelfAttention(GroupSelfAttention):
    """``GroupSelfAttention`` that skips the attention where every window is its own group."""

    def forward(
        self, hidden_states: Tensor, attention_mask: Tensor, output_attentions: bool = False
    ) -> AttentionOutput:
        """``hidden_states`` [B, T, d_model]; ``attention_mask`` [T, 1, B, B] (additive)."""
        if self.training or output_attentions:
            return super().forward(hidden_states, attention_mask, output_attentions)
        kept = attention_mask.eq(0)
        own = kept.diagonal(dim1=-2, dim2=-1)[:, 0]  # [T, B]: q's own key kept
        if kept.sum() != own.sum():  # a key of another window: groups someone else made
            return super().forward(hidden_states, attention_mask, output_attentions)
        values = self.self_attention.v(self.layer_norm(hidden_states))  # [B, T, H d_kv]
        mixed = values.where(own.T[..., None], values.mean(dim=0, keepdim=True))
        return AttentionOutput(hidden_states=hidden_states + self.self_attention.o(mixed))


def skip_own_group_attention(model: nn.Module) -> None:
    """Make every ``GroupSelfAttention`` of ``model`` an :class:`OwnGroupSelfAttention`, in
    place: the same parameters and names, so checkpoints and exports do not change."""
    for module in model.modules():
        if type(module) is GroupSelfAttention:
            module.__class__ = OwnGroupSelfAttention
