"""A lean evaluation forward for PatchTST's encoder.

At the bundled model's size (d_model 32, 4 heads of 8, 63 patches, 64 windows) a forecast's
time is not its arithmetic but the way transformers' modules spend it: each encoder layer makes
some forty tensor operations, two batch norms and three separate query, key and value
projections, fresh multi-megabyte intermediates, and ``scaled_dot_product_attention``, whose CPU
kernel is slow for heads of 8 dimensions. :class:`LeanPatchTSTEncoder` computes the same
function with fewer, larger operations, in evaluation only:

- the batch norm before each sub-layer is, in evaluation, the affine map ``n = s ⊙ h + t`` of
  its running statistics (:mod:`isoprobe.models.patchtst_inference`), and the projection after
  it is linear, so ``W n + b = (W diag s) h + (W t + b)``: the norm is folded into the
  projection's weights;
- the query, key and value projections are one matrix (their rows stacked) with the attention's
  scale ``1/√d_head`` folded into the query rows;
- the attention is ``softmax(q kᵀ) v`` as two batched matrix products around one softmax
  (into a buffer of its own: ``softmax`` written over its input took a slower path), and the
  activation of the feed-forward is applied in place;
- the output projection and the second feed-forward layer add into the residual stream in the
  same matrix product (``addmm``) and their biases are added once, after the product.

The folded matrices are computed once and kept with the encoder, keyed on every tensor they
are made of (its storage and version counter), so that any change of a parameter or running
statistic (a training step, ``load_state_dict``, a move to another device) makes them again.
The outputs are the official forward's to float rounding (the products are summed in another
order). The lean forward runs only where nothing can tell the difference: in evaluation (the
encoder and every submodule), without gradients, in float32 without autocast, without
attentions or hidden states asked for, with no module hook on the encoder's submodules and no
global one (the probe's captures see the official modules' calls), and only for the
configuration it reproduces (pre-norm, batch norm with running statistics, no channel
attention or CLS token, one shared patch embedding, exact GELU, plain ``nn.Linear``
projections); everything else runs the official forward.

Measured on 2026-11-28 on the 2-core CPU, ``OMP_NUM_THREADS=2 .venv/bin/python
bench/forecast_throughput.py --models patchtst --rounds 9`` (64 windows of 512 steps, the bundled
model, best of 9 alternating calls), three runs at load average 0.9-1.0: 0.0045-0.0047 s against
``PatchTSTForPrediction.generate``'s 0.0064-0.0066 s, 1.40-1.45x (1.10x with the official encoder,
load 0.3); with ``OMP_NUM_THREADS=1``, 0.0070-0.0078 s against 0.0107-0.0126 s, 1.52-1.61x.
Alone, alternating in one process: ``scaled_dot_product_attention`` in place of the plain
attention 1.28x and 1.25x (two threads, one) where the plain one gave 1.37x and 1.41x, and
without the scratch buffers 1.26x and 1.28x (docs/benchmarks.md, "Forecast throughput").
"""

from __future__ import annotations

import math
import threading
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from transformers.activations import GELUActivation
from transformers.modeling_outputs import BaseModelOutput
from transformers.models.patchtst.modeling_patchtst import (
    PatchTSTAttention,
    PatchTSTBatchNorm,
    PatchTSTEncoder,
)

from isoprobe.models.patchtst_inference import evaluation_affine
from isoprobe.models.watched import watched_or_training


