"""The schemas (:mod:`isoprobe.models.config_schema`) of the checkpoints isoprobe hands to a
transformers config class (``T5Config``, ``GPT2Config``, ``PatchTSTConfig``,
``TimesFmConfig``): the keys that set the model's sizes or that isoprobe reads, checked in the
raw config.json before transformers builds anything. Keys the transformers class has a default
for, and that the official files may leave out, are optional here too."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from isoprobe.models.config_schema import ConfigSchema, Key, fraction, positive, repeats, size

T5_KEYS = (
    size("vocab_size"),
    size("d_model"),
    size("d_kv"),
    size("d_ff"),
    repeats("num_layers"),
    repeats("num_heads"),
    # T5Config: as many decoder layers as encoder layers when absent
    repeats("num_decoder_layers", required=False, nullable=True),
    size("relative_attention_num_buckets", required=False),
    size("relative_attention_max_distance", required=False),
    fraction("dropout_rate"),
    positive("layer_norm_epsilon", required=False),
    Key("feed_forward_proj", str, required=False),
)


def _t5_layer(config: Mapping[str, Any], attentions: int) -> int:
    """One T5 block: ``attentions`` attention layers, a gated feed-forward (the larger kind)
    and its norms."""
    width = config["d_model"]
    inner = config["num_heads"] * config["d_kv"]
    return attentions * 4 * width * inner + 3 * width * config["d_ff"] + 3 * width


def t5_parameters(config: Mapping[str, Any]) -> int:
    """An encoder-decoder T5 with an untied head (the larger case)."""
    decoder_layers = config.get("num_decoder_layers") or config["num_layers"]
    return (
        2 * config["vocab_size"] * config["d_model"]
        + config["num_layers"] * _t5_layer(config, 1)
        + decoder_layers * _t5_layer(config, 2)
    )


CHRONOS_T5 = ConfigSchema(
    "Chronos-T5",
    T5_KEYS,
    t5_parameters,
    model_types=("t5",),
    architectures=("T5ForConditionalGeneration",),
)


def _chronos(config: Mapping[str, Any], key: str) -> int:
    """A size in ``chronos_config`` (1 where it is absent: ``check_config_keys`` names the
    missing keys of the whole object once transformers has read it)."""
    chronos = config.get("chronos_config")
    return chronos.get(key, 1) if isinstance(chronos, Mapping) else 1


def _quantile_count(config: Mapping[str, Any]) -> int:
    chronos = config.get("chronos_config")
    quantiles = chronos.get("quantiles") if isinstance(chronos, Mapping) else None
    return len(quantiles) if isinstance(quantiles, list) else 1


def _patch_blocks(config: Mapping[str, Any], outputs: int) -> int:
    """Chronos-Bolt's and Chronos-2's residual input and output blocks."""
    width, hidden = config["d_model"], config["d_ff"]
    patch = _chronos(config, "input_patch_size")
    return (3 * patch + width) * hidden + hidden * width + (width + hidden) * (outputs + width)


def bolt_parameters(config: Mapping[str, Any]) -> int:
    outputs = _quantile_count(config) * _chronos(config, "prediction_length")
    return t5_parameters(config) + _patch_blocks(config, outputs)


def chronos2_parameters(config: Mapping[str, Any]) -> int:
    """An encoder alone, each block with time and group attention."""
    outputs = _quantile_count(config) * _chronos(config, "output_patch_size")
    return (
        config["vocab_size"] * config["d_model"]
        + config["num_layers"] * _t5_layer(config, 2)
        + _patch_blocks(config, outputs)
    )


#: optional here: the loaders' ``check_config_keys`` names a ``chronos_config``'s missing keys
CHRONOS_PATCHES = (
    size("chronos_config.context_length", required=False),
    size("chronos_config.input_patch_size", required=False),
    size("chronos_config.input_patch_stride", required=False),
)
CHRONOS_BOLT = ConfigSchema(
    "Chronos-Bolt",
    (*T5_KEYS, *CHRONOS_PATCHES, size("chronos_config.prediction_length", required=False)),
    bolt_parameters,
    model_types=("t5",),
    architectures=("ChronosBoltModelForForecasting",),
)
CHRONOS_2 = ConfigSchema(
    "Chronos-2",
    (
        *T5_KEYS,
        *CHRONOS_PATCHES,
        size("chronos_config.output_patch_size", required=False),
        size("chronos_config.max_output_patches", required=False),
    ),
    chronos2_parameters,
    model_types=("t5",),
    architectures=("Chronos2Model",),
)
LLM_T5 = ConfigSchema("T5", T5_KEYS, t5_parameters, model_types=("t5",))


def gpt2_parameters(config: Mapping[str, Any]) -> int:
    width = config["n_embd"]
    inner = config.get("n_inner") or 4 * width
    layer = 4 * width * width + 2 * width * inner + 9 * width + inner
    return (config["vocab_size"] + config["n_positions"]) * width + config["n_layer"] * layer


LLM_GPT2 = ConfigSchema(
    "GPT-2",
    (
        size("vocab_size"),
        size("n_embd"),
        repeats("n_layer"),
        repeats("n_head"),
        size("n_positions"),
        # GPT2Config: 4 x n_embd when null or absent
        Key("n_inner", int, low=1, required=False, nullable=True),
        positive("layer_norm_epsilon", required=False),
    ),
    gpt2_parameters,
    multiples=(("n_embd", "n_head"),),
    model_types=("gpt2",),
)


def patchtst_parameters(config: Mapping[str, Any]) -> int:
    width, patch = config["d_model"], config["patch_length"]
    patches = max(config["context_length"] - patch, 0) // config["patch_stride"] + 2
    layer = 4 * width * width + 2 * width * config["ffn_dim"] + 9 * width
    # the head's distribution arguments: at most three per step
    head = patches * width * 3 * config["prediction_length"]
    return (patch + patches) * width + config["num_hidden_layers"] * layer + head


PATCHTST = ConfigSchema(
    "PatchTST",
    (
        size("d_model"),
        repeats("num_attention_heads"),
        repeats("num_hidden_layers"),
        size("ffn_dim"),
        size("context_length"),
        size("prediction_length"),
        size("patch_length"),
        size("patch_stride"),
        size("num_input_channels", required=False),
        positive("norm_eps", required=False),
        fraction("attention_dropout"),
        fraction("ff_dropout"),
        fraction("head_dropout"),
        fraction("path_dropout"),
        fraction("positional_dropout"),
    ),
    patchtst_parameters,
    multiples=(("d_model", "num_attention_heads"),),
    model_types=("patchtst",),
)


def timesfm_parameters(config: Mapping[str, Any]) -> int:
    width, hidden = config["hidden_size"], config["intermediate_size"]
    patch, horizon = config["patch_length"], config["horizon_length"]
    quantiles = config.get("quantiles")
    outputs = horizon * (1 + (len(quantiles) if isinstance(quantiles, list) else 0))
    inner = config["num_attention_heads"] * config["head_dim"]
    layer = 4 * width * inner + 2 * width * hidden + 4 * width
    residual_in = 2 * patch * hidden + hidden * width + 2 * patch * width
    residual_out = width * hidden + hidden * outputs + width * outputs
    frequencies = config.get("freq_size", 3) * width
    return config["num_hidden_layers"] * layer + residual_in + residual_out + frequencies


TIMESFM = ConfigSchema(
    "TimesFM",
    (
        size("hidden_size"),
        size("intermediate_size"),
        size("head_dim"),
        repeats("num_attention_heads"),
        repeats("num_hidden_layers"),
        size("patch_length"),
        size("context_length"),
        size("horizon_length"),
        size("freq_size", required=False),
        positive("rms_norm_eps", required=False),
        positive("min_timescale", required=False),
        positive("max_timescale", required=False),
    ),
    timesfm_parameters,
    multiples=(("context_length", "patch_length"),),
    model_types=("timesfm",),
)
