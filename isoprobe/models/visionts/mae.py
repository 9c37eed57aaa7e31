"""The masked autoencoder VisionTS reads a series with: a ViT encoder and a lighter ViT decoder,
as facebook's MAE (He et al. 2022, ``models_mae.MaskedAutoencoderViT``) builds them and as the
``visionts`` package (Chen et al. 2024) runs them, written here without timm.

The image (``[B, 3, S, S]``) is cut into ``(S / p)^2`` patches of ``p x p`` pixels in raster order
(row by row); each patch is embedded by a ``p``-strided convolution (``patch_embed.proj``) plus a
fixed 2-D sine-cosine position embedding (``pos_embed``). Only the *visible* patches, the left
``visible_columns`` columns of every row, enter the encoder, after a ``cls`` token; the decoder
embeds the encoder's output, puts its learned ``mask_token`` at every hidden patch, adds its own
position embedding and predicts every patch's ``p x p x 3`` pixels (``decoder_pred``).

Each block is a pre-norm transformer block (timm's ``Block``: ``x + attn(norm1(x))``, then
``x + mlp(norm2(x))``, LayerNorm eps 1e-6, exact GELU). The published weights fuse the query, key
and value projections into one ``attn.qkv`` layer ``[3 D, D]`` (rows: q, then k, then v); here
they are three layers ``attn.q``, ``attn.k``, ``attn.v`` (:func:`from_published` and
:func:`to_published` convert the state dict both ways), so that the rank measures, compression and
LoRA see each projection as its own ``nn.Linear``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

#: LayerNorm epsilon of every published MAE (``partial(nn.LayerNorm, eps=1e-6)``)
NORM_EPS = 1e-6


@dataclass(frozen=True)
class MAEShape:
    """The architecture: image side and patch side in pixels, encoder and decoder width, depth
    and heads, and the MLP's hidden width as a multiple of the block's width."""

    image_size: int
    patch_size: int
    width: int
    depth: int
    heads: int
    decoder_width: int
    decoder_depth: int
    decoder_heads: int
    mlp_ratio: float = 4.0

    def __post_init__(self) -> None:
        if self.image_size % self.patch_size:
            raise ValueError(
                f"image_size={self.image_size} must be a multiple of patch_size={self.patch_size}"
            )
        for width, heads in ((self.width, self.heads), (self.decoder_width, self.decoder_heads)):
            if width % heads:
                raise ValueError(f"a width of {width} does not split into {heads} heads")
        if self.width % 4 or self.decoder_width % 4:
            raise ValueError("the 2-D sine-cosine position embedding needs widths divisible by 4")

    @property
    def grid(self) -> int:
        """Patches per image side."""
        return self.image_size // self.patch_size

    def as_dict(self) -> dict:
        return asdict(self)


def sincos_position_embedding(width: int, grid: int) -> Tensor:
    """MAE's fixed 2-D sine-cosine embedding ``[1 + grid^2, width]`` (a zero row for ``cls``):
    half the channels encode the patch's row, half its column, each as ``sin(pos w), cos(pos w)``
    with ``w_i = 10000^(-i / (width / 4))`` (``util/pos_embed.py`` of the MAE code)."""
    quarter = width // 4
    omega = 1.0 / 10000 ** (torch.arange(quarter, dtype=torch.float64) / quarter)
    rows, columns = torch.meshgrid(
        torch.arange(grid, dtype=torch.float64),
        torch.arange(grid, dtype=torch.float64),
        indexing="ij",
    )

    def encode(position: Tensor) -> Tensor:
        angles = position.reshape(-1, 1) * omega.reshape(1, -1)
        return torch.cat([angles.sin(), angles.cos()], dim=1)

    # the MAE code's meshgrid puts the column first and encodes it in the first half
    table = torch.cat([encode(columns), encode(rows)], dim=1)
    return torch.cat([torch.zeros(1, width, dtype=torch.float64), table]).float()


class PatchEmbedding(nn.Module):
    """``[B, C, S, S]`` -> ``[B, (S / p)^2, D]``: a ``p``-strided convolution, patches in raster
    order."""

    def __init__(self, patch_size: int, width: int, channels: int = 3) -> None:
        super().__init__()
        self.proj = nn.Conv2d(channels, width, kernel_size=patch_size, stride=patch_size)

    def forward(self, image: Tensor) -> Tensor:
        return self.proj(image).flatten(2).transpose(1, 2)


class Attention(nn.Module):
    """Multi-head self-attention with separate ``q``, ``k``, ``v`` projections and ``proj``; its
    output (after ``proj``, before the residual add) is the probe's ``attention`` site."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(width, width)
        self.k = nn.Linear(width, width)
        self.v = nn.Linear(width, width)
        self.proj = nn.Linear(width, width)

    def forward(self, x: Tensor) -> Tensor:
        batch, tokens, width = x.shape

        def heads(projection: nn.Module) -> Tensor:
            return projection(x).view(batch, tokens, self.heads, -1).transpose(1, 2)

        mixed = F.scaled_dot_product_attention(heads(self.q), heads(self.k), heads(self.v))
        return self.proj(mixed.transpose(1, 2).reshape(batch, tokens, width))