class LeanPatchTSTEncoder(PatchTSTEncoder):
    """A ``PatchTSTEncoder`` whose evaluation forward is the module docstring's."""

    def forward(
        self,
        patch_input: Tensor,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        **kwargs: Any,
    ) -> BaseModelOutput:
        if kwargs or not self._lean(patch_input, output_hidden_states, output_attentions):
            return super().forward(
                patch_input,
                output_hidden_states=output_hidden_states,
                output_attentions=output_attentions,
                **kwargs,
            )
        return BaseModelOutput(last_hidden_state=self._lean_forward(patch_input))

    def _lean(
        self, patch_input: Tensor, hidden_states: bool | None, attentions: bool | None
    ) -> bool:
        """Whether the lean forward computes what the official one would (module docstring)."""
        config = self.config
        if self.training or torch.is_grad_enabled():
            return False
        if config.output_hidden_states if hidden_states is None else hidden_states:
            return False
        if config.output_attentions if attentions is None else attentions:
            return False
        if patch_input.dtype != torch.float32 or torch.is_autocast_enabled(patch_input.device.type):
            return False
        if not config.pre_norm or config.channel_attention or config.use_cls_token:
            return False
        if patch_input.dim() != 4 or patch_input.shape[1] != self.embedder.num_input_channels:
            return False  # the official forward says what is wrong
        return _lean_structure(self) and not watched_or_training(self)

    def _lean_forward(self, patch_input: Tensor) -> Tensor:
        """[B, C, P, patch_length] -> [B, C, P, d_model]."""
        folded = self._folded()
        batch, channels, patches, _ = patch_input.shape
        config = self.config
        heads = config.num_attention_heads
        head_dim = config.d_model // heads
        tokens = batch * channels
        scratch = _Scratch(patch_input)
        hidden = torch.matmul(patch_input, self.embedder.input_embedding.weight.t())
        hidden += folded.start
        hidden = hidden.view(tokens * patches, -1)
        for layer in folded.layers:
            qkv = scratch("qkv", tokens * patches, layer.qkv_weight.shape[1])
            torch.addmm(layer.qkv_bias, hidden, layer.qkv_weight, out=qkv)
            split = scratch("split", 3, tokens, heads, patches, head_dim)
            split.copy_(qkv.view(tokens, patches, 3, heads, head_dim).permute(2, 0, 3, 1, 4))
            query, key, value = split.view(3, tokens * heads, patches, head_dim)
            scores = scratch("scores", tokens * heads, patches, patches)
            torch.bmm(query, key.transpose(1, 2), out=scores)
            weights = scratch("weights", *scores.shape)
            torch.softmax(scores, dim=-1, out=weights)
            attended = torch.bmm(weights, value, out=scratch("attended", *query.shape))
            merged = scratch("merged", tokens, patches, heads, head_dim)
            merged.copy_(attended.view(tokens, heads, patches, head_dim).transpose(1, 2))
            hidden.addmm_(merged.view(tokens * patches, -1), layer.out_weight)
            hidden += layer.out_bias
            inner = scratch("inner", tokens * patches, layer.ff_weight.shape[1])
            torch.addmm(layer.ff_bias, hidden, layer.ff_weight, out=inner)
            torch.ops.aten.gelu_(inner)
            hidden.addmm_(inner, layer.ff_out_weight)
            hidden += layer.ff_out_bias
        return hidden.view(batch, channels, patches, -1)

    def _folded(self) -> _Folded:
        """The folded matrices (module docstring), made again when a tensor they come from
        changed."""
        sources = _sources(self)
        key = tuple((t.data_ptr(), t._version) for t in sources)
        cached = self.__dict__.get("_lean_folded")
        if cached is None or cached.key != key:
            cached = _Folded(self, sources, key)
            self.__dict__["_lean_folded"] = cached
        return cached


class _FoldedLayer:
    """One encoder layer's matrices, transposed for ``addmm``: the query-key-value projection
    after the first norm [d_model, 3 d_model], the output projection [d_model, d_model], the
    feed-forward's first layer after the second norm [d_model, ffn] and its second [ffn,
    d_model], and their biases."""

    def __init__(self, layer: nn.Module) -> None:
        attention = layer.self_attn
        scale, shift = evaluation_affine(layer.norm_sublayer1)
        weight = torch.cat(
            [
                attention.q_proj.weight * attention.scaling,
                attention.k_proj.weight,
                attention.v_proj.weight,
            ]
        )
        query_bias = attention.q_proj.bias * attention.scaling
        bias = torch.cat([query_bias, attention.k_proj.bias, attention.v_proj.bias])
        self.qkv_weight = (weight * scale).t().contiguous()
        self.qkv_bias = weight @ shift + bias
        self.out_weight = attention.out_proj.weight.t()
        self.out_bias = attention.out_proj.bias
        first, _, _, second = layer.ff
        scale, shift = evaluation_affine(layer.norm_sublayer3)
        self.ff_weight = (first.weight * scale).t().contiguous()
        self.ff_bias = first.weight @ shift + first.bias
        self.ff_out_weight = second.weight.t()
        self.ff_out_bias = second.bias


