"""TOTEM's tokenizer: parity with the official VQ-VAE on the same weights, read from an official
whole-module pickle (tests/fixtures/totem/make_fixture.py), and its refusals."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from isoprobe.models.checkpoints import CheckpointError
from isoprobe.models.totem.checkpoint import load_totem_tokenizer
from isoprobe.models.totem.tokenizer import TotemConfig, TotemTokenizer

FIXTURE = Path(__file__).parents[1] / "fixtures" / "totem"
PICKLE = FIXTURE / "tiny_vqvae.pth"


@pytest.fixture(scope="module")
def official():
    return {k: torch.from_numpy(v) for k, v in np.load(FIXTURE / "tiny_vqvae_outputs.npz").items()}


@pytest.fixture(scope="module")
def tokenizer():
    return load_totem_tokenizer(PICKLE)


def test_architecture_is_read_from_the_official_pickle(tokenizer):
    assert tokenizer.config == TotemConfig(
        block_hidden_size=16,
        num_residual_layers=2,
        res_hidden_size=8,
        embedding_dim=8,
        num_embeddings=32,
        commitment_cost=0.25,
        compression_factor=4,
    )


def test_revin_normalisation_equals_the_official(tokenizer, official):
    """Equal to float32 rounding: the mean and variance are sums whose order follows the CPU's
    vector width, so the last bit of a value may differ from the fixture's machine (it does on
    an AVX-512 one); 1e-6 is four units in the last place of the largest value (|x| < 3)."""
    ours = tokenizer.normalise(official["raw"])
    torch.testing.assert_close(ours, official["series"], rtol=0, atol=1e-6)


def test_every_output_equals_the_official_on_the_same_weights(tokenizer, official):
    series = official["series"]
    with torch.no_grad():
        ours = {
            "latent": tokenizer.encoder(series),
            "quantized": tokenizer.embed(series).transpose(1, 2),
            "reconstruction": tokenizer.reconstruct(series),
            "loss": tokenizer.loss(series),
        }
        assert torch.equal(tokenizer.tokenize(series), official["ids"])
    assert len(set(official["ids"].flatten().tolist())) > 20  # the codes really vary
    for name, value in ours.items():
        assert (value - official[name]).abs().max() <= 1e-6, name


@pytest.mark.parametrize("factor", [8, 16])
def test_longer_compression_shortens_the_series_by_its_factor(factor):
    tokenizer = TotemTokenizer(
        TotemConfig(block_hidden_size=8, res_hidden_size=4, compression_factor=factor)
    )
    series = torch.randn(2, 64)
    assert tokenizer.tokenize(series).shape == (2, 64 // factor)
    assert tokenizer.reconstruct(series).shape == (2, 64)


def test_unbuilt_compression_factor_and_ragged_length_are_refused():
    with pytest.raises(ValueError, match="compression_factor=12"):
        TotemConfig(compression_factor=12)
    with pytest.raises(ValueError, match="multiple of its compression factor 4"):
        TotemTokenizer(TotemConfig()).tokenize(torch.randn(2, 30))


def test_embedding_is_each_tokens_codeword(tokenizer, official):
    series = official["series"]
    with torch.no_grad():
        ids, embedded = tokenizer.tokenize(series), tokenizer.embed(series)
    assert torch.equal(embedded, tokenizer.quantizer.codebook.weight[ids])


def test_pickle_of_another_class_is_refused_naming_it(tmp_path):
    path = tmp_path / "other.pth"
    torch.save(torch.nn.Conv1d(1, 2, 3), path)
    with pytest.raises(CheckpointError, match="holds torch.nn.modules.conv.Conv1d, not TOTEM"):
        load_totem_tokenizer(path)


def test_missing_file_is_named(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_totem_tokenizer(tmp_path / "nothing.pth")


def test_pickle_with_a_tensor_missing_names_it(tmp_path):
    """The official pickle with the decoder's last layer renamed in data.pkl."""
    with zipfile.ZipFile(PICKLE) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    key = next(name for name in members if name.endswith("data.pkl"))
    members[key] = members[key].replace(b"_conv_trans_2", b"_conv_trans_9")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    path = tmp_path / "edited.pth"
    path.write_bytes(buffer.getvalue())
    with pytest.raises(CheckpointError, match=r"missing \['decoder.upsample.1.bias'"):
        load_totem_tokenizer(path)