class FeedForward(nn.Module):
    """``fc2(gelu(fc1(x)))``."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, hidden)
        self.fc2 = nn.Linear(hidden, width)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    """A pre-norm transformer block: ``x + attn(norm1(x))``, then ``x + mlp(norm2(x))``."""

    def __init__(self, width: int, heads: int, mlp_ratio: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width, eps=NORM_EPS)
        self.attn = Attention(width, heads)
        self.norm2 = nn.LayerNorm(width, eps=NORM_EPS)
        self.mlp = FeedForward(width, int(width * mlp_ratio))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class EncoderInput(nn.Module):
    """The learned ``cls_token`` (plus its position embedding) before the embedded patches: the
    tensor the first encoder block reads, the output of a module of its own for the probe's
    hooks."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.cls_token = nn.Parameter(torch.zeros(1, 1, width))

    def forward(self, patches: Tensor, cls_position: Tensor) -> Tensor:
        cls = (self.cls_token + cls_position).expand(patches.shape[0], -1, -1)
        return torch.cat([cls, patches], dim=1)


class MaskedAutoencoder(nn.Module):
    """The MAE of :class:`MAEShape` (module docstring); parameter names are the published ones
    except the split ``attn.q/k/v`` and ``encoder_input.cls_token`` (:func:`from_published`)."""

    def __init__(self, shape: MAEShape) -> None:
        super().__init__()
        self.shape = shape
        grid, width, decoder_width = shape.grid, shape.width, shape.decoder_width
        self.patch_embed = PatchEmbedding(shape.patch_size, width)
        self.register_buffer("pos_embed", sincos_position_embedding(width, grid).unsqueeze(0))
        self.encoder_input = EncoderInput(width)
        self.blocks = nn.ModuleList(
            Block(width, shape.heads, shape.mlp_ratio) for _ in range(shape.depth)
        )
        self.norm = nn.LayerNorm(width, eps=NORM_EPS)
        self.decoder_embed = nn.Linear(width, decoder_width)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, decoder_width))
        self.register_buffer(
            "decoder_pos_embed", sincos_position_embedding(decoder_width, grid).unsqueeze(0)
        )
        self.decoder_blocks = nn.ModuleList(
            Block(decoder_width, shape.decoder_heads, shape.mlp_ratio)
            for _ in range(shape.decoder_depth)
        )
        self.decoder_norm = nn.LayerNorm(decoder_width, eps=NORM_EPS)
        self.decoder_pred = nn.Linear(decoder_width, shape.patch_size**2 * 3)
        self._initialise()

    def _initialise(self) -> None:
        """MAE's initialisation: Xavier-uniform linear layers (the patch convolution as one),
        zero biases, unit LayerNorms, ``cls`` and ``mask_token`` ~ N(0, 0.02^2)."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        conv = self.patch_embed.proj.weight
        nn.init.xavier_uniform_(conv.data.view(conv.shape[0], -1))
        nn.init.normal_(self.encoder_input.cls_token, std=0.02)
        nn.init.normal_(self.mask_token, std=0.02)

    def visible_positions(self, visible_columns: int) -> Tensor:
        """Raster indices of the visible patches: the first ``visible_columns`` of every row."""
        grid = self.shape.grid
        rows = torch.arange(grid).repeat_interleave(visible_columns) * grid
        return rows + torch.arange(visible_columns).repeat(grid)

    def encode(self, image: Tensor, visible: Tensor) -> Tensor:
        """``[B, 1 + V, D]``: ``cls`` and the ``visible`` patches through the encoder."""
        patches = (self.patch_embed(image) + self.pos_embed[:, 1:])[:, visible.to(image.device)]
        x = self.encoder_input(patches, self.pos_embed[:, :1])
        for block in self.blocks:
            x = block(x)
        return self.norm(x)

    def decode(self, latent: Tensor, visible: Tensor) -> Tensor:
        """``[B, (S / p)^2, p^2 3]``: every patch's pixels predicted from the encoder's output,
        the hidden patches from ``mask_token``."""
        x = self.decoder_embed(latent)
        batch, width = x.shape[0], x.shape[-1]
        patches = self.mask_token.expand(batch, self.shape.grid**2, width).clone()
        patches[:, visible.to(x.device)] = x[:, 1:]
        x = torch.cat([x[:, :1], patches], dim=1) + self.decoder_pos_embed
        for block in self.decoder_blocks:
            x = block(x)
        return self.decoder_pred(self.decoder_norm(x))[:, 1:]

    def unpatchify(self, patches: Tensor) -> Tensor:
        """``[B, (S / p)^2, p^2 3]`` -> ``[B, 3, S, S]`` (pixels of a patch: row, column,
        channel)."""
        grid, p = self.shape.grid, self.shape.patch_size
        x = patches.reshape(patches.shape[0], grid, grid, p, p, 3)
        return torch.einsum("nhwpqc->nchpwq", x).reshape(patches.shape[0], 3, grid * p, grid * p)

    def forward(self, image: Tensor, visible_columns: int) -> Tensor:
        """The reconstructed image ``[B, 3, S, S]`` from the visible left columns of ``image``."""
        visible = self.visible_positions(visible_columns)
        return self.unpatchify(self.decode(self.encode(image, visible), visible))


QKV = ("q", "k", "v")
#: the published name of the class token, and isoprobe's
CLS_PUBLISHED, CLS_HERE = "cls_token", "encoder_input.cls_token"


def from_published(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """A published state dict in isoprobe's names: every ``attn.qkv.{weight,bias}`` split into
    ``attn.{q,k,v}.*`` (rows 0..D-1 are the query's, D..2D-1 the key's, the rest the value's,
    as timm's ``Attention`` reshapes them) and ``cls_token`` under :data:`CLS_HERE`."""
    here = {}
    for key, value in state.items():
        stem, _, leaf = key.rpartition(".")
        if stem.endswith(".attn.qkv"):
            owner = stem.removesuffix(".qkv")
            for part, chunk in zip(QKV, value.chunk(3, dim=0), strict=True):
                here[f"{owner}.{part}.{leaf}"] = chunk.clone()
        else:
            here[CLS_HERE if key == CLS_PUBLISHED else key] = value
    return here


def to_published(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The inverse of :func:`from_published`: the published names and fused ``qkv``."""
    published = {}
    for key, value in state.items():
        stem, _, leaf = key.rpartition(".")
        owner, _, part = stem.rpartition(".")
        if owner.endswith(".attn") and part in QKV:
            if part == "q":
                parts = [state[f"{owner}.{p}.{leaf}"] for p in QKV]
                published[f"{owner}.qkv.{leaf}"] = torch.cat(parts, dim=0)
        else:
            published[CLS_PUBLISHED if key == CLS_HERE else key] = value
    return published


def expected_tensors(shape: MAEShape) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor a published checkpoint of ``shape`` holds."""
    with torch.device("meta"):
        model = MaskedAutoencoder(shape)
    return {key: tuple(value.shape) for key, value in to_published(model.state_dict()).items()}
