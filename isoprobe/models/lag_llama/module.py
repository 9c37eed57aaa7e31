"""Lag-Llama (Rasul et al., 2023) as a :class:`ForecastModule`, implemented here.

A LLaMA-style decoder-only transformer (RMSNorm, rotary position embeddings, causal
self-attention, SwiGLU MLP) reads one token per time step. A token is the vector of the series'
lagged values at that step (gluonts' ``lagged_sequence_values`` over the official lag set: the
union of gluonts' ``get_lags_for_frequency`` over Q/M/W/D/H/T/S, shifted to start at 0, so the
largest lag is 1092), then two magnitude features ``log1p(|loc|)`` and ``log(scale)`` of the
window's scaler, then (``time_feat``) six date features. A Student-t head gives the next value's
distribution; the objective is its negative log-likelihood.

History: a token at step t needs the values up to ``max(lags)`` steps back. The data module's
context is usually shorter, so the window is left-padded with zeros marked unobserved (as
gluonts' instance splitter pads): padded values take no part in the scaler, are no tokens, and
their lags read 0 in the scaled space, like the official model sees at a series' start.

Module and parameter names follow the official ``LagLlamaModel`` (``transformer.wte``,
``transformer.h.<i>.{rms_1,attn.{q_proj,kv_proj,c_proj},rms_2,mlp.{c_fc1,c_fc2,c_proj}}``,
``transformer.ln_f``, ``param_proj.proj.<j>``), so the official checkpoint's ``model.*`` keys map
one to one.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import Tensor, nn

from isoprobe.models.base import Batch, Forecast, ForecastModule
from isoprobe.models.checkpoints import (
    CheckpointError,
    ResolvedCheckpoint,
    checkpoint_file,
    read_json_config,
    read_safetensors,
    resolve_checkpoint,
    scratch_fields,
    scratch_shape,
)
from isoprobe.models.config_schema import check_config
from isoprobe.models.lag_llama.checkpoint import load_official_checkpoint
from isoprobe.models.lag_llama.network import (
    NUM_TIME_FEATURES,
    KeyValueCache,
    LagLlamaNetwork,
    _require_gluonts,
    official_lags,
    window_scale,
)
from isoprobe.models.lag_llama.schema import SCHEMA

log = logging.getLogger(__name__)

#: the config.json fields that define the architecture (the official ``model_kwargs`` names)
ARCHITECTURE_FIELDS = (
    "n_layer",
    "n_head",
    "n_embd_per_head",
    "max_context_length",
    "lags_seq",
    "scaling",
    "time_feat",
    "scale_features",
    "rope_base",
)


class LagLlamaModule(ForecastModule):
    """Lag-Llama wrapper.

    Args:
        checkpoint: ``auto`` | ``bundled`` | ``scratch`` | a directory (``config.json`` +
            ``model.safetensors``, what :meth:`export` writes) | the official Lightning
            ``lag-llama.ckpt`` file | a hub id.
        hub_id: the official checkpoint repository (its file ``lag-llama.ckpt``).
        bundled_name: folder of the shipped checkpoint under ``isoprobe/models/bundled``.
        size / sizes: the architecture of ``checkpoint=scratch`` (``sizes[size]``).
        num_samples: sample paths per forecast.
        **base: the :class:`ForecastModule` arguments.
    """

    samples = True
    lagged = True
    stacks = ("decoder",)

    def __init__(
        self,
        checkpoint: str = "auto",
        hub_id: str = "time-series-foundation-models/Lag-Llama",
        bundled_name: str = "lag-llama-mini",
        size: str = "mini",
        sizes: Mapping[str, Mapping[str, Any]] | None = None,
        num_samples: int = 100,
        **base: Any,
    ) -> None:
        super().__init__(**base)
        _require_gluonts()
        self.num_samples = int(num_samples)
        if checkpoint.endswith(".ckpt") and Path(checkpoint).expanduser().is_file():
            path = str(Path(checkpoint).expanduser().resolve())
            self.resolved_checkpoint = ResolvedCheckpoint("path", path, checkpoint)
            config, state = load_official_checkpoint(path)
        else:
            self.resolved_checkpoint = resolve_checkpoint(checkpoint, hub_id, bundled_name)
            config, state = self._load(self.resolved_checkpoint, scratch_fields(size, sizes))
        self.config = config
        self.lags = [int(lag) for lag in config["lags_seq"]]
        self.network = LagLlamaNetwork(config)
        if state is not None:
            load_matching(self.network, state, self.resolved_checkpoint.location)
        log.info("Lag-Llama weights: %s", self.resolved_checkpoint.describe())

    @staticmethod
    def _load(
        resolved: ResolvedCheckpoint, scratch: Mapping[str, Any] | None
    ) -> tuple[dict, dict | None]:
        if resolved.kind == "scratch":
            config = dict(scratch_shape(scratch))
            if config.get("lags_seq") in (None, "official"):
                config["lags_seq"] = list(official_lags())
            return config, None
        directory = Path(resolved.location)
        if resolved.kind == "hub":
            return load_official_checkpoint(checkpoint_file(resolved, "lag-llama.ckpt"))
        config = read_json_config(directory / "config.json")
        check_config(config, SCHEMA, str(directory / "config.json"))
        return config, read_safetensors(directory / "model.safetensors")

    # -- features ----------------------------------------------------------------------------

    def _tokens(
        self, values: Tensor, observed: Tensor, loc: Tensor, scale: Tensor, last_only: bool = False
    ) -> Tensor:
        """Token features [B, T, F] of the steps of ``values`` [B, T] (observed mask alike):
        the lagged scaled values (the window left-padded by ``max(lags)`` unobserved zeros),
        the magnitude features and zero date features (the batch carries no timestamps).
        ``last_only``: the last step's token alone [B, 1, F]."""
        scaled = torch.where(observed, (values - loc) / scale, (0.0 - loc) / scale)
        prior = ((0.0 - loc) / scale).expand(-1, max(self.lags))
        if last_only:
            padded = torch.cat([prior, scaled], dim=-1)
            lags = padded[:, [padded.shape[-1] - 1 - lag for lag in self.lags]][:, None, :]
        else:
            _, lagged_sequence_values = _require_gluonts()
            lags = lagged_sequence_values(self.lags, prior, scaled, dim=-1)
        steps = lags.shape[1]
        parts = [lags]
        magnitude = torch.cat([loc.abs().log1p(), scale.log()], dim=-1)
        if not self.config["scale_features"]:
            magnitude = torch.zeros_like(magnitude)
        parts.append(magnitude[:, None, :].expand(-1, steps, -1))
        if self.config["time_feat"]:
            parts.append(lags.new_zeros(lags.shape[0], steps, NUM_TIME_FEATURES))
        return torch.cat(parts, dim=-1)

    def _teacher_forced(self, batch: Batch) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """The context and the target but its last step, their observed mask, loc and scale."""
        context, target = batch["context"], batch["target"]
        values = torch.cat([context, target[:, :-1]], dim=1)
        observed = ~values.isnan()
        loc, scale = window_scale(context.nan_to_num(), ~context.isnan(), self.config["scaling"])
        return values.nan_to_num(), observed, loc, scale, target

    def student_t(self, batch: Batch) -> tuple[Tensor, Tensor, Tensor]:
        """Student-t parameters (df, loc, scale) [B, C+H-1] in the batch's scale, for the value
        after each teacher-forced token."""
        values, observed, loc, scale, _ = self._teacher_forced(batch)
        df, mu, sigma = self.network(self._tokens(values, observed, loc, scale))
        return df, loc + scale * mu, scale * sigma

    def loss(self, batch: Batch) -> Tensor:
        """Mean Student-t negative log-likelihood of every observed next value (context from
        the second step on and the target), as the official trainer."""
        df, loc, scale = self.student_t(batch)
        nexts = torch.cat([batch["context"][:, 1:], batch["target"]], dim=1)
        observed = ~nexts.isnan()
        nll = -torch.distributions.StudentT(df, loc, scale).log_prob(nexts.nan_to_num())
        return (nll * observed).sum() / observed.sum().clamp_min(1)

    @torch.no_grad()
    def forecast(self, batch: Batch) -> Forecast:
        """``num_samples`` paths sampled step by step (each sample fed back as the next
        token's value; loc and scale stay those of the context), summarised by quantiles. The
        context runs through the network once per window; its keys and values are copied to
        every sample path, and each later step runs only its new token against them
        (:class:`KeyValueCache`), which equals re-running the whole sequence."""
        context = batch["context"]
        size, samples = context.shape[0], self.num_samples
        observed = ~context.isnan()
        loc, scale = window_scale(context.nan_to_num(), observed, self.config["scaling"])
        values = context.nan_to_num()
        (df, mu, sigma), prefix = self.network.extend(self._tokens(values, observed, loc, scale))
        capacity = values.shape[1] + self.prediction_length
        caches = [KeyValueCache(k, v, capacity, samples) for k, v in prefix]
        df, mu, sigma = (p[:, -1].repeat_interleave(samples, 0) for p in (df, mu, sigma))
        values, observed = (t.repeat_interleave(samples, 0) for t in (values, observed))
        loc, scale = loc.repeat_interleave(samples, 0), scale.repeat_interleave(samples, 0)
        for step in range(self.prediction_length):
            draw = torch.distributions.StudentT(df, mu, sigma).sample()
            values = torch.cat([values, (loc + scale * draw[:, None])], dim=1)
            observed = F.pad(observed, (0, 1), value=True)
            if step + 1 < self.prediction_length:
                last = self._tokens(values, observed, loc, scale, last_only=True)
                (df, mu, sigma), _ = self.network.extend(last, caches)
                df, mu, sigma = df[:, -1], mu[:, -1], sigma[:, -1]
        paths = values[:, -self.prediction_length :].reshape(size, samples, -1)
        return Forecast.from_samples(paths, self.quantile_levels, paths.median(dim=1).values)

    # -- probe contract ----------------------------------------------------------------------

    def embed_module(self) -> nn.Module:
        """The token embedding (``wte``: the lag and magnitude features projected to the model
        width) [B, T, D]."""
        return self.network.transformer["wte"]

    def stack_blocks(self, stack: str) -> Sequence[nn.Module]:
        return self.network.transformer["h"]

    def self_attention_module(self, stack: str, index: int) -> nn.Module:
        """The block's self-attention after ``c_proj``, before the residual add."""
        return self.network.transformer["h"][index].attn

    def token_masks(self, batch: Batch, layers: Iterable[str]) -> dict[str, Tensor]:
        """One token per step of the context and of the teacher-forced target; real = the
        step's value was observed (not left padding, not missing). The same for every layer."""
        _, observed, _, _, _ = self._teacher_forced(batch)
        layers = list(layers)
        self.identify_layers(layers, "Lag-Llama")
        return {name: observed for name in layers}

    def input_modules(self) -> list[nn.Module]:
        """``wte``: the lag features (and loc/scale) of a step -> its token."""
        return [self.network.transformer["wte"]]

    def head_modules(self) -> list[nn.Module]:
        """``param_proj``: the Student-t's parameters of every step."""
        return [self.network.param_proj]

    def feed_forward_modules(self) -> list[nn.Module]:
        return [block.mlp for block in self.network.transformer["h"]]

    def attention_weights(self) -> dict[str, dict[str, Tensor]]:
        """``q`` and ``o`` as they are; ``k`` and ``v`` the two halves of the fused ``kv_proj``
        (views, not copies)."""
        weights = {}
        for i, block in enumerate(self.network.transformer["h"]):
            k, v = block.attn.kv_proj.weight.chunk(2, dim=0)
            q, o = block.attn.q_proj.weight, block.attn.c_proj.weight
            weights[f"decoder.{i}"] = {"q": q, "k": k, "v": v, "o": o}
        return weights

    def export(self, directory: str, dtype: str = "float32") -> None:
        """``config.json`` (the official ``model_kwargs`` field names) + ``model.safetensors``
        (the official parameter names without the ``model.`` prefix)."""
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        config = {field: self.config[field] for field in ARCHITECTURE_FIELDS}
        (path / "config.json").write_text(json.dumps(config, indent=2))
        cast = getattr(torch, dtype)
        state = {k: v.detach().to(cast).contiguous() for k, v in self.network.state_dict().items()}
        save_file(state, str(path / "model.safetensors"))

    def _width(self) -> int:
        return self.config["n_head"] * self.config["n_embd_per_head"]

    def training_memory_bytes(self, batch_size: int) -> int:
        """Float32: weights, gradients, two AdamW moments of what trains (weight_floats), and per
        layer the kept activations of T = C + H - 1 tokens (~ 16 widths per token for norms,
        projections and the SwiGLU hidden, plus the attention scores B x heads x T^2), and the lag
        features."""
        steps = self.context_length + self.prediction_length - 1
        width, heads = self._width(), self.config["n_head"]
        per_layer = batch_size * (16 * steps * width + 2 * heads * steps**2)
        features = batch_size * steps * (len(self.lags) + 8)
        weights = self.weight_floats(training=True)
        return 4 * (self.config["n_layer"] * per_layer + features + weights)

    def forecast_memory_bytes(self, batch_size: int) -> int:
        """Float32: the context pass of ``batch_size`` windows (one layer's activations and
        attention scores at a time), the key/value caches of every sample path (2 x layers x
        (C + H) x width each), a path's values with their lag padding, one decoding step's
        activations, and the weights."""
        paths = batch_size * self.num_samples
        steps = self.context_length + self.prediction_length
        width, heads, layers = self._width(), self.config["n_head"], self.config["n_layer"]
        context = batch_size * (16 * steps * width + 2 * heads * steps**2)
        caches = paths * 2 * layers * steps * width
        per_path = paths * (2 * (steps + max(self.lags)) + 16 * width + len(self.lags))
        weights = self.weight_floats(training=False)
        return 4 * (context + caches + per_path + weights)


def load_matching(network: nn.Module, state: Mapping[str, Tensor], source: str) -> None:
    """Load ``state`` into ``network``, refusing missing, unexpected or misshapen tensors with
    an error that names them."""
    own = network.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    misshapen = [
        f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(own[k].shape)}"
        for k in own
        if k in state and state[k].shape != own[k].shape
    ]
    if missing or unexpected or misshapen:
        raise CheckpointError(
            f"the Lag-Llama weights in {source} do not fit the architecture of its config: "
            f"missing {missing[:5]}, unexpected {unexpected[:5]}, wrong shape {misshapen[:5]}. "
            "The config and the weights belong to different checkpoints; re-export the model."
        )
    network.load_state_dict({k: v.float() for k, v in state.items()})
