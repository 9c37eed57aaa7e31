"""Lag-Llama: Student-t parameters equal to an independent forward pass written from the paper's
equations on the same state dict, lag features equal to gluonts', the official Lightning .ckpt
format loads (safely) and a misshapen tensor is named, masks and loss exact."""

from __future__ import annotations

import collections
import io
import os
import pickle
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from gluonts.time_feature import get_lags_for_frequency
from gluonts.torch.distributions import StudentTOutput

from isoprobe.models.allow_list_pickle import PickledObject
from isoprobe.models.checkpoints import CheckpointError
from isoprobe.models.lag_llama.checkpoint import checkpoint_pickle, load_official_checkpoint
from isoprobe.models.lag_llama.module import LagLlamaModule
from isoprobe.models.lag_llama.network import KeyValueCache, official_lags, window_scale
from isoprobe.tasks.runner import build_model
from tests.conftest import TINY_MODEL, compose_config

CONTEXT, HORIZON = 24, 6


def build(tmp_path, checkpoint: str = "scratch", extra=()) -> LagLlamaModule:
    cfg = compose_config(
        tmp_path,
        ["model=lag_llama", *TINY_MODEL["lag_llama"], f"model.checkpoint={checkpoint}", *extra],
    )
    windows = SimpleNamespace(
        context_length=CONTEXT, prediction_length=HORIZON, season_length=1, freq="h"
    )
    torch.manual_seed(0)
    return build_model(cfg.model, windows).eval()


def batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    context = torch.randn(2, CONTEXT, generator=g).cumsum(-1) + 5
    context[0, :10] = float("nan")
    context[1, 15] = float("nan")
    target = torch.randn(2, HORIZON, generator=g) + 5
    return {"context": context, "target": target, "loc": torch.zeros(2), "scale": torch.ones(2)}


def test_official_lag_set():
    union = set()
    for freq in ("Q", "M", "W", "D", "H", "T", "S"):
        union |= set(get_lags_for_frequency(freq, num_default_lags=1))
    lags = official_lags()
    assert list(lags) == sorted(lag - 1 for lag in union)
    assert max(lags) == 1092 and len(lags) + 2 + 6 == 92  # the official wte input width


