"""The base LightningModule every forecaster wrapper derives from.

It owns what is the same for all models: the training/validation/test loop, the optimiser built
from a Hydra ``_partial_`` config, forecast metrics (accumulated with distributed-safe sums), the
mapping of forecasts back to the data's scale and the saved hyperparameters. A wrapper provides
the model contract, every part of which ``tests/models/test_contract.py`` checks for every
``configs/model/*.yaml``:

- :meth:`loss` (its own training objective) and :meth:`forecast` (quantiles in the batch's
  scale);
- its facts, class attributes every wrapper declares in its own class body: :attr:`samples`
  (whether it forecasts by drawing sample paths), :attr:`lagged` (whether its tokens carry lag
  features) and :attr:`stacks` (its stacks of blocks in the order it runs them). A fact its
  configuration decides (PatchTST's ``loss``, the LLM's ``arch``) is declared for the
  default configuration and set again on the instance in ``__init__``;
- :meth:`embed_module`, :meth:`stack_blocks` and :meth:`self_attention_module`, from which the
  contract builds :meth:`probe_layers` per probe site and :meth:`probe_layer_identities`
  (each layer's stack, index, depth and site as a :class:`~isoprobe.models.layers.Layer`);
  :meth:`token_masks` (which positions are real tokens, for
  all probed layers at once), :meth:`probe_forward` (one pass that runs every probed module
  exactly once) and :meth:`training_token_masks` (the same tokens among the positions of
  :meth:`loss`'s forward, which the isotropy regulariser penalises);
- :meth:`attention_weights` (the Q, K, V, O matrices of every block's self-attention, for the
  rank measures and compression) and, for an encoder-decoder, :meth:`cross_attention_weights`
  (those of every decoder block's cross-attention; ``{}``, the default, for a model without
  one). Records and reports name a cross-attention ``<block>.cross`` (:func:`cross_name`);
- :meth:`input_modules`, :meth:`head_modules` and :meth:`feed_forward_modules` (what
  ``model.adapt=frozen_backbone`` and ``head_only`` train, what ``model.lora.mlp`` adapts) and
  :meth:`lora_target_modules` (the layers ``model.adapt=lora`` adapts; see
  :mod:`isoprobe.models.adaptation`);
- :meth:`export` and ``resolved_checkpoint`` (where the weights came from);
- :meth:`training_memory_bytes` and :meth:`forecast_memory_bytes` (the memory check).

The batch (:data:`Batch`) always holds ``context`` [B, C] (NaN = missing, left padding),
``target`` [B, H], ``loc`` and ``scale`` [B]; a data module may add further keys (``series_index``,
``window_index``, covariates) that a model reads if it knows them. Facts about the data set as a
whole (its frequency ``freq``, the season) come to the constructor.

What the contract requires of these methods (each point a test of the contract):

- **Scale equivariance.** The windows come unscaled by default (``data.scaling=none``), so a
  model scales each window itself: multiplying a window's context by c > 0 multiplies its
  forecast (median and quantiles) by c.
- **Gaps.** NaN may stand anywhere in ``context`` and ``target``: :meth:`loss` stays finite and
  so do its gradients (missing target values are left out of the objective, not trained as
  zeros), and :meth:`forecast` stays finite. The loss reads every observed target step (moving
  one alone changes it) and no missing one (filling one alone with 0 or the context's mean
  changes it, as a term it left out now counts).
- **``embed``** is exactly the tensor the first block reads, every position of it
  (``test_embed_is_what_the_first_block_reads`` compares the two with ``torch.equal``): the value
  embeddings plus whatever the model adds or puts in before its first block: absolute position
  embeddings where it has them (GPT-2's: ``embed`` is ``transformer.drop``'s output;
  PatchTST's: ``encoder.positional_encoder``'s), a frequency embedding (TimesFM), special
  tokens (REG, [MASK], forecast placeholders). Positions that the attention applies itself,
  rotary (Chronos-2, Moirai, Lag-Llama) or as a relative bias (Chronos-T5, Chronos-Bolt, the
  T5 LLM), are in no layer's tokens, so there is nothing to add for them. Tap the module whose
  output the first block reads, or one whose output tensor the model then adds to in place
  before that block: the hooks keep the output tensor itself and read its rows after
  :meth:`probe_forward` returns (TimesFM's ``input_ff_layer`` output gets its frequency
  embedding so). A block's output is the next block's input, so the layers of a stack are
  measured at the same positions.
- **Real tokens.** :meth:`token_masks` marks a position real exactly when the token there
  carries at least one observed value of its own step(s): not left padding, a missing value
  (or an all-missing patch), EOS, REG, [MASK], a decoder start token, a forecast placeholder
  nor a separator between values. Every layer of a stack has the mask of the tokens it reads:
  a decoder position is real where its (teacher-forced, shifted) input is an observed target
  value. A token that also carries earlier steps' values as lag features (Lag-Llama: one token
  per step, its features the values at its lags, up to max(lags_seq) steps back) is masked by
  its own step alone: it is real exactly when its own step is observed, whatever its lags hold
  (observed, missing or left padding), and not real when its own step is missing even though
  its lags carry observed values; those values are real at their own steps' tokens, so none
  is counted twice and none is left out. At the first block of every stack, each position
  marked real changes when the window's observed values move to neighbouring steps: a
  placeholder (VisionTS's hidden patches in its decoder, a decoder start token) reads the
  window only inside the block, so at its input it is the constant it is. A one-position
  decoder (Chronos-Bolt's learned query, real where the window holds an observed value: the
  window's summary the head reads) is read at that block's output, after its cross-attention.
- **Training tokens.** :meth:`training_token_masks` selects, from each layer's output in
  :meth:`loss` (a module that runs several times there, as TimesFM's decoding steps, at its
  first run), exactly the tokens :meth:`token_masks` selects from :meth:`probe_forward`'s, in
  the same order: the regulariser penalises the tokens the probe measures. The default,
  :meth:`token_masks` itself, holds where the loss's first pass reads the positions the probe
  pass does; a loss that reads more (GPT-2's context followed by its target) overrides it.
- **Samples.** A model that declares :attr:`samples` (a ``num_samples`` argument) returns
  ``Forecast.samples`` [B, num_samples, H], and its quantiles are those samples' empirical
  quantiles; one that does not returns no samples.
- **Lags.** A model that declares :attr:`lagged` has tokens at missing steps that still carry
  observed values (its lags'); one that does not carries observed values exactly in the tokens
  :meth:`token_masks` marks real.
- **Memory.** Each estimate lies within a factor of 4 of the peak it estimates, measured on the
  CPU (the weights plus the resident memory one step or one forecast adds).
- **What each method names is what the model runs.** Within a stack, block ``i`` runs before
  block ``i + 1`` and its output is block ``i + 1``'s input. Each projection of
  :meth:`attention_weights` acts in its role: a query perturbed at one token changes only that
  token's attention output, a key or a value also others, and ``o``'s module writes the
  attention sub-layer's output. :meth:`head_modules` map the last block's output to the
  forecast (the loss reaches them with that output cut from the graph), all of them: every
  parameter the loss reaches past that cut is in them, except the blocks' (a router's balance
  loss), the input modules' (a tied head) and the norms' (the final norm); ``embed`` depends on
  the parameters of :meth:`input_modules` and no others. :meth:`forecast` reads every observed
  context step: swapping two neighbouring observed values changes the first block's input.
- **Long horizons.** A horizon past what one call forecasts (the largest head, the output
  patches of one pass) is forecast whole and finite; a model that rolls it out joins the pieces
  in the order it made them and feeds each call the last one's output: the first steps of the
  long forecast are exactly the forecast at a shorter horizon that starts with the same call
  (the same windows and seed), and no later stretch repeats the first steps.
- **Weights.** Every model builds from scratch (``model.checkpoint=scratch``, the shape given by
  ``model.sizes``), which is all the contract tests need. Bundled weights
  (``isoprobe/models/bundled/<bundled_name>``, listed in ``checkpoints.SHIPPED``) are optional;
  for a model without them (:func:`isoprobe.models.checkpoints.resolve_checkpoint`):
  ``checkpoint=bundled`` fails at once with a ``CheckpointError`` saying isoprobe ships no
  checkpoint of that name and to use ``scratch``, a local directory or a hub id instead;
  ``checkpoint=auto`` loads the hub id when it is in the Hugging Face cache or the hub is
  reachable, and otherwise (offline, not cached) fails with that same error instead of falling
  back to bundled weights; ``scratch``, a local directory and a hub id work as for any model.
  Such a model's config should default to ``checkpoint: scratch`` where it must run offline.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import lightning as L
import torch
from torch import Tensor, nn
from transformers.pytorch_utils import Conv1D

from isoprobe.evaluation import ForecastMetrics
from isoprobe.models.checkpoints import ResolvedCheckpoint
from isoprobe.models.layers import EMBED, Layer, stack_layers
from isoprobe.models.layers import PROBE_SITES as PROBE_SITES
from isoprobe.models.layers import check_probe_site as check_probe_site

Batch = dict[str, Tensor]
DEFAULT_QUANTILES = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


@dataclass(frozen=True)
class Forecast:
    """Quantile forecasts [B, Q, H] at ``levels``, the median [B, H], optional samples [B, S, H]."""

    quantiles: Tensor
    levels: tuple[float, ...]
    median: Tensor
    samples: Tensor | None = None

    @classmethod
    def from_samples(
        cls,
        samples: Tensor,
        levels: Sequence[float],
        median: Tensor | None = None,
        ignore_nan: bool = False,
    ) -> Forecast:
        """The empirical quantiles [B, Q, H] at ``levels`` of ``samples`` [B, S, H] (linear
        interpolation, ``torch.quantile``) and, unless a ``median`` is given, their 0.5
        quantile as the median. ``ignore_nan``: ``torch.nanquantile`` instead, which leaves NaN
        only where a window's step has no sample at all."""
        quantile = torch.nanquantile if ignore_nan else torch.quantile
        at = torch.tensor(levels, dtype=samples.dtype, device=samples.device)
        quantiles = quantile(samples, at, dim=1).permute(1, 0, 2)
        if median is None:
            median = quantile(samples, 0.5, dim=1)
        return cls(quantiles, levels, median, samples)

    def rescaled(self, loc: Tensor, scale: Tensor) -> Forecast:
        """The forecast in the data's original units, undoing per-window ``(x - loc) / scale``."""

        def undo(x: Tensor) -> Tensor:
            shape = (-1,) + (1,) * (x.dim() - 1)
            return x * scale.view(shape) + loc.view(shape)

        samples = None if self.samples is None else undo(self.samples)
        return Forecast(undo(self.quantiles), self.levels, undo(self.median), samples)