class _Folded:
    """The encoder's folded matrices and the key of the tensors they were made from (their
    storage addresses and versions); the tensors are kept, so that no other tensor can take
    one's address while the key holds it."""

    def __init__(self, encoder: PatchTSTEncoder, sources: list[Tensor], key: tuple) -> None:
        self.sources, self.key = sources, key
        with torch.no_grad():
            embedding = encoder.embedder.input_embedding
            self.start = encoder.positional_encoder.position_enc + embedding.bias
            self.layers = [_FoldedLayer(layer) for layer in encoder.layers]


class _Scratch:
    """Intermediate tensors of one lean forward, on the CPU in buffers kept per thread.

    The CPU allocator hands a tensor of a few megabytes (the attention scores, the feed-forward's
    activations) fresh pages from the system, whose first writes fault; at this model's size
    that took a third of a forecast. The buffers are kept in :data:`_BUFFERS` (one per name,
    thread and inference mode, whose tensors cannot be written outside it; grown when a larger
    one is needed, up to :data:`SCRATCH_LIMIT` elements, so that a thread keeps at most seven
    such buffers of 16 MB) and are only ever read within the forward that wrote them; a larger
    tensor, or one on a GPU (whose allocator caches), is new.
    """

    def __init__(self, like: Tensor) -> None:
        self.like = like
        self.cpu = like.device.type == "cpu"
        self.inference = torch.is_inference_mode_enabled()

    def __call__(self, name: str, *shape: int) -> Tensor:
        size = math.prod(shape)
        if not self.cpu or size > SCRATCH_LIMIT:
            return self.like.new_empty(shape)
        buffers = _BUFFERS.__dict__.setdefault("buffers", {})
        key = (name, self.inference)
        buffer = buffers.get(key)
        if buffer is None or buffer.numel() < size:
            buffer = buffers[key] = self.like.new_empty(size)
        return buffer[:size].view(shape)


#: the most elements of a scratch buffer kept between forwards (a larger one is allocated anew)
SCRATCH_LIMIT = 1 << 22
#: per thread: the CPU buffers of :class:`_Scratch` (a dict under ``buffers``, keyed on the
#: buffer's name and whether it was made in inference mode)
_BUFFERS = threading.local()


def _lean_structure(encoder: PatchTSTEncoder) -> bool:
    """The encoder is made of the modules the lean forward reproduces: one shared linear patch
    embedding, and in every layer plain ``nn.Linear`` projections, batch norms with running
    statistics and a feed-forward ``Linear -> exact GELU -> dropout -> Linear``."""
    embedding = encoder.embedder.input_embedding
    if type(embedding) is not nn.Linear or embedding.bias is None:
        return False
    for layer in encoder.layers:
        attention = layer.self_attn
        if type(attention) is not PatchTSTAttention:
            return False
        projections = [attention.q_proj, attention.k_proj, attention.v_proj, attention.out_proj]
        if len(layer.ff) != 4:
            return False
        first, activation, _, second = layer.ff
        projections += [first, second]
        if any(type(p) is not nn.Linear or p.bias is None for p in projections):
            return False
        if type(activation) is not GELUActivation or activation.act is not F.gelu:
            return False
        for norm in (layer.norm_sublayer1, layer.norm_sublayer3):
            if not isinstance(norm, PatchTSTBatchNorm):
                return False
            statistics = norm.batchnorm
            if not statistics.track_running_stats or statistics.running_mean is None:
                return False
    return True


def _sources(encoder: PatchTSTEncoder) -> list[Tensor]:
    """Every tensor the folded matrices are made of."""
    embedding = encoder.embedder.input_embedding
    sources = [embedding.bias, encoder.positional_encoder.position_enc]
    for layer in encoder.layers:
        attention = layer.self_attn
        for projection in (attention.q_proj, attention.k_proj, attention.v_proj):
            sources += [projection.weight, projection.bias]
        sources += [attention.out_proj.weight, attention.out_proj.bias]
        sources += [layer.ff[0].weight, layer.ff[0].bias, layer.ff[3].weight, layer.ff[3].bias]
        for norm in (layer.norm_sublayer1, layer.norm_sublayer3):
            statistics = norm.batchnorm
            sources += [statistics.running_mean, statistics.running_var]
            if statistics.affine:
                sources += [statistics.weight, statistics.bias]
    return sources


def lean_encoder(encoder: PatchTSTEncoder) -> None:
    """Make ``encoder`` a :class:`LeanPatchTSTEncoder`, in place (the same modules, parameters
    and names: checkpoints and exports do not change)."""
    encoder.__class__ = LeanPatchTSTEncoder
