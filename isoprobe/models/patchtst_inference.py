"""PatchTST's encoder in inference, on CPU kernels that suit its small shapes.

transformers runs PatchTST's attention through ``scaled_dot_product_attention``, whose CPU
kernel (a flash-attention loop) costs, on one thread, twice the three plain operations at
PatchTST's shapes (a head dimension of 8 to 16, some 60 patches): ``softmax(s q kᵀ) v`` with
``s`` the head dimension's inverse square root. On more threads it is the faster one (it splits
the batch and heads between threads, where the plain batched products of such small matrices
barely do: 0.6x on two), so the plain form runs on one thread only, as the test workers and
sweep jobs under ``OMP_NUM_THREADS=1`` do. Its batch normalisation transposes every hidden state to
normalise over the model dimension and back, where in evaluation it is one affine map of the
last dimension, ``x · γ / √(σ² + ε) + (β − μ γ / √(σ² + ε))`` with the running mean ``μ`` and
variance ``σ²``. :class:`PlainSelfAttention` and :class:`RunningStatisticsBatchNorm` compute
those in evaluation (the same result to float rounding: softmax in float32, as transformers'),
the attention on one thread; in training, or when attention weights, a mask or cross-attention
are asked for, they run the official forward. The swap keeps every module, parameter and
name, so forward hooks (the probe reads the attention sub-layers), checkpoints and compression
see the model they always saw.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from transformers.models.patchtst.modeling_patchtst import PatchTSTAttention, PatchTSTBatchNorm


class PlainSelfAttention(PatchTSTAttention):
    """PatchTST self-attention as ``softmax(s q kᵀ) v`` in evaluation on one thread (module
    docstring)."""

    def forward(
        self,
        hidden_states: Tensor,
        key_value_states: Tensor | None = None,
        attention_mask: Tensor | None = None,
        output_attentions: bool | None = False,
        **kwargs: Any,
    ) -> tuple[Tensor, Tensor | None]:
        official = (
            self.training
            or torch.get_num_threads() > 1
            or key_value_states is not None
            or attention_mask is not None
            or output_attentions
            or kwargs
        )
        if official:
            return super().forward(
                hidden_states, key_value_states, attention_mask, output_attentions, **kwargs
            )
        heads = (*hidden_states.shape[:-1], -1, self.head_dim)
        query = self.q_proj(hidden_states).view(heads).transpose(1, 2)
        key = self.k_proj(hidden_states).view(heads).transpose(1, 2)
        value = self.v_proj(hidden_states).view(heads).transpose(1, 2)
        scores = torch.matmul(query * self.scaling, key.transpose(-1, -2))
        weights = scores.softmax(dim=-1, dtype=torch.float32).to(value.dtype)
        output = torch.matmul(weights, value).transpose(1, 2).reshape(*hidden_states.shape[:-1], -1)
        return self.out_proj(output), None


class RunningStatisticsBatchNorm(PatchTSTBatchNorm):
    """PatchTST's batch normalisation as the affine map of its running statistics in
    evaluation (module docstring); batch statistics in training, as the official module."""

    def forward(self, inputs: Tensor) -> Tensor:
        norm = self.batchnorm
        if self.training or not norm.track_running_stats or norm.running_mean is None:
            return super().forward(inputs)
        scale = torch.rsqrt(norm.running_var + norm.eps)
        shift = -norm.running_mean * scale
        if norm.affine:
            scale, shift = scale * norm.weight, shift * norm.weight + norm.bias
        return torch.addcmul(shift, inputs, scale)


def use_inference_kernels(model: nn.Module) -> None:
    """Make every PatchTST attention and batch norm in ``model`` the classes above, in place
    (the same parameters and names)."""
    for module in model.modules():
        if type(module) is PatchTSTAttention:
            module.__class__ = PlainSelfAttention
        elif type(module) is PatchTSTBatchNorm:
            module.__class__ = RunningStatisticsBatchNorm
