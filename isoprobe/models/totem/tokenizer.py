"""TOTEM's tokenizer (Talukder, Yue & Gkioxari 2024, "TOTEM: TOkenized Time series EMbeddings"),
isoprobe's own implementation of its VQ-VAE: a 1-D convolutional encoder that shortens the
series by the compression factor, a vector quantiser that maps each latent step to the nearest
of ``num_embeddings`` codewords, and a transposed-convolution decoder. The series is first
normalised per window (RevIN without affine weights: mean and standard deviation over time).

The embedded input of the rank-structure paper (§2, table 1: a quantisation-based embedding) is
the codeword each token is mapped to: :meth:`TotemTokenizer.embed`.

Architecture as the official ``forecasting/lib/models/vqvae.py`` (SaberaTalukder/TOTEM at
b6403d5) for compression factors 4, 8 and 16: stride-2 convolutions (kernel 4, padding 1; the
first two widen 1 -> h/2 -> h, any further ones keep h) each followed by ReLU, a kernel-3
convolution, a residual stack (units ``relu(x) + conv1(relu(conv3(relu(x))))`` without biases, then
ReLU), and a 1x1 convolution to the code width; the decoder mirrors it with transposed
convolutions. Its weights load from the official whole-module pickles through
:mod:`isoprobe.models.totem.checkpoint`, which maps the official parameter names onto these.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

#: the compression factors whose layers are all stride-2 (the official code also has 12)
COMPRESSION_FACTORS = {4: 2, 8: 3, 16: 4}
#: RevIN's variance floor (official ``RevIN(eps=1e-5)``)
REVIN_EPS = 1e-5


@dataclass(frozen=True)
class TotemConfig:
    """The official ``vqvae_config`` fields (defaults: the published generalist tokenizer's,
    ``forecasting/scripts/all.json``)."""

    block_hidden_size: int = 128
    num_residual_layers: int = 2
    res_hidden_size: int = 64
    embedding_dim: int = 64
    num_embeddings: int = 256
    commitment_cost: float = 0.25
    compression_factor: int = 4

    def __post_init__(self) -> None:
        if self.compression_factor not in COMPRESSION_FACTORS:
            raise ValueError(
                f"TOTEM compression_factor={self.compression_factor} is not built: choose one "
                f"of {sorted(COMPRESSION_FACTORS)}"
            )

    @property
    def halvings(self) -> int:
        return COMPRESSION_FACTORS[self.compression_factor]


class ResidualUnit(nn.Module):
    """``relu(x) + conv1(relu(conv3(relu(x))))``: the official unit writes
    ``x + self._block(x)`` with an in-place ReLU first in the block, which rectifies ``x``
    itself before the sum reads it, so the skip carries ``relu(x)``, not ``x``."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.conv_in = nn.Conv1d(width, hidden, kernel_size=3, padding=1, bias=False)
        self.conv_out = nn.Conv1d(hidden, width, kernel_size=1, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        x = F.relu(x)
        return x + self.conv_out(F.relu(self.conv_in(x)))


class ResidualStack(nn.Module):
    def __init__(self, width: int, hidden: int, layers: int) -> None:
        super().__init__()
        self.units = nn.ModuleList(ResidualUnit(width, hidden) for _ in range(layers))

    def forward(self, x: Tensor) -> Tensor:
        for unit in self.units:
            x = unit(x)
        return F.relu(x)


def _widths(config: TotemConfig) -> list[int]:
    """Channel widths along the encoder's stride-2 convolutions: 1, h/2, h, h, ..."""
    h = config.block_hidden_size
    return [1, h // 2] + [h] * (config.halvings - 1)


class TotemEncoder(nn.Module):
    def __init__(self, config: TotemConfig) -> None:
        super().__init__()
        widths, h = _widths(config), config.block_hidden_size
        self.downsample = nn.ModuleList(
            nn.Conv1d(a, b, kernel_size=4, stride=2, padding=1)
            for a, b in zip(widths[:-1], widths[1:], strict=True)
        )
        self.mix = nn.Conv1d(h, h, kernel_size=3, padding=1)
        self.residual = ResidualStack(h, config.res_hidden_size, config.num_residual_layers)
        self.to_code = nn.Conv1d(h, config.embedding_dim, kernel_size=1)

    def forward(self, series: Tensor) -> Tensor:
        """[B, T] -> latent [B, embedding_dim, T / compression_factor]."""
        x = series.unsqueeze(1)
        for conv in self.downsample:
            x = F.relu(conv(x))
        return self.to_code(self.residual(self.mix(x)))


class TotemDecoder(nn.Module):
    def __init__(self, config: TotemConfig) -> None:
        super().__init__()
        widths, h = _widths(config), config.block_hidden_size
        self.from_code = nn.Conv1d(config.embedding_dim, h, kernel_size=3, padding=1)
        self.residual = ResidualStack(h, config.res_hidden_size, config.num_residual_layers)
        reverse = widths[::-1]
        self.upsample = nn.ModuleList(
            nn.ConvTranspose1d(a, b, kernel_size=4, stride=2, padding=1)
            for a, b in zip(reverse[:-1], reverse[1:], strict=True)
        )

    def forward(self, codes: Tensor) -> Tensor:
        """[B, embedding_dim, L] -> series [B, L * compression_factor]."""
        x = self.residual(self.from_code(codes))
        for i, conv in enumerate(self.upsample):
            x = conv(x)
            if i < len(self.upsample) - 1:
                x = F.relu(x)
        return x.squeeze(1)


class TotemQuantizer(nn.Module):
    """The codebook: each latent step goes to its nearest codeword (squared Euclidean)."""

    def __init__(self, config: TotemConfig) -> None:
        super().__init__()
        self.codebook = nn.Embedding(config.num_embeddings, config.embedding_dim)
        bound = 1.0 / config.num_embeddings
        nn.init.uniform_(self.codebook.weight, -bound, bound)

    def forward(self, latent: Tensor) -> Tensor:
        """Code ids [B, L] of latent [B, D, L]."""
        z = latent.transpose(1, 2)
        codes = self.codebook.weight
        distances = (
            z.pow(2).sum(-1, keepdim=True) + codes.pow(2).sum(-1) - 2 * z @ codes.T
        )  # the official expansion of |z - e|², so ties break identically
        return distances.argmin(dim=-1)


class TotemTokenizer(nn.Module):
    """TOTEM's VQ-VAE: :meth:`tokenize`, :meth:`embed`, :meth:`reconstruct`, :meth:`loss`."""

    def __init__(self, config: TotemConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = TotemEncoder(config)
        self.quantizer = TotemQuantizer(config)
        self.decoder = TotemDecoder(config)

    def check_length(self, series: Tensor) -> None:
        factor = self.config.compression_factor
        if series.dim() != 2 or series.shape[1] % factor:
            raise ValueError(
                f"TOTEM tokenizes [B, T] series with T a multiple of its compression factor "
                f"{factor}; got shape {tuple(series.shape)}"
            )

    @staticmethod
    def normalise(series: Tensor) -> Tensor:
        """RevIN without affine weights: each window minus its mean over its standard deviation
        (population, with the variance floor ``REVIN_EPS``)."""
        mean = series.mean(dim=1, keepdim=True)
        std = torch.sqrt(series.var(dim=1, keepdim=True, unbiased=False) + REVIN_EPS)
        return (series - mean) / std

    def tokenize(self, series: Tensor) -> Tensor:
        """Code ids [B, T / compression_factor] of normalised series [B, T]."""
        self.check_length(series)
        return self.quantizer(self.encoder(series))

    def embed(self, series: Tensor) -> Tensor:
        """The embedded input: each token's codeword, [B, T / compression_factor, D]."""
        return self.quantizer.codebook(self.tokenize(series))

    def reconstruct(self, series: Tensor) -> Tensor:
        """The decoder's series [B, T] from the codewords of normalised series [B, T]."""
        return self.decoder(self.embed(series).transpose(1, 2))

    def loss(self, series: Tensor) -> Tensor:
        """The official training objective on normalised series: reconstruction MSE plus the
        codebook loss and ``commitment_cost`` times the commitment loss, gradients passed
        through the quantiser straight-through (van den Oord et al. 2017)."""
        self.check_length(series)
        latent = self.encoder(series)
        quantized = self.quantizer.codebook(self.quantizer(latent)).transpose(1, 2)
        codebook = F.mse_loss(quantized, latent.detach())
        commitment = F.mse_loss(latent, quantized.detach())
        straight_through = latent + (quantized - latent).detach()
        reconstruction = F.mse_loss(self.decoder(straight_through), series)
        return reconstruction + codebook + self.config.commitment_cost * commitment
