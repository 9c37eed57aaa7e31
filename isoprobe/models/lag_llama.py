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

import collections
import functools
import json
import logging
import math
import pickle
import types
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import Tensor, nn

from isoprobe.models.base import Batch, Forecast, ForecastModule, check_probe_site
from isoprobe.models.checkpoints import (
    CheckpointError,
    ResolvedCheckpoint,
    read_json_config,
    read_safetensors,
    resolve_checkpoint,
)

log = logging.getLogger(__name__)

#: the frequencies whose gluonts lag sets the official checkpoint was trained with
OFFICIAL_LAG_FREQUENCIES = ("Q", "M", "W", "D", "h", "min", "s")
SCALINGS = ("mean", "robust", "none")
NUM_TIME_FEATURES = 6
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


def _require_gluonts():
    try:
        import gluonts.torch.util as util
        from gluonts.time_feature import get_lags_for_frequency
    except ImportError as err:
        raise ImportError(
            "model=lag_llama needs gluonts for its lag features: pip install 'gluonts[torch]'"
        ) from err
    return get_lags_for_frequency, util.lagged_sequence_values


@functools.cache
def official_lags() -> tuple[int, ...]:
    """The official lag indices (0-based, so index 0 is the current step): the sorted union of
    gluonts' lags for every frequency Lag-Llama was trained on, each minus one."""
    get_lags_for_frequency, _ = _require_gluonts()
    union: set[int] = set()
    with warnings.catch_warnings():  # pandas' renamed aliases (QE, ME): the same offsets
        warnings.simplefilter("ignore", FutureWarning)
        for freq in OFFICIAL_LAG_FREQUENCIES:
            union.update(get_lags_for_frequency(freq_str=freq, num_default_lags=1))
    return tuple(sorted(lag - 1 for lag in union))