#: the projections of a self-attention sub-layer (see :meth:`ForecastModule.attention_weights`)
ATTENTION_PROJECTIONS = ("q", "k", "v", "o")
#: the suffix that names a block's cross-attention in records (see :func:`cross_name`)
CROSS_SUFFIX = ".cross"
#: the layer types LoRA adapts (GPT-2's projections are transformers' Conv1D, ``y = x W + b``)
LINEAR_TYPES = (nn.Linear, Conv1D)
#: constructor arguments that are code, not settings: kept out of the saved hyperparameters
log = logging.getLogger(__name__)
_NOT_HYPERPARAMETERS = ("optimizer", "scheduler")


def cross_name(block: str) -> str:
    """The name of ``block``'s cross-attention in records and plots: ``decoder.3.cross``."""
    return f"{block}{CROSS_SUFFIX}"


class ForecastModule(L.LightningModule, ABC):
    """Training loop, optimiser and forecast metrics shared by every forecaster wrapper.

    Args:
        optimizer: a partially-applied optimiser (Hydra ``_partial_: true``) taking parameters.
        scheduler: optional partially-applied LR scheduler taking the optimiser.
        context_length / prediction_length: the windows the data module makes.
        season_length: seasonal period for MASE's naive scale.
        freq: the data set's frequency (a pandas offset alias such as ``30min``, ``D``), for
            models that condition on it (TimesFM); None when unknown.
        quantile_levels: the levels forecasts and WQL use.
        forecast_on_validation: also forecast (not just compute the loss) on validation batches,
            so that ``val/nmse``, ``val/mase`` and ``val/wql`` are logged every epoch.
        compile: train with :meth:`loss` compiled by ``torch.compile`` (its forward and, through
            AOTAutograd, its backward); the probe, validation, forecasts and every other caller
            of the modules run them eagerly, hooks and all. Inductor draws dropout's random
            numbers from torch's generator (``fallback_random``), so a compiled step draws the
            eager step's masks. Not with the isotropy regulariser,
            which reads the blocks' outputs through forward hooks a compiled step does not run.
        compile_backend: ``torch.compile``'s backend (``inductor``, the default: generated
            kernels; ``eager``: the same captured graphs run by eager kernels, for checks).

    Attributes:
        compile_seconds: with ``compile``, the wall time of the first compiled training step,
            compilation included (None before it, and without ``compile``).
    """

    def __init__(
        self,
        optimizer: Callable[..., torch.optim.Optimizer],
        scheduler: Callable[..., torch.optim.lr_scheduler.LRScheduler] | None = None,
        context_length: int = 512,
        prediction_length: int = 64,
        season_length: int = 1,
        freq: str | None = None,
        quantile_levels: Sequence[float] = DEFAULT_QUANTILES,
        forecast_on_validation: bool = True,
        compile: bool = False,
        compile_backend: str = "inductor",
    ) -> None:
        super().__init__()
        # every constructor argument of the wrapper and of this base, in the checkpoint's
        # hyper_parameters (plain values only, so checkpoints load with weights_only=True)
        self.save_hyperparameters(ignore=list(_NOT_HYPERPARAMETERS), logger=False)
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        self.context_length = int(context_length)
        self.prediction_length = int(prediction_length)
        self.season_length = int(season_length)
        self.freq = freq
        self.quantile_levels = tuple(float(q) for q in quantile_levels)
        self.forecast_on_validation = forecast_on_validation
        self.val_metrics = ForecastMetrics(self.quantile_levels, self.season_length)
        self.test_metrics = ForecastMetrics(self.quantile_levels, self.season_length)
        #: an :class:`~isoprobe.models.regularizer.IsotropyRegularizer` the run attaches
        #: (``regularizer=isotropy``), or None
        self.regularizer = None
        self.compile_training = bool(compile)
        self.compile_backend = str(compile_backend)
        self.compile_seconds: float | None = None
        self._compiled_loss: Callable[[Batch], Tensor] | None = None

    @abstractmethod
    def loss(self, batch: Batch) -> Tensor:
        """The model's own training objective on a batch of scaled windows."""

    @abstractmethod
    def forecast(self, batch: Batch) -> Forecast:
        """Forecasts of ``batch['target']`` from ``batch['context']``, in the batch's scale."""

    #: whether :meth:`forecast` draws ``num_samples`` sample paths and summarises them by
    #: their empirical quantiles (``Forecast.samples`` set), not forecasting quantiles directly
    samples: bool
    #: whether a token also carries earlier steps' values as lag features, read from beyond
    #: the context's own step (Lag-Llama): such a token at a missing step still carries
    #: observed values (see "Real tokens" in the module docstring)
    lagged: bool
    #: the model's stacks of blocks, in the order it runs them (``("encoder", "decoder")``);
    #: :meth:`stack_blocks` gives each one's blocks
    stacks: tuple[str, ...]
    #: whether its blocks mix positions by attention; a recurrent model's (TiRex's xLSTM) do
    #: not: its :meth:`attention_weights` is ``{}``, and the measures of attention weights (the
    #: ε-ranks of Q, K, V, O; compression) say they do not apply to it, by name
    attends: bool = True

    @abstractmethod
    def embed_module(self) -> nn.Module:
        """The module whose output (or its first element) is ``embed``, the first block's
        input (the contract's "``embed``")."""

    @abstractmethod
    def stack_blocks(self, stack: str) -> Sequence[nn.Module]:
        """The blocks of ``stack`` (of :attr:`stacks`) in the order they run: modules whose
        output (or its first element) is the block's output, the residual stream."""

    @abstractmethod
    def self_attention_module(self, stack: str, index: int) -> nn.Module:
        """The module whose output (or its first element) is block ``index`` of ``stack``'s
        self-attention sub-layer output, after its output projection and before the residual
        add."""

    def probe_layer_identities(self, site: str = "block") -> dict[str, Layer]:
        """Layer name -> its :class:`~isoprobe.models.layers.Layer` (stack, index, depth in
        its stack, site), for every layer :meth:`probe_layers` names, in the same order."""
        check_probe_site(site)
        sizes = {stack: len(self.stack_blocks(stack)) for stack in self.stacks}
        return {layer.name: layer for layer in stack_layers(sizes, site)}

    def probe_layers(self, site: str = "block") -> dict[str, nn.Module]:
        """Layer name -> module whose output (or its first element) is that layer's
        representation [B, T, D]. ``site`` (:data:`PROBE_SITES`): ``block``, ``embed``
        (:meth:`embed_module`) and every block's output (the residual stream; names
        ``<stack>.<i>`` for each of :attr:`stacks`), or ``attention``, every self-attention
        sub-layer's output after its output projection and before the residual add (names
        ``<stack>.<i>.attn``, :meth:`self_attention_module`), where the isotropy paper's code
        reads. Built from the model's declared stacks (:meth:`probe_layer_identities`)."""
        return {
            name: self._probed_module(layer)
            for name, layer in self.probe_layer_identities(site).items()
        }

    def _probed_module(self, layer: Layer) -> nn.Module:
        if layer.stack == EMBED:
            return self.embed_module()
        if layer.site == "attention":
            return self.self_attention_module(layer.stack, layer.index)
        return self.stack_blocks(layer.stack)[layer.index]

    @abstractmethod
    def token_masks(self, batch: Batch, layers: Iterable[str]) -> dict[str, Tensor]:
        """Layer name -> bool mask of the positions of its output that are real tokens, of the
        output's shape without the width (``[B, T]`` for ``[B, T, D]``; ``[B, C, P]`` for a
        patch model's ``[B, C, P, D]``). Called once per probe batch for every probed layer,
        so the work the masks share (tokenising the batch) is done once."""

    def training_token_masks(self, batch: Batch, layers: Iterable[str]) -> dict[str, Tensor]:
        """Layer name -> bool mask, of the shape of that layer's output in :meth:`loss` (its
        first run there) without the width, of the real tokens :meth:`token_masks` marks in the
        probe pass (the contract's "Training tokens"). The default is :meth:`token_masks`, right
        where the loss's forward reads the positions :meth:`probe_forward` reads."""
        return self.token_masks(batch, layers)

    @abstractmethod
    def attention_weights(self) -> dict[str, dict[str, Tensor]]:
        """Block name (as in ``probe_layers("block")``: ``encoder.<i>``, ``decoder.<i>``) ->
        {``q``, ``k``, ``v``, ``o``} -> that block's self-attention projection matrix
        ``[out_features, in_features]`` as the model applies it (``y = x @ W.T``); a fused QKV or
        KV projection is split into its parts. The tensors are the parameters themselves (no
        copy): the rank measures read them, compression replaces them."""

    def cross_attention_weights(self) -> dict[str, dict[str, Tensor]]:
        """Decoder block name (as in :meth:`attention_weights`) -> {``q``, ``k``, ``v``, ``o``} ->
        that block's cross-attention projection matrix, as :meth:`attention_weights` gives the
        self-attention's: ``q`` reads the decoder's stream, ``k`` and ``v`` the encoder's
        output, ``o`` writes back to the decoder. The default, ``{}``, is for models without
        cross-attention (encoder-only and decoder-only); an encoder-decoder overrides it.
        Kept apart from :meth:`attention_weights` so that code reading only self-attention
        (one entry per block of ``probe_layers``) is unchanged."""
        return {}

    @abstractmethod
    def input_modules(self) -> list[nn.Module]:
        """The layers that turn a window into the first block's input: value or patch
        embeddings, special-token, frequency and absolute position embeddings (everything
        ``embed`` is made of that has parameters). With :meth:`head_modules`, what
        ``model.adapt=frozen_backbone`` trains."""

    @abstractmethod
    def head_modules(self) -> list[nn.Module]:
        """The output head, from the last block's stream (after its final norm) to the
        forecast's parameters: what ``model.adapt=head_only`` trains. A head tied to the input
        embedding (Chronos-T5's, GPT-2's) shares its matrix, which then trains as well."""

    @abstractmethod
    def feed_forward_modules(self) -> list[nn.Module]:
        """Every block's feed-forward (MLP) sub-layer: ``model.lora.mlp=true`` adapts the
        linear layers inside them."""

    def lora_target_modules(
        self, projections: Sequence[str] = ATTENTION_PROJECTIONS, feed_forward: bool = False
    ) -> list[nn.Module]:
        """The layers ``model.adapt=lora`` puts adapters on: the modules that apply the
        ``projections`` (of :data:`ATTENTION_PROJECTIONS`) of :meth:`attention_weights` (a fused
        projection's module once, when any of its parts is named: LoRA then adapts all its
        parts) and, with ``feed_forward``, the linear layers of :meth:`feed_forward_modules`.
        Read before any adapter is in place. A model whose official LoRA fine-tuning adapts
        other layers overrides it (Chronos-2)."""
        owners = {id(p): m for m in self.modules() for p in m.parameters(recurse=False)}
        found = []
        for parts in self.attention_weights().values():
            for part in projections:
                weight = parts[part]
                found.append(owners[id(weight if weight._base is None else weight._base)])
        if feed_forward:
            found += [
                m
                for sublayer in self.feed_forward_modules()
                for m in sublayer.modules()
                if isinstance(m, LINEAR_TYPES)
            ]
        return list({id(m): m for m in found}.values())

    @abstractmethod
    def export(self, directory: str, dtype: str = "float32") -> None:
        """Write the weights in the format ``model.checkpoint=<directory>`` loads (the official
        one where the model has one), so that the reloaded model forecasts identically."""

    #: the submodules ``model.adapt`` froze (set by
    #: :func:`isoprobe.models.adaptation.adapt_model`): they stay in eval mode (:meth:`train`)
    frozen_modules: tuple[nn.Module, ...] = ()

    def train(self, mode: bool = True) -> ForecastModule:
        """``nn.Module.train``, except that a submodule ``model.adapt`` froze stays in eval
        mode: a BatchNorm there keeps its running statistics, a dropout there draws nothing.
        Lightning calls ``train()`` at the start of every training epoch, so the frozen part is
        put back in eval mode at each call."""
        super().train(mode)
        for module in self.frozen_modules:
            module.eval()
        return self

    #: where the weights came from: set by the wrapper from ``model.checkpoint``
    resolved_checkpoint: ResolvedCheckpoint
    #: the attention projections factored by ``isoprobe.models.compression`` (None: dense)
    compression: list | None = None

    @abstractmethod
    def training_memory_bytes(self, batch_size: int) -> int:
        """Estimated peak memory of one training step on ``batch_size`` windows (weights,
        optimiser state and the activations kept for backward), to refuse a run that cannot
        fit before it starts."""

    @abstractmethod
    def forecast_memory_bytes(self, batch_size: int) -> int:
        """Estimated peak memory of :meth:`forecast` on ``batch_size`` windows."""

    def weight_floats(self, training: bool) -> int:
        """Floats the weights take in memory: every parameter once to forecast; in a training
        step also, for each parameter that trains, its gradient and AdamW's two moments (a
        parameter ``model.adapt`` freezes has neither). The memory estimates' weight term."""
        floats = sum(p.numel() for p in self.parameters())
        if training:
            floats += 3 * sum(p.numel() for p in self.parameters() if p.requires_grad)
        return floats

    def identify_layers(self, layers: Iterable[str], model_name: str) -> dict[str, Layer]:
        """Each of ``layers`` (names of either probe site) -> its
        :class:`~isoprobe.models.layers.Layer`; a KeyError names the first that no probe site
        has (``model_name``, such as ``Chronos-T5``, says whose layer it is) and the names that
        exist."""
        layers = list(layers)
        known = {**self.probe_layer_identities(), **self.probe_layer_identities("attention")}
        for name in layers:
            if name not in known:
                raise KeyError(f"unknown {model_name} layer {name!r}; known: {list(known)}")
        return {name: known[name] for name in layers}

    def probe_forward(self, batch: Batch) -> None:
        """The forward pass during which the probe's hooks capture representations."""
        self.loss(batch)

    def training_step(self, batch: Batch, batch_idx: int) -> Tensor:
        """The loss (logged ``train/loss``), plus λ·R when an isotropy regulariser is attached
        (:mod:`isoprobe.models.regularizer`; R logged ``train/reg``)."""
        size = batch["context"].shape[0]
        regularizer = self.regularizer
        if regularizer is None:
            loss = self._training_loss(batch)
        else:
            with regularizer.capture(self) as captured:
                loss = self.loss(batch)
            penalty = regularizer(self, batch, captured)
            self.log("train/reg", penalty, prog_bar=True, batch_size=size)
        self.log("train/loss", loss, prog_bar=True, batch_size=size)
        return loss if regularizer is None else loss + regularizer.weight * penalty

    def _training_loss(self, batch: Batch) -> Tensor:
        """:meth:`loss`, compiled on first use where ``compile`` asks for it (the first call's
        wall time, compilation included, kept as :attr:`compile_seconds` and logged)."""
        if not self.compile_training:
            return self.loss(batch)
        if self._compiled_loss is not None:
            return self._compiled_loss(batch)
        # inductor draws random numbers (dropout) with its own generator unless told to fall
        # back to torch's: with it, a compiled step draws the eager step's masks
        options = {"fallback_random": True} if self.compile_backend == "inductor" else None
        self._compiled_loss = torch.compile(
            self.loss, backend=self.compile_backend, options=options
        )
        started = time.perf_counter()
        loss = self._compiled_loss(batch)
        self.compile_seconds = time.perf_counter() - started
        log.info(
            "model.compile: the first training step took %.1f s, compiling %s's loss (%s)",
            self.compile_seconds,
            type(self).__name__,
            self.compile_backend,
        )
        return loss

    def on_fit_start(self) -> None:
        if self.compile_training and self.regularizer is not None:
            raise ValueError(
                "model.compile=true with the isotropy regulariser: the regulariser reads the "
                "blocks' outputs through forward hooks, which a compiled training step does not "
                "run. Turn one off (model.compile=false, or regularizer=none)."
            )

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        loss = self.loss(batch)
        size = batch["context"].shape[0]
        self.log("val/loss", loss, prog_bar=True, batch_size=size, sync_dist=True)
        if self.forecast_on_validation:
            self._update_forecast_metrics(self.val_metrics, batch)

    def on_validation_epoch_end(self) -> None:
        if self.forecast_on_validation and self.val_metrics.update_count > 0:
            self._log_forecast_metrics("val", self.val_metrics)

    def test_step(self, batch: Batch, batch_idx: int) -> None:
        self._update_forecast_metrics(self.test_metrics, batch)

    def on_test_epoch_end(self) -> None:
        self._log_forecast_metrics("test", self.test_metrics)

    def _update_forecast_metrics(self, metrics: ForecastMetrics, batch: Batch) -> None:
        loc, scale = batch["loc"], batch["scale"]
        forecast = self.forecast(batch).rescaled(loc, scale)
        shape = (-1, 1)
        target = batch["target"] * scale.view(shape) + loc.view(shape)
        context = batch["context"] * scale.view(shape) + loc.view(shape)
        metrics.update(forecast.median, forecast.quantiles, target, context)

    def _log_forecast_metrics(self, stage: str, metrics: ForecastMetrics) -> None:
        values = metrics.compute()
        self.log_dict({f"{stage}/{name}": value for name, value in values.items()})
        metrics.reset()

    def configure_optimizers(self):
        optimizer = self.optimizer_factory(params=self.parameters())
        if self.scheduler_factory is None:
            return optimizer
        scheduler = self.scheduler_factory(optimizer=optimizer)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }
