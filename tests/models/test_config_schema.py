"""A received checkpoint directory whose config.json holds one bad value is refused with the
project's user error naming the file and the key, quickly and before the model is allocated;
each model's own config, untouched, still loads."""

from __future__ import annotations

import json
import math
import resource
import struct
import time
import zipfile
from pathlib import Path

import pytest

from isoprobe.models.checkpoints import CheckpointError
from isoprobe.models.config_schema import ConfigSchema, Key, check_config, size
from isoprobe.models.totem.checkpoint import load_totem_tokenizer
from isoprobe.tasks.user_errors import is_own_error
from tests.models.test_checkpoint_errors import build, copy_bundled

TOTEM_PICKLE = Path(__file__).parents[1] / "fixtures" / "totem" / "tiny_vqvae.pth"
#: a value the test deletes instead of setting
ABSENT = object()
#: how much the peak resident memory may grow while a config is refused
ALLOWED_GROWTH_BYTES = 256 * 2**20
#: a refusal reads one small file
ALLOWED_SECONDS = 20


def visionts_export(tmp_path: Path) -> Path:
    model = build(tmp_path, "visionts", "model.checkpoint=scratch")
    target = tmp_path / "visionts-export"
    model.export(str(target))
    return target


def bundled(name: str):
    return lambda tmp_path: copy_bundled(tmp_path, name)


#: model -> how to make its checkpoint directory in tmp_path
CHECKPOINTS = {
    "chronos": bundled("chronos-t5-mini"),
    "chronos_bolt": bundled("chronos-bolt-mini"),
    "chronos2": bundled("chronos-2-mini"),
    "lag_llama": bundled("lag-llama-mini"),
    "llm": bundled("llm-gpt2-mini"),
    "moirai": bundled("moirai-mini"),
    "moirai2": bundled("moirai2-mini"),
    "patchtst": bundled("patchtst-mini"),
    "time_moe": bundled("time-moe-mini"),
    "timesfm": bundled("timesfm-mini"),
    "timesfm25": bundled("timesfm25-mini"),
    "tirex": bundled("tirex-mini"),
    "toto": bundled("toto-mini"),
    "sundial": bundled("sundial-mini"),
    "visionts": visionts_export,
}
#: the data's lengths a model's checkpoint is built for, where it fixes them
LENGTHS = {"patchtst": (512, 64)}
#: model -> (key, bad value): one value at a time in its own config.json
BAD_VALUES = {
    "chronos": [
        ("d_model", "64"),
        ("d_model", 64.0),
        ("num_heads", 0),
        ("d_ff", -1),
        ("d_model", 1_000_000_000),
        ("num_layers", 100_000_000),
        ("layer_norm_epsilon", math.nan),
        ("vocab_size", ABSENT),
    ],
    "chronos_bolt": [
        ("d_model", True),
        ("chronos_config.prediction_length", 1_000_000_000),
        ("chronos_config.input_patch_size", 0),
        ("dropout_rate", math.inf),
        ("num_layers", ABSENT),
    ],
    "chronos2": [
        ("d_kv", "32"),
        ("chronos_config.output_patch_size", -1),
        ("num_layers", 100_000_000),
        ("d_model", 1_000_000_000),
        ("d_ff", ABSENT),
    ],
    "lag_llama": [
        ("n_embd_per_head", "16"),
        ("n_head", 0),
        ("n_layer", 100_000_000),
        ("n_embd_per_head", 1_000_000_000),
        ("rope_base", math.nan),
        ("scaling", "max"),
        ("lags_seq", [0, -7]),
        ("time_feat", ABSENT),
    ],
    "llm": [
        ("n_embd", "64"),
        ("n_head", 0),
        ("n_layer", 100_000_000),
        ("n_embd", 1_000_000_000),
        ("layer_norm_epsilon", math.nan),
        ("n_positions", ABSENT),
    ],
    "moirai": [
        ("d_model", 128.0),
        ("d_model", 96),
        ("num_layers", 100_000_000),
        ("d_model", 1_000_000_000),
        ("patch_sizes", [32, 0]),
        ("dropout_p", math.inf),
        ("max_seq_len", ABSENT),
    ],
    "patchtst": [
        ("d_model", "32"),
        ("num_attention_heads", 0),
        ("ffn_dim", 1_000_000_000),
        ("num_hidden_layers", 100_000_000),
        ("norm_eps", math.nan),
        ("patch_length", ABSENT),
    ],
    "time_moe": [
        ("hidden_size", "64"),
        ("hidden_size", 64.0),
        ("hidden_size", -64),
        ("hidden_size", 0),
        ("hidden_size", True),
        ("hidden_size", 1_000_000_000),
        ("num_hidden_layers", 100_000_000),
        ("rope_theta", "abc"),
        ("rope_theta", math.nan),
        ("rms_norm_eps", math.inf),
        ("num_experts", ABSENT),
    ],
    "timesfm": [
        ("hidden_size", 128.0),
        ("head_dim", 0),
        ("num_hidden_layers", 100_000_000),
        ("intermediate_size", 1_000_000_000),
        ("rms_norm_eps", math.inf),
        ("patch_length", ABSENT),
    ],
    "moirai2": [
        ("d_model", "128"),
        ("d_model", 128.0),
        ("num_layers", 100_000_000),
        ("d_ff", 1_000_000_000),
        ("patch_size", 0),
        ("dropout_p", math.nan),
        ("d_model", ABSENT),
    ],
    "timesfm25": [
        ("model_dims", "64"),
        ("model_dims", 64.0),
        ("num_heads", 0),
        ("num_layers", 100_000_000),
        ("hidden_dims", 1_000_000_000),
        ("decode_index", 0),
        ("input_patch_len", ABSENT),
    ],
    "tirex": [
        ("embedding_dim", "64"),
        ("embedding_dim", 64.0),
        ("num_heads", 0),
        ("num_blocks", 100_000_000),
        ("input_ff_dim", 1_000_000_000),
        ("ffn_proj_factor", math.nan),
        ("input_patch_size", ABSENT),
    ],
    "toto": [
        ("embed_dim", "64"),
        ("embed_dim", 64.0),
        ("num_heads", 0),
        ("num_layers", 100_000_000),
        ("mlp_hidden_dim", 1_000_000_000),
        ("output_distribution_kwargs.k_components", 0),
        ("scale_factor_exponent", math.nan),
        ("patch_size", ABSENT),
    ],
    "sundial": [
        ("hidden_size", "64"),
        ("hidden_size", 64.0),
        ("num_attention_heads", 0),
        ("num_hidden_layers", 100_000_000),
        ("intermediate_size", 1_000_000_000),
        ("output_token_lens", [64, 0]),
        ("dropout_rate", math.nan),
        ("input_token_len", ABSENT),
    ],
    "visionts": [
        ("depth", 100_000_000),
        ("width", 1_000_000_000),
        ("width", -64),
        ("width", "64"),
        ("patch_size", 0),
        ("heads", 0),
        ("mlp_ratio", math.nan),
        ("mlp_ratio", math.inf),
        ("mlp_ratio", "4"),
        ("decoder_depth", ABSENT),
    ],
}


