"""The systems of figure 2 that embed a time series other than through a ``ForecastModule``:
TOTEM's tokenizer, and the baselines that embed their own modality, a T5 language model reading
English prose and a ViT reading images. Each gives its embedded inputs Ξ [n tokens, d]: the
embedding applied to its inputs, before any block.

Offline, the default, each is built from scratch as its official code initialises it (the paper's
point for these baselines is the rank of the embedding, which a random one already has; its
trained one is reached online). The inputs that ship with the environment:

- text: no public-domain English prose ships in any installed package (Project Gutenberg's texts
  are only named in licence files); the default is the English prose of scikit-learn's data set
  descriptions (``sklearn/datasets/descr/*.rst``, BSD-3-Clause), read where it is installed and
  never copied. ``text_file=<path>`` reads another, e.g. Project Gutenberg's *A Tale of Two
  Cities* (ebook 98), the paper's text;
- images: scikit-learn's two sample photographs (``load_sample_images``, which needs Pillow), cut
  into random 224 x 224 crops; the paper samples 1000 CIFAR-10 images.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from isoprobe.models.checkpoints import (
    CheckpointError,
    check_weights_fit,
    load_pretrained,
    resolve_checkpoint,
)
from isoprobe.models.totem.checkpoint import load_totem_tokenizer
from isoprobe.models.totem.tokenizer import TotemConfig, TotemTokenizer
from isoprobe.spectra.embedders import EmbeddedInputs

#: the words and the punctuation of English prose, a token each (the scratch T5's vocabulary)
WORD = re.compile(r"\w+|[^\w\s]")
#: google/vit-base-patch16-224's preprocessor: pixels to [0, 1], then (x - 0.5) / 0.5
VIT_MEAN, VIT_STD = 0.5, 0.5


def _checkpoint(checkpoint: str, hub_id: str, what: str) -> Any:
    """``scratch``, a local Hugging Face directory or a hub id (no weights ship for ``what``)."""
    if checkpoint in ("bundled", "auto"):
        raise CheckpointError(
            f"isoprobe ships no {what} weights: use checkpoint=scratch (offline), "
            f"checkpoint={hub_id} (online) or a local Hugging Face directory"
        )
    return resolve_checkpoint(checkpoint, hub_id, "")


class TotemEmbedder:
    """TOTEM's embedded inputs: each token's codeword (:meth:`TotemTokenizer.embed`) of every
    series, normalised per window as TOTEM's pipeline does (RevIN). ``checkpoint``: ``scratch``
    (the official initialisation, shape ``config``, drawn with ``seed``) or the path of a
    published tokenizer file (read by
    :func:`~isoprobe.models.totem.checkpoint.load_totem_tokenizer`)."""

    modality = "time series"

    def __init__(
        self, checkpoint: str = "scratch", config: dict | None = None, seed: int = 0
    ) -> None:
        if checkpoint == "scratch":
            torch.manual_seed(seed)
            self.tokenizer = TotemTokenizer(TotemConfig(**(config or {}))).eval()
        else:
            self.tokenizer = load_totem_tokenizer(checkpoint)
        self.source = checkpoint

    def embedded_inputs(self, series: Tensor) -> EmbeddedInputs:
        factor = self.tokenizer.config.compression_factor
        usable = series[:, : series.shape[1] - series.shape[1] % factor]
        with torch.no_grad():
            embedded = self.tokenizer.embed(self.tokenizer.normalise(usable))
        index = torch.arange(series.shape[0]).repeat_interleave(embedded.shape[1])
        return EmbeddedInputs(embedded.reshape(-1, embedded.shape[-1]), index)


def default_text() -> str:
    """The English prose that ships here: scikit-learn's data set descriptions (module
    docstring)."""
    folder = resources.files("sklearn.datasets") / "descr"
    files = sorted(f for f in folder.iterdir() if f.name.endswith(".rst"))
    return "\n".join(f.read_text(encoding="utf-8") for f in files)


def read_text(text_file: str | None) -> str:
    if text_file is None:
        return default_text()
    path = Path(text_file).expanduser()
    if not path.is_file():
        raise CheckpointError(f"text_file={text_file!r} does not exist: give a UTF-8 text file")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise CheckpointError(f"text_file={text_file!r} is not UTF-8 text ({err})") from None


class T5TextEmbedder:
    """A T5 language model reading English prose: its input embedding (``shared``) applied to
    the text's first ``max_tokens`` tokens. Scratch: T5's own initialisation (normal(0, 1)) of
    a vocabulary of the text's words and punctuation (:data:`WORD`), ``d_model`` wide (512:
    t5-small's); a hub id (``google-t5/t5-small``) or local directory: its weights and its
    SentencePiece tokenizer."""

    modality = "text"

    def __init__(
        self,
        checkpoint: str = "scratch",
        hub_id: str = "google-t5/t5-small",
        text_file: str | None = None,
        max_tokens: int = 20000,
        d_model: int = 512,
        seed: int = 0,
    ) -> None:
        from transformers import AutoTokenizer, T5Config, T5EncoderModel

        resolved = _checkpoint(checkpoint, hub_id, "T5")
        text = read_text(text_file)
        if resolved.kind == "scratch":
            words = WORD.findall(text)[:max_tokens]
            vocabulary = {word: i for i, word in enumerate(dict.fromkeys(words))}
            torch.manual_seed(seed)
            config = T5Config(vocab_size=len(vocabulary), d_model=d_model, num_layers=1)
            self.embedding = T5EncoderModel(config).get_input_embeddings()
            self.ids = torch.tensor([vocabulary[w] for w in words])
        else:
            source = resolved.location
            model, info = load_pretrained(T5EncoderModel, source)
            check_weights_fit(info, source, missing=info["missing_keys"], unexpected=[])
            tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=False)
            self.embedding = model.get_input_embeddings()
            self.ids = torch.tensor(tokenizer(text)["input_ids"][:max_tokens])
        self.source = resolved.describe()

    def embedded_inputs(self, series: Tensor) -> EmbeddedInputs:
        with torch.no_grad():
            return EmbeddedInputs(self.embedding(self.ids))


def image_crops(count: int, size: int, seed: int) -> Tensor:
    """``count`` random ``size`` x ``size`` crops [count, 3, size, size] in [0, 1] of
    scikit-learn's sample photographs."""
    try:
        from sklearn.datasets import load_sample_images

        photographs = load_sample_images().images
        images = [torch.from_numpy(image.copy()).permute(2, 0, 1) for image in photographs]
    except ImportError as err:
        raise CheckpointError(
            f"the image baseline reads scikit-learn's sample images, which need Pillow ({err})"
        ) from None
    generator = torch.Generator().manual_seed(seed)
    crops = []
    for _ in range(count):
        image = images[int(torch.randint(len(images), (1,), generator=generator))]
        top = int(torch.randint(image.shape[1] - size + 1, (1,), generator=generator))
        left = int(torch.randint(image.shape[2] - size + 1, (1,), generator=generator))
        crops.append(image[:, top : top + size, left : left + size])
    return torch.stack(crops).float() / 255.0


