"""Each embedder gives the embedded inputs it says: a model's real tokens at its ``embed``
layer, TOTEM's codewords, T5's word embeddings, ViT's patch embeddings; and the experiment runs
end to end on tiny settings."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from isoprobe.models.checkpoints import CheckpointError
from isoprobe.spectra.baselines import T5TextEmbedder, TotemEmbedder, VitImageEmbedder
from isoprobe.spectra.embedders import EMBED_LAYER, ForecasterEmbedder, signal_batch
from isoprobe.spectra.signals import diverse_signals
from isoprobe.tasks.runner import run_task
from tests.conftest import compose_config

TINY_TOTEM = {"block_hidden_size": 8, "res_hidden_size": 4, "embedding_dim": 6}


def test_a_models_rows_are_its_real_embed_tokens_whatever_the_batching(tmp_path):
    cfg = compose_config(tmp_path, ["model=chronos_bolt", "model.checkpoint=bundled"])
    series, _ = diverse_signals(2, 80, seed=0)
    series[0, :20] = float("nan")  # left padding: those patches are not real tokens
    embedder = ForecasterEmbedder(cfg.model, horizon=16, batch_size=6)
    embedded = embedder.embedded_inputs(series)
    whole = embedded.rows
    embedder.batch_size = 1
    assert torch.allclose(whole, embedder.embedded_inputs(series).rows, atol=1e-6)
    masks = embedder.model.token_masks(signal_batch(series, 16), [EMBED_LAYER])[EMBED_LAYER]
    assert torch.equal(torch.bincount(embedded.series_index), masks.flatten(1).sum(1))
    assert whole.shape == (int(masks.sum()), embedder.model.model.config.d_model)
    assert int(masks[0].sum()) < int(masks[1].sum())


def test_totem_rows_are_codewords_one_per_compressed_step():
    embedder = TotemEmbedder(config=TINY_TOTEM)
    series, _ = diverse_signals(2, 64, seed=0)
    embedded = embedder.embedded_inputs(series)
    rows = embedded.rows
    assert rows.shape == (6 * 64 // 4, 6)
    assert torch.equal(embedded.series_index, torch.arange(6).repeat_interleave(16))
    codebook = embedder.tokenizer.quantizer.codebook.weight
    assert (rows[:, None, :] == codebook[None]).all(dim=-1).any(dim=-1).all()


def test_t5_rows_are_one_embedding_per_word(tmp_path):
    text = tmp_path / "prose.txt"
    text.write_text("It was the best of times, it was the worst of times.", encoding="utf-8")
    embedder = T5TextEmbedder(text_file=str(text), d_model=16)
    rows = embedder.embedded_inputs(None).rows
    words = ["It", "was", "the", "best", "of", "times", ",", "it", "was", "the", "worst", "of"]
    words += ["times", "."]
    assert rows.shape == (len(words), 16)
    assert torch.equal(rows[1], rows[8]) and not torch.equal(rows[0], rows[7])  # cased
    assert len(torch.unique(rows, dim=0)) == len(set(words))
    with pytest.raises(CheckpointError, match="does not exist"):
        T5TextEmbedder(text_file=str(tmp_path / "missing.txt"))
    with pytest.raises(CheckpointError, match="ships no T5 weights"):
        T5TextEmbedder(checkpoint="bundled")


def test_default_text_is_english_prose_that_ships_here():
    rows = T5TextEmbedder(d_model=8, max_tokens=5000).embedded_inputs(None).rows
    assert rows.shape == (5000, 8)


def test_vit_rows_are_the_patch_embeddings_with_positions_without_cls():
    embedder = VitImageEmbedder(images=2, hidden_size=24)
    rows = embedder.embedded_inputs(None).rows
    assert rows.shape == (2 * 196, 24)
    embeddings = embedder.embeddings
    with torch.no_grad():
        patches = embeddings.patch_embeddings(embedder.pixels)
        expected = patches + embeddings.position_embeddings[:, 1:]
    assert torch.allclose(rows, expected.reshape(-1, 24), atol=1e-6)
    assert embedder.pixels.min() >= -1 and embedder.pixels.max() <= 1


def test_the_experiment_runs_end_to_end_on_tiny_settings(tmp_path):
    cfg = compose_config(
        tmp_path,
        [
            "experiment=rank/embedding_spectra",
            *[
                f"~embedding_spectra.models.{name}"
                for name in (
                    "chronos2",
                    "timesfm",
                    "moirai",
                    "patchtst",
                    "lag_llama",
                    "time_moe",
                    "visionts",
                    "timesfm25",
                    "moirai2",
                    "tirex",
                    "toto",
                    "sundial",
                )
            ],
            "embedding_spectra.per_family=2",
            "embedding_spectra.context_length=64",
            "embedding_spectra.prediction_length=16",
            "embedding_spectra.max_tokens=200",
            *[f"embedding_spectra.embedders.totem.config.{k}={v}" for k, v in TINY_TOTEM.items()],
            "embedding_spectra.embedders.t5.d_model=16",
            "embedding_spectra.embedders.t5.max_tokens=300",
            "embedding_spectra.embedders.vit.images=1",
            "embedding_spectra.embedders.vit.hidden_size=16",
        ],
    )
    outputs = run_task(cfg)["outputs"]
    ranks = pd.read_csv(outputs["epsilon_ranks"])
    assert list(ranks["model"]) == ["chronos", "chronos_bolt", "totem", "t5", "vit"]
    assert list(ranks["modality"]) == ["time series"] * 3 + ["text", "image"]
    assert (ranks["tokens"] <= 200).all()
    for eps_column in ("rank_eps0.001", "rank_eps0.01", "rank_eps0.1"):
        assert (ranks[eps_column] <= ranks[["tokens", "width"]].min(axis=1)).all()
    assert (ranks["rank_eps0.001"] >= ranks["rank_eps0.1"]).all()
    sigma = pd.read_csv(outputs["singular_values"])
    for _, values in sigma.groupby("model")["relative_singular_value"]:
        assert values.iloc[0] == 1.0 and (values.diff().dropna() <= 0).all()
    report = (tmp_path / "report.html").read_text()
    assert "rank_eps0.01" in report and "data:image/png;base64" in report


def test_vit_loads_a_local_checkpoint_directory(tmp_path):
    from transformers import ViTConfig, ViTModel

    torch.manual_seed(1)
    config = ViTConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=1)
    saved = ViTModel(config, add_pooling_layer=False)
    saved.save_pretrained(tmp_path)
    embedder = VitImageEmbedder(checkpoint=str(tmp_path), images=1)
    with torch.no_grad():
        expected = saved.embeddings(embedder.pixels)[:, 1:].reshape(-1, 8)
    assert torch.equal(embedder.embedded_inputs(None).rows, expected)
    assert embedder.source == f"path:{tmp_path.resolve()}"


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("embedding_spectra.epsilon=[0.01,2]", r"epsilon must be numbers in \(0, 1\]"),
        ("embedding_spectra.projected=[chronos,wavetoken]", r"projected names \['wavetoken'\]"),
        ("embedding_spectra.per_family=0", "embedding_spectra.per_family must be"),
    ],
)
def test_settings_out_of_place_are_refused_before_anything_loads(tmp_path, override, named):
    from isoprobe.settings import SettingsError

    cfg = compose_config(tmp_path, ["experiment=rank/embedding_spectra", override])
    with pytest.raises(SettingsError, match=named):
        run_task(cfg)
    assert not (tmp_path / "epsilon_ranks.csv").exists()


def test_t5_reads_a_local_checkpoint_with_its_own_tokenizer(tmp_path):
    """A directory laid out as google-t5/t5-small is (the whole seq2seq model and a tokenizer):
    the rows are the checkpoint's shared embedding at the tokenizer's ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, T5Config, T5ForConditionalGeneration

    words = ["<pad>", "</s>", "<unk>", "it", "was", "the", "best", "of", "times", ","]
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", pad_token="<pad>")
    tokenizer.save_pretrained(tmp_path)
    torch.manual_seed(2)
    config = T5Config(vocab_size=len(words), d_model=8, d_kv=4, d_ff=8, num_heads=2, num_layers=1)
    saved = T5ForConditionalGeneration(config)
    saved.save_pretrained(tmp_path)
    text = tmp_path / "prose.txt"
    text.write_text("it was the best of times , it was", encoding="utf-8")
    rows = T5TextEmbedder(checkpoint=str(tmp_path), text_file=str(text)).embedded_inputs(None).rows
    ids = torch.tensor([3, 4, 5, 6, 7, 8, 9, 3, 4])
    assert torch.equal(rows, saved.shared.weight.detach()[ids])