class RMSNorm(nn.Module):
    """``x / sqrt(mean(x^2) + eps) * scale``, the mean taken in float32."""

    def __init__(self, size: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        mean_square = x.float().pow(2).mean(dim=-1, keepdim=True)
        return (self.scale * (x * torch.rsqrt(mean_square + self.eps))).type_as(x)


def rotate(x: Tensor, positions: Tensor, base: float) -> Tensor:
    """Rotary position embedding of ``x`` [B, H, T, d]: the two halves of every head's vector
    form (x1, x2) pairs rotated by angle ``position * base^(-2i/d)``."""
    dim = x.shape[-1]
    inverse = base ** (-torch.arange(0, dim, 2, device=x.device, dtype=torch.float32) / dim)
    angles = positions.float()[:, None] * inverse[None, :]
    cos = torch.cat([angles.cos(), angles.cos()], dim=-1).to(x.dtype)
    sin = torch.cat([angles.sin(), angles.sin()], dim=-1).to(x.dtype)
    first, second = x[..., : dim // 2], x[..., dim // 2 :]
    return x * cos + torch.cat([-second, first], dim=-1) * sin


class KeyValueCache:
    """One block's keys and values [N, H, capacity, d] for sequences decoded a step at a time,
    filled up to ``length``: each step writes its key and value in place (no copy of the past)."""

    def __init__(self, keys: Tensor, values: Tensor, capacity: int, repeats: int) -> None:
        rows, heads, self.length, dim = keys.shape
        shape = (rows * repeats, heads, capacity, dim)
        self.keys, self.values = keys.new_empty(shape), values.new_empty(shape)
        self.keys[:, :, : self.length] = keys.repeat_interleave(repeats, 0)
        self.values[:, :, : self.length] = values.repeat_interleave(repeats, 0)

    def append(self, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        """Write the new positions' keys and values; the keys and values of every position."""
        end = self.length + keys.shape[2]
        self.keys[:, :, self.length : end], self.values[:, :, self.length : end] = keys, values
        self.length = end
        return self.keys[:, :, :end], self.values[:, :, :end]


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with a separate query and a fused key/value projection."""

    def __init__(self, width: int, heads: int, rope_base: float) -> None:
        super().__init__()
        self.heads, self.rope_base = heads, rope_base
        self.q_proj = nn.Linear(width, width, bias=False)
        self.kv_proj = nn.Linear(width, 2 * width, bias=False)
        self.c_proj = nn.Linear(width, width, bias=False)

    def forward(
        self, x: Tensor, cache: KeyValueCache | None = None
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """Attention of the tokens ``x`` [B, T, D] over themselves (causally) and, with a
        ``cache``, over the earlier positions it holds (to which their keys and values are
        added); returns the output and the new positions' keys and values [B, H, T, d]."""
        batch, steps, width = x.shape
        k, v = self.kv_proj(x).split(width, dim=-1)

        def heads(t: Tensor) -> Tensor:
            return t.view(batch, steps, self.heads, -1).transpose(1, 2)

        start = 0 if cache is None else cache.length
        positions = torch.arange(start, start + steps, device=x.device)
        q = rotate(heads(self.q_proj(x)), positions, self.rope_base)
        new = rotate(heads(k), positions, self.rope_base), heads(v)
        keys, values = new if cache is None else cache.append(*new)
        # a single new token attends to every position so far; several, causally
        y = F.scaled_dot_product_attention(q, keys, values, is_causal=cache is None and steps > 1)
        return self.c_proj(y.transpose(1, 2).reshape(batch, steps, width)), new


class SwiGLU(nn.Module):
    """``c_proj(silu(c_fc1 x) * c_fc2 x)``, hidden width 2/3 of 4x, rounded up to 256."""

    def __init__(self, width: int) -> None:
        super().__init__()
        hidden = 256 * math.ceil(int(8 * width / 3) / 256)
        self.c_fc1 = nn.Linear(width, hidden, bias=False)
        self.c_fc2 = nn.Linear(width, hidden, bias=False)
        self.c_proj = nn.Linear(hidden, width, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.c_proj(F.silu(self.c_fc1(x)) * self.c_fc2(x))


class Block(nn.Module):
    def __init__(self, width: int, heads: int, rope_base: float) -> None:
        super().__init__()
        self.rms_1 = RMSNorm(width)
        self.attn = CausalSelfAttention(width, heads, rope_base)
        self.rms_2 = RMSNorm(width)
        self.mlp = SwiGLU(width)

    def forward(
        self, x: Tensor, cache: KeyValueCache | None = None
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """The block on tokens that follow the positions in ``cache``; also returns the new
        positions' keys and values (see :class:`CausalSelfAttention`)."""
        attended, new = self.attn(self.rms_1(x), cache)
        x = x + attended
        return x + self.mlp(self.rms_2(x)), new


class StudentTHead(nn.Module):
    """Student-t parameters from the last hidden state: ``df = 2 + softplus``, ``loc``,
    ``scale = softplus`` (clamped at float eps), as gluonts' ``StudentTOutput``."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.proj = nn.ModuleList([nn.Linear(width, 1) for _ in range(3)])

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        df, loc, scale = (p(x).squeeze(-1) for p in self.proj)
        eps = torch.finfo(scale.dtype).eps
        return 2.0 + F.softplus(df), loc, F.softplus(scale).clamp_min(eps)


class LagLlamaNetwork(nn.Module):
    """The transformer and its Student-t head on already-built token features [B, T, F]."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__()
        width = config["n_head"] * config["n_embd_per_head"]
        time = NUM_TIME_FEATURES if config["time_feat"] else 0
        features = len(config["lags_seq"]) + 2 + time
        self.transformer = nn.ModuleDict(
            {
                "wte": nn.Linear(features, width),
                "h": nn.ModuleList(
                    Block(width, config["n_head"], config["rope_base"])
                    for _ in range(config["n_layer"])
                ),
                "ln_f": RMSNorm(width),
            }
        )
        self.param_proj = StudentTHead(width)

    def forward(self, tokens: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Student-t parameters (df, loc, scale) [B, T] of the value after each token."""
        return self.extend(tokens)[0]

    def extend(
        self, tokens: Tensor, caches: Sequence[KeyValueCache] | None = None
    ) -> tuple[tuple[Tensor, Tensor, Tensor], list[tuple[Tensor, Tensor]]]:
        """:meth:`forward` on ``tokens`` [B, T, F] that follow the positions held in ``caches``
        (one per block; None at the start), writing their keys and values there; also returns
        the new positions' keys and values per block, from which :class:`KeyValueCache` starts."""
        x = self.transformer["wte"](tokens)
        new = []
        for i, block in enumerate(self.transformer["h"]):
            x, keys_values = block(x, None if caches is None else caches[i])
            new.append(keys_values)
        return self.param_proj(self.transformer["ln_f"](x)), new


def window_scale(values: Tensor, observed: Tensor, scaling: str) -> tuple[Tensor, Tensor]:
    """The window's (loc, scale) [B, 1] over its observed values: ``mean``: loc 0, scale the
    mean |x| (gluonts' MeanScaler; the batch's mean where a window is all-missing); ``robust``:
    the median and the inter-quartile range; ``none``: 0 and 1. Scales are floored at 1e-5."""
    if scaling == "none":
        ones = values.new_ones(values.shape[0], 1)
        return torch.zeros_like(ones), ones
    weights = observed.to(values.dtype)
    count = weights.sum(-1, keepdim=True)
    if scaling == "mean":
        total = (values.abs() * weights).sum(-1, keepdim=True)
        default = total.sum() / count.sum().clamp_min(1.0)
        scale = torch.where(count > 0, total / count.clamp_min(1.0), default)
        return torch.zeros_like(scale), scale.clamp_min(1e-5)
    masked = torch.where(observed, values, torch.nan)
    quartiles = torch.nanquantile(masked, torch.tensor([0.25, 0.5, 0.75]).to(values), dim=-1)
    loc = torch.nan_to_num(quartiles[1], nan=0.0)[:, None]
    spread = torch.nan_to_num(quartiles[2] - quartiles[0], nan=1.0)[:, None]
    return loc, spread.clamp_min(1e-5)


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
            config, state = self._load(self.resolved_checkpoint, size, sizes)
        self.config = config
        self.lags = [int(lag) for lag in config["lags_seq"]]
        self.network = LagLlamaNetwork(config)
        if state is not None:
            load_matching(self.network, state, self.resolved_checkpoint.location)
        log.info("Lag-Llama weights: %s", self.resolved_checkpoint.describe())

    @staticmethod
    def _load(resolved: ResolvedCheckpoint, size: str, sizes) -> tuple[dict, dict | None]:
        if resolved.kind == "scratch":
            if not sizes or size not in sizes:
                raise CheckpointError(f"model.checkpoint=scratch needs model.sizes.{size}")
            config = dict(sizes[size])
            if config.get("lags_seq") in (None, "official"):
                config["lags_seq"] = list(official_lags())
            return config, None
        directory = Path(resolved.location)
        if resolved.kind == "hub":
            from huggingface_hub import hf_hub_download

            return load_official_checkpoint(hf_hub_download(resolved.location, "lag-llama.ckpt"))
        config = read_json_config(directory / "config.json")
        missing = [f for f in ARCHITECTURE_FIELDS if f not in config]
        if missing:
            raise CheckpointError(
                f"{directory}/config.json is not a Lag-Llama config: it lacks {missing}"
            )
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
        levels = torch.tensor(self.quantile_levels, dtype=paths.dtype, device=paths.device)
        quantiles = torch.quantile(paths, levels, dim=1).permute(1, 0, 2)
        return Forecast(quantiles, self.quantile_levels, paths.median(dim=1).values, paths)

    # -- probe contract ----------------------------------------------------------------------

    def probe_layers(self, site: str = "block") -> dict[str, nn.Module]:
        """``embed``: the token embedding (``wte``: the lag and magnitude features projected to
        the model width) [B, T, D]; ``decoder.<i>``: block i's output; ``decoder.<i>.attn``:
        block i's self-attention after ``c_proj``, before the residual add."""
        check_probe_site(site)
        blocks = self.network.transformer["h"]
        if site == "attention":
            return {f"decoder.{i}.attn": block.attn for i, block in enumerate(blocks)}
        embed = self.network.transformer["wte"]
        return {"embed": embed} | {f"decoder.{i}": b for i, b in enumerate(blocks)}

    def token_masks(self, batch: Batch, layers: Iterable[str]) -> dict[str, Tensor]:
        """One token per step of the context and of the teacher-forced target; real = the
        step's value was observed (not left padding, not missing). The same for every layer."""
        _, observed, _, _, _ = self._teacher_forced(batch)
        layers = list(layers)
        self.check_layer_names(layers, "Lag-Llama")
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
        """Float32: weights, gradients, two AdamW moments (4 copies), and per layer the kept
        activations of T = C + H - 1 tokens (~ 16 widths per token for norms, projections and
        the SwiGLU hidden, plus the attention scores B x heads x T^2), and the lag features."""
        steps = self.context_length + self.prediction_length - 1
        width, heads = self._width(), self.config["n_head"]
        per_layer = batch_size * (16 * steps * width + 2 * heads * steps**2)
        features = batch_size * steps * (len(self.lags) + 8)
        weights = 4 * sum(p.numel() for p in self.parameters())
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
        weights = sum(p.numel() for p in self.parameters())
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


class PickledObject:
    """An inert stand-in for a gluonts class that the official checkpoint pickles in its
    hyperparameters (its ``distr_output``, its loss): it keeps the arguments and state the pickle
    gives it and runs no code of the original, so loading needs no gluonts and executes none."""

    qualified_name = ""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args, self.kwargs = args, kwargs

    def __setstate__(self, state: Any) -> None:
        self.state = state


@functools.cache
def _stand_in(module: str, name: str) -> type:
    return type(name, (PickledObject,), {"qualified_name": f"{module}.{name}"})


def _object_new_only(owner: Any, attribute: str) -> Any:
    """The one ``getattr`` gluonts' pickles use (``object.__new__``); any other is refused."""
    if owner is object and attribute == "__new__":
        return object.__new__
    raise pickle.UnpicklingError(f"getattr({owner!r}, {attribute!r}) is not allowed")


#: (module, name) -> what it unpickles as; pickle protocol 2 writes builtins as __builtin__
_ALLOWED_GLOBALS: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("functools", "partial"): functools.partial,
    ("torch._utils", "_rebuild_tensor_v2"): torch._utils._rebuild_tensor_v2,
    ("torch._utils", "_rebuild_parameter"): torch._utils._rebuild_parameter,
    ("torch", "Size"): torch.Size,
    ("pathlib", "PosixPath"): PurePosixPath,
    **{
        (module, name): value
        for module in ("builtins", "__builtin__")
        for name, value in (("object", object), ("getattr", _object_new_only), ("set", set))
    },
}


class _AllowListUnpickler(pickle.Unpickler):
    """Unpickles tensors, containers, primitives, ``_ALLOWED_GLOBALS`` and inert stand-ins for
    gluonts classes; any other global is refused by name before anything of it runs."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED_GLOBALS:
            return _ALLOWED_GLOBALS[module, name]
        if module == "gluonts" or module.startswith("gluonts."):
            return _stand_in(module, name)
        raise pickle.UnpicklingError(
            f"the checkpoint pickles {module}.{name}, which is not on the allow-list"
        )


def _allow_list_load(file: Any, **kwargs: Any) -> Any:
    """``pickle.load`` through :class:`_AllowListUnpickler`: ``torch.load`` reads a legacy
    (non-zip) file's header records with its pickle module's ``load``, so that too must be
    restricted, or a payload in the first record would run before any tensor is read."""
    return _AllowListUnpickler(file, **kwargs).load()


#: what ``torch.load`` takes as its ``pickle_module``: every read goes through the allow-list
_allow_list_pickle = types.SimpleNamespace(
    Unpickler=_AllowListUnpickler, load=_allow_list_load, __name__="isoprobe_allow_list_pickle"
)


def load_official_checkpoint(path: str) -> tuple[dict, dict]:
    """Architecture and weights from an official Lightning ``.ckpt``: its
    ``hyper_parameters["model_kwargs"]`` and its ``state_dict`` without the ``model.`` prefix.

    ``torch.load(weights_only=True)`` cannot read it: gluonts pickles its ``StudentTOutput`` as a
    call of ``functools.partial(getattr(object, "__new__"), ...)``, which that loader refuses.
    So it is read by an allow-list unpickler (``_AllowListUnpickler``, the standard library's
    "restricting globals" recipe): tensors, containers, primitives and inert stand-ins for the
    gluonts classes; any other global is refused by name and nothing of it runs."""
    try:
        ckpt = torch.load(
            path, map_location="cpu", pickle_module=_allow_list_pickle, weights_only=False
        )
    except (pickle.UnpicklingError, AttributeError, TypeError, EOFError, RuntimeError) as err:
        raise CheckpointError(
            f"{path} cannot be loaded safely ({err}). model.checkpoint=<file>.ckpt takes the "
            "official lag-llama.ckpt; other pickled classes are refused on purpose."
        ) from err
    kwargs = ckpt.get("hyper_parameters", {}).get("model_kwargs")
    if kwargs is None or "state_dict" not in ckpt:
        raise CheckpointError(
            f"{path} is not a Lag-Llama Lightning checkpoint: it needs hyper_parameters."
            "model_kwargs and a state_dict"
        )
    distribution = kwargs.get("distr_output")
    if distribution is not None and type(distribution).__name__ != "StudentTOutput":
        raise CheckpointError(f"{path} uses {type(distribution).__name__}; only Student-t is built")
    if kwargs.get("rope_scaling"):
        raise CheckpointError(f"{path} uses rope_scaling={kwargs['rope_scaling']}: not supported")
    config = {
        "n_layer": int(kwargs["n_layer"]),
        "n_head": int(kwargs["n_head"]),
        "n_embd_per_head": int(kwargs["n_embd_per_head"]),
        "max_context_length": int(kwargs.get("max_context_length", 2048)),
        "lags_seq": [int(lag) for lag in kwargs["lags_seq"]],
        "scaling": kwargs.get("scaling", "robust"),
        "time_feat": bool(kwargs.get("time_feat", True)),
        "scale_features": True,
        "rope_base": 10000.0,
    }
    if int(kwargs.get("input_size", 1)) != 1:
        raise CheckpointError(f"{path} has input_size={kwargs['input_size']}; only 1 is built")
    if config["scaling"] not in SCALINGS:
        raise CheckpointError(f"{path} uses scaling={config['scaling']!r}; built: {SCALINGS}")
    state = {
        key.removeprefix("model."): value
        for key, value in ckpt["state_dict"].items()
        if key.startswith("model.")
    }
    return config, state


__all__: Sequence[str] = ("LagLlamaModule", "official_lags", "load_official_checkpoint")