def reference_student_t(state, config, values, observed, scaled_over):
    """Lag-Llama's forward from the paper, in numpy: mean scaler, lag tokens, RMSNorm, RoPE,
    causal softmax attention, SwiGLU, Student-t head."""
    w = {k: v.double().numpy() for k, v in state.items()}
    lags = config["lags_seq"]
    weights = scaled_over.astype(float)
    scale = np.maximum((np.abs(values) * weights).sum(1) / weights.sum(1), 1e-5)[:, None]
    scaled = np.where(observed, values / scale, 0.0)
    padded = np.concatenate([np.zeros((len(values), max(lags))), scaled], axis=1)
    steps = values.shape[1]
    x = np.stack([padded[:, max(lags) + t - np.array(lags)] for t in range(steps)], axis=1)
    x = np.concatenate([x, np.zeros((*x.shape[:2], 2))], axis=-1)  # scale_features false
    x = x @ w["transformer.wte.weight"].T + w["transformer.wte.bias"]

    def rms(h, g):
        return h / np.sqrt((h**2).mean(-1, keepdims=True) + 1e-5) * g

    heads, dim = config["n_head"], config["n_embd_per_head"]
    pos = np.arange(steps)[:, None] * 10000.0 ** (-np.arange(0, dim, 2) / dim)[None]
    cos, sin = np.cos(pos), np.sin(pos)

    def rope(t):  # pair (i, i + d/2) rotated by pos_i
        a, b = t[..., : dim // 2], t[..., dim // 2 :]
        return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)

    causal = np.tril(np.ones((steps, steps), dtype=bool))
    for i in range(config["n_layer"]):
        p = f"transformer.h.{i}."
        h = rms(x, w[p + "rms_1.scale"])
        q = h @ w[p + "attn.q_proj.weight"].T
        k, v = np.split(h @ w[p + "attn.kv_proj.weight"].T, 2, axis=-1)
        split = lambda t: t.reshape(*t.shape[:2], heads, dim).transpose(0, 2, 1, 3)  # noqa: E731
        q, k, v = rope(split(q)), rope(split(k)), split(v)
        scores = np.where(causal, q @ k.transpose(0, 1, 3, 2) / np.sqrt(dim), -np.inf)
        att = np.exp(scores - scores.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        y = (att @ v).transpose(0, 2, 1, 3).reshape(x.shape)
        x = x + y @ w[p + "attn.c_proj.weight"].T
        h = rms(x, w[p + "rms_2.scale"])
        a, b = h @ w[p + "mlp.c_fc1.weight"].T, h @ w[p + "mlp.c_fc2.weight"].T
        x = x + (a / (1 + np.exp(-a)) * b) @ w[p + "mlp.c_proj.weight"].T
    x = rms(x, w["transformer.ln_f.scale"])
    df, mu, sigma = (
        (x @ w[f"param_proj.proj.{j}.weight"].T + w[f"param_proj.proj.{j}.bias"])[..., 0]
        for j in range(3)
    )
    softplus = lambda t: np.log1p(np.exp(t))  # noqa: E731
    return 2 + softplus(df), scale * mu, scale * softplus(sigma)


def test_student_t_equals_an_independent_forward_pass(tmp_path):
    model = build(tmp_path)
    data = batch()
    with torch.no_grad():
        df, loc, scale = model.student_t(data)
    values = torch.cat([data["context"], data["target"][:, :-1]], 1).numpy().astype(float)
    observed = ~np.isnan(values)
    context_observed = observed.copy()
    context_observed[:, CONTEXT:] = False  # the scaler reads the context only
    ref = reference_student_t(
        model.network.state_dict(),
        model.config,
        np.nan_to_num(values),
        observed,
        context_observed,
    )
    diff = max(
        float(np.abs(a.double().numpy() - b).max())
        for a, b in zip((df, loc, scale), ref, strict=True)
    )
    print(f"largest Student-t parameter difference: {diff:.2e}")
    assert diff < 1e-4


def test_masks_are_the_observed_steps(tmp_path):
    model = build(tmp_path)
    data = batch()
    layers = list(model.probe_layers()) + list(model.probe_layers("attention"))
    masks = model.token_masks(data, layers)
    expected = torch.ones(2, CONTEXT + HORIZON - 1, dtype=torch.bool)
    expected[0, :10] = False
    expected[1, 15] = False
    assert all(torch.equal(m, expected) for m in masks.values())


def test_loss_is_the_student_t_nll_of_the_observed_next_values(tmp_path):
    model = build(tmp_path)
    data = batch()
    with torch.no_grad():
        df, loc, scale = model.student_t(data)
        loss = model.loss(data)
    nexts = torch.cat([data["context"][:, 1:], data["target"]], 1)
    keep = ~nexts.isnan()
    dist = torch.distributions.StudentT(df[keep], loc[keep], scale[keep])
    torch.testing.assert_close(loss, -dist.log_prob(nexts[keep]).mean())


def test_key_value_caching_equals_running_the_whole_sequence(tmp_path):
    model = build(tmp_path)
    data = batch()
    values, observed, loc, scale, _ = model._teacher_forced(data)
    with torch.no_grad():
        tokens = model._tokens(values, observed, loc, scale)
        whole = torch.stack(model.network(tokens))  # [3, B, T]
        prefix = 20
        (first, new) = model.network.extend(tokens[:, :prefix])
        caches = [KeyValueCache(k, v, tokens.shape[1], repeats=1) for k, v in new]
        steps = [torch.stack(first)]
        for t in range(prefix, tokens.shape[1]):
            last = model._tokens(values[:, : t + 1], observed[:, : t + 1], loc, scale, True)
            torch.testing.assert_close(last, tokens[:, t : t + 1], rtol=0, atol=0)
            steps.append(torch.stack(model.network.extend(last, caches)[0]))
    torch.testing.assert_close(torch.cat(steps, dim=-1), whole, rtol=1e-5, atol=1e-5)


def test_forecast_samples_equal_sampling_by_rerunning_the_sequence(tmp_path):
    model = build(tmp_path)
    data = batch()
    torch.manual_seed(3)
    ours = model.forecast(data).samples  # [B, S, H]
    # the reference: every step re-runs the network on the whole sequence so far
    samples = model.num_samples
    context = data["context"]
    loc, scale = window_scale(context.nan_to_num(), ~context.isnan(), model.config["scaling"])
    values = context.nan_to_num().repeat_interleave(samples, 0)
    observed = (~context.isnan()).repeat_interleave(samples, 0)
    loc, scale = loc.repeat_interleave(samples, 0), scale.repeat_interleave(samples, 0)
    torch.manual_seed(3)
    with torch.no_grad():
        for _ in range(HORIZON):
            df, mu, sigma = model.network(model._tokens(values, observed, loc, scale))
            draw = torch.distributions.StudentT(df[:, -1], mu[:, -1], sigma[:, -1]).sample()
            values = torch.cat([values, loc + scale * draw[:, None]], dim=1)
            observed = torch.nn.functional.pad(observed, (0, 1), value=True)
    expected = values[:, -HORIZON:].reshape(len(context), samples, HORIZON)
    torch.testing.assert_close(ours, expected, rtol=1e-4, atol=1e-4)


def official_ckpt(model: LagLlamaModule, path, state=None) -> str:
    state = model.network.state_dict() if state is None else state
    kwargs = {
        "context_length": CONTEXT,
        "max_context_length": 2048,
        "scaling": "mean",
        "input_size": 1,
        "n_layer": model.config["n_layer"],
        "n_embd_per_head": model.config["n_embd_per_head"],
        "n_head": model.config["n_head"],
        "lags_seq": list(model.config["lags_seq"]),
        "distr_output": StudentTOutput(),
        "rope_scaling": None,
        "time_feat": False,
        "dropout": 0.0,
    }
    # the layout of a Lightning checkpoint, as the official estimator writes it
    ckpt = {
        "epoch": 3,
        "global_step": 400,
        "pytorch-lightning_version": "2.0.4",
        "state_dict": collections.OrderedDict((f"model.{k}", v) for k, v in state.items()),
        "optimizer_states": [{"state": {0: {"step": torch.tensor(4.0)}}, "param_groups": []}],
        "lr_schedulers": [],
        "callbacks": {"EarlyStopping{'monitor': 'train_loss', 'mode': 'min'}": {"wait_count": 0}},
        "hyper_parameters": {"model_kwargs": kwargs, "context_length": CONTEXT, "lr": 1e-3},
    }
    torch.save(ckpt, path)
    return str(path)


def test_official_checkpoint_loads_safely(tmp_path):
    model = build(tmp_path)
    loaded = build(tmp_path, official_ckpt(model, tmp_path / "lag-llama.ckpt"))
    assert loaded.resolved_checkpoint.kind == "path"
    data = batch()
    with torch.no_grad():
        first, again = model.network.state_dict(), loaded.network.state_dict()
        assert all(torch.equal(first[k], again[k]) for k in first)
        # the official model also feeds the magnitude features
        assert loaded.config["scale_features"] is True
        assert torch.isfinite(loaded.loss(data))


class RunsACommand:
    """A pickle that would run a shell command when loaded."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_checkpoint_that_would_run_code_is_refused_and_runs_nothing(tmp_path):
    model = build(tmp_path)
    path = official_ckpt(model, tmp_path / "evil.ckpt")
    ckpt = torch.load(path, weights_only=False)
    ckpt["hyper_parameters"]["payload"] = RunsACommand(tmp_path / "ran")
    torch.save(ckpt, path)
    with pytest.raises(CheckpointError, match=r"pickles posix\.system, which is not on the allow"):
        load_official_checkpoint(path)
    assert not (tmp_path / "ran").exists()


def test_gluonts_classes_unpickle_as_inert_stand_ins():
    loaded = checkpoint_pickle.load(io.BytesIO(pickle.dumps(StudentTOutput(beta=0.5))))
    assert isinstance(loaded, PickledObject) and not isinstance(loaded, StudentTOutput)
    assert type(loaded).__name__ == "StudentTOutput"
    assert loaded.qualified_name == "gluonts.torch.distributions.studentT.StudentTOutput"
    assert loaded.state["__init_args__"] == {"beta": 0.5}


def test_a_misshapen_tensor_is_named(tmp_path):
    model = build(tmp_path)
    state = dict(model.network.state_dict())
    state["transformer.h.1.attn.kv_proj.weight"] = torch.zeros(3, 3)
    path = official_ckpt(model, tmp_path / "bad.ckpt", state)
    with pytest.raises(CheckpointError, match=r"transformer\.h\.1\.attn\.kv_proj\.weight"):
        build(tmp_path, path)