def with_value(config: dict, dotted: str, value: object) -> dict:
    """``config`` with the (dotted) key set to ``value``, or deleted for :data:`ABSENT`."""
    *parents, last = dotted.split(".")
    node = config
    for part in parents:
        node = node[part]
    if value is ABSENT:
        del node[last]
    else:
        node[last] = value
    return config


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@pytest.mark.parametrize(
    ("model", "key", "value"),
    [(model, key, value) for model, cases in BAD_VALUES.items() for key, value in cases],
    ids=lambda v: "absent" if v is ABSENT else v if isinstance(v, str) else repr(v),
)
def test_one_bad_config_value_is_refused_naming_the_key(tmp_path, model, key, value):
    target = CHECKPOINTS[model](tmp_path)
    config_file = target / "config.json"
    config_file.write_text(json.dumps(with_value(json.loads(config_file.read_text()), key, value)))
    before, start = peak_rss_bytes(), time.monotonic()
    with pytest.raises(CheckpointError) as refused:
        build(tmp_path, model, f"model.checkpoint={target}", lengths=LENGTHS.get(model, (32, 8)))
    assert time.monotonic() - start < ALLOWED_SECONDS
    assert peak_rss_bytes() - before < ALLOWED_GROWTH_BYTES
    assert is_own_error(refused.value)
    assert str(config_file) in str(refused.value)
    named = f"{key} is missing" if value is ABSENT else key.rsplit(".", 1)[-1]
    assert named in str(refused.value)


@pytest.mark.parametrize("model", sorted(CHECKPOINTS))
def test_the_models_own_config_still_loads(tmp_path, model):
    target = CHECKPOINTS[model](tmp_path)
    lengths = LENGTHS.get(model, (32, 8))
    assert build(tmp_path, model, f"model.checkpoint={target}", lengths=lengths) is not None


SCHEMA = ConfigSchema(
    model="toy",
    keys=(size("width"), size("heads"), Key("eps", float, above=0, required=False)),
    multiples=(("width", "heads"),),
    parameters=lambda config: config["width"] ** 2,
)


@pytest.mark.parametrize(
    ("config", "words"),
    [
        ({"width": "64", "heads": 4}, "width is '64'; expected a whole number"),
        ({"width": 64.0, "heads": 4}, "width is 64.0"),
        ({"width": True, "heads": 4}, "width is True"),
        ({"width": 64}, "heads is missing"),
        ({"width": 64, "heads": 4, "eps": math.nan}, "eps is nan; expected a finite number"),
        ({"width": 64, "heads": 4, "eps": "1e-6"}, "eps is '1e-6'"),
        ({"width": 64, "heads": 5}, "width=64 is not a multiple of heads=5"),
        ({"width": 10**400, "heads": 1}, "GiB in float32), more than the"),
    ],
)
def test_the_schema_names_the_key_the_value_and_what_is_expected(config, words):
    with pytest.raises(CheckpointError, match="toy.json") as refused:
        check_config(config, SCHEMA, "toy.json")
    assert words in str(refused.value)


def test_an_optional_key_may_be_left_out():
    check_config({"width": 64, "heads": 4}, SCHEMA, "toy.json")


@pytest.mark.parametrize("commitment", [math.nan, math.inf, -0.25])
def test_a_totem_file_with_a_bad_commitment_cost_is_refused_naming_it(tmp_path, commitment):
    """The fixture's pickled ``_commitment_cost`` (0.25, one BINFLOAT opcode) replaced."""
    with zipfile.ZipFile(TOTEM_PICKLE) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    key = next(name for name in members if name.endswith("data.pkl"))
    members[key] = members[key].replace(
        b"G" + struct.pack(">d", 0.25), b"G" + struct.pack(">d", commitment)
    )
    path = tmp_path / "edited.pth"
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    with pytest.raises(CheckpointError, match=rf"{path}(.|\n)*commitment_cost is"):
        load_totem_tokenizer(path)