class VitImageEmbedder:
    """A ViT reading images: its embeddings (patch projection plus position embeddings, what
    its first block reads) at the image patches, the [CLS] token left out, over ``images``
    random crops. Scratch: ViT's own initialisation at vit-base-patch16-224's shape
    (``hidden_size`` 768 wide, 16 x 16 patches of 224 x 224 images); a hub id
    (``google/vit-base-patch16-224``) or a local directory: its weights."""

    modality = "image"

    def __init__(
        self,
        checkpoint: str = "scratch",
        hub_id: str = "google/vit-base-patch16-224",
        images: int = 64,
        batch_size: int = 16,
        hidden_size: int = 768,
        seed: int = 0,
    ) -> None:
        from transformers import ViTConfig, ViTModel

        resolved = _checkpoint(checkpoint, hub_id, "ViT")
        if resolved.kind == "scratch":
            torch.manual_seed(seed)
            config = ViTConfig(num_hidden_layers=1, hidden_size=hidden_size, num_attention_heads=1)
            model = ViTModel(config, add_pooling_layer=False)
        else:
            source = resolved.location
            model, info = load_pretrained(ViTModel, source, add_pooling_layer=False)
            embedding_missing = [k for k in info["missing_keys"] if k.startswith("embeddings.")]
            check_weights_fit(info, source, missing=embedding_missing, unexpected=[])
        self.embeddings = model.embeddings.eval()
        size = model.config.image_size
        self.pixels = (image_crops(images, size, seed) - VIT_MEAN) / VIT_STD
        self.batch_size = batch_size
        self.source = resolved.describe()

    def embedded_inputs(self, series: Tensor) -> EmbeddedInputs:
        with torch.no_grad():
            parts = [
                self.embeddings(self.pixels[i : i + self.batch_size])[:, 1:]
                for i in range(0, self.pixels.shape[0], self.batch_size)
            ]
        embedded = torch.cat(parts)
        return EmbeddedInputs(embedded.reshape(-1, embedded.shape[-1]))
