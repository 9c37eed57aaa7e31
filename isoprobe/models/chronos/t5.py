"""Chronos-T5 (Ansari et al., 2024) as a :class:`ForecastModule`.

Series are tokenised by chronos-forecasting's own ``MeanScaleUniformBins`` (mean-|x| scaling of
the context, then uniform bins), the T5 encoder-decoder is trained with token cross-entropy as in
Chronos' training script, and forecasts are sampled autoregressively and summarised by quantiles.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from chronos import ChronosConfig
from torch import Tensor, nn
from transformers import GenerationConfig, T5Config, T5ForConditionalGeneration

from isoprobe.models.base import (
    Batch,
    Forecast,
    ForecastModule,
)
from isoprobe.models.checkpoints import (
    CheckpointError,
    ResolvedCheckpoint,
    check_weights_fit,
    load_pretrained,
    pretrained_config,
    resolve_checkpoint,
    scratch_fields,
    scratch_shape,
)
from isoprobe.models.chronos.chebyshev import chebyshev_embedding
from isoprobe.models.chronos.t5_config import chronos_config
from isoprobe.models.chronos.t5_sampling import sample_tokens
from isoprobe.models.config_schema import check_pretrained_config
from isoprobe.models.t5_attention import t5_cross_attention_weights, t5_self_attention_weights
from isoprobe.models.transformers_schemas import CHRONOS_T5

log = logging.getLogger(__name__)

IGNORE_INDEX = -100
#: model.input_embedding: learned (T5's) | chebyshev (fixed, of rank model.chebyshev_rank)
INPUT_EMBEDDINGS = ("learned", "chebyshev")
#: model.sampler: fast (isoprobe's decoding, :mod:`isoprobe.models.chronos.t5_sampling`) | generate
#: (transformers' ``generate``: ChronosPipeline's random stream, the same samples for a seed)
SAMPLERS = ("fast", "generate")
#: the T5 config field that records a fixed encoder input embedding ({"kind", "rank"})
FIXED_EMBEDDING_KEY = "isoprobe_fixed_input_embedding"


class ChronosT5Module(ForecastModule):
    """Chronos-T5 fine-tuning/pretraining wrapper.

    Args:
        checkpoint: ``auto`` | ``bundled`` | ``scratch`` | a local HF directory | a hub id.
        hub_id: the official checkpoint ``auto`` prefers when it is cached or reachable.
        bundled_name: folder of the shipped checkpoint under ``isoprobe/models/bundled``.
        size: which entry of ``sizes`` ``checkpoint=scratch`` builds.
        sizes: named ``T5Config`` fields with a ``chronos_config`` (``ChronosConfig`` fields:
            the tokenizer's and the lengths), as in the official config.json files (``mini``:
            the bundled shape).
        num_samples / temperature / top_k / top_p: sampling settings of forecasts.
        sampler: ``fast`` draws from the same distribution as ``ChronosPipeline`` several
            times faster, with other random draws (:mod:`isoprobe.models.chronos.t5_sampling`);
            ``generate`` decodes with transformers' ``generate``, as ChronosPipeline does, so
            a seed gives the pipeline's own samples.
        input_embedding: ``learned`` (T5's own) | ``chebyshev``: the encoder reads a fixed
            Chebyshev embedding of rank ``chebyshev_rank`` (rank-structure paper appendix I)
            instead of T5's, for pretraining from scratch; the decoder and the output head keep
            T5's shared, trained embedding. A checkpoint saved so carries it along.
        **base: the :class:`ForecastModule` arguments (optimizer, lengths, quantiles, ...).
    """

    samples = True
    lagged = False
    stacks = ("encoder", "decoder")

    def __init__(
        self,
        checkpoint: str = "auto",
        hub_id: str = "amazon/chronos-t5-tiny",
        bundled_name: str = "chronos-t5-mini",
        size: str = "mini",
        sizes: Mapping[str, Mapping[str, Any]] | None = None,
        num_samples: int = 20,
        temperature: float = 1.0,
        top_k: int = 50,
        top_p: float = 1.0,
        sampler: str = "fast",
        input_embedding: str = "learned",
        chebyshev_rank: int = 8,
        **base: Any,
    ) -> None:
        super().__init__(**base)
        self.resolved_checkpoint = resolve_checkpoint(checkpoint, hub_id, bundled_name)
        if input_embedding not in INPUT_EMBEDDINGS:
            raise ValueError(
                f"model.input_embedding must be one of {INPUT_EMBEDDINGS}, got {input_embedding!r}"
            )
        if sampler not in SAMPLERS:
            raise ValueError(f"model.sampler must be one of {SAMPLERS}, got {sampler!r}")
        if not temperature > 0 or not 0 < top_p <= 1:
            raise ValueError(
                f"model.temperature must be > 0 and model.top_p in (0, 1], got {temperature} and "
                f"{top_p}; model.top_k=1 samples the most likely token"
            )
        self.sampler = sampler
        t5, chronos_config = _load(self.resolved_checkpoint, scratch_fields(size, sizes))
        saved = getattr(t5.config, FIXED_EMBEDDING_KEY, None)
        if input_embedding == "chebyshev" and saved is None:
            if self.resolved_checkpoint.kind != "scratch":
                raise ValueError(
                    "model.input_embedding=chebyshev gives the encoder a fixed input embedding "
                    "to pretrain with; use it with model.checkpoint=scratch (task=pretrain)"
                )
            saved = {"kind": "chebyshev", "rank": int(chebyshev_rank)}
            setattr(t5.config, FIXED_EMBEDDING_KEY, saved)
        self.t5 = t5
        # what tokenising and sampling use: the model's context (the tokenizer keeps the last
        # context_length steps, as ChronosPipeline's does), the run's horizon (label tokens are
        # checked against it) and the run's sampling settings
        self.chronos_config = dataclasses.replace(
            chronos_config,
            prediction_length=self.prediction_length,
            num_samples=num_samples,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
        )
        self.saved_chronos_config = chronos_config
        if self.resolved_checkpoint.kind == "scratch":
            # a model pretrained here learns the run's windows: its config records them
            self.chronos_config = dataclasses.replace(
                self.chronos_config, context_length=self.context_length
            )
            self.saved_chronos_config = self.chronos_config
        self._warn_if_context_is_cut()
        self.tokenizer = self.chronos_config.create_tokenizer()
        fixed = None if saved is None else self._chebyshev_embedding(saved["rank"])
        self.register_buffer("fixed_embedding", fixed, persistent=False)
        self.embed_tap = nn.Identity()
        log.info("Chronos-T5 weights: %s", self.resolved_checkpoint.describe())

    def _warn_if_context_is_cut(self) -> None:
        model_context = self.chronos_config.context_length
        if self.context_length > model_context:
            log.warning(
                "data.context_length=%d is longer than this Chronos-T5 checkpoint's context of "
                "%d steps: like ChronosPipeline, the model reads only the last %d steps.",
                self.context_length,
                model_context,
                model_context,
            )

    def _context_tokens(self) -> int:
        """Encoder positions of a window: the steps the model reads, plus EOS."""
        return min(self.context_length, self.chronos_config.context_length) + 1

    def _chebyshev_embedding(self, rank: int) -> Tensor:
        """The encoder's fixed input embedding [n_tokens, d_model]: every token's bin centre
        through the rank-``rank`` Chebyshev embedding, PAD and EOS on directions of their own
        (:func:`isoprobe.models.chronos.chebyshev.chebyshev_embedding`; seeded, so the checkpoint
        stores only its rank)."""
        config = self.chronos_config
        special = config.n_special_tokens
        centers = self.tokenizer.centers
        # token t >= n_special stands for centers[t - n_special - 1], clamped (output_transform)
        index = (torch.arange(special, config.n_tokens) - special - 1).clamp(0, len(centers) - 1)
        limit = float(config.tokenizer_kwargs.get("high_limit", centers.abs().max()))
        return chebyshev_embedding(
            centers[index], rank, self.t5.config.d_model, limit, seed=0, extra_rows=special
        )

    def _encoder_embeds(self, ids: Tensor) -> Tensor:
        """The encoder's input embeddings: the fixed one when the model has it, else T5's."""
        if self.fixed_embedding is not None:
            return nn.functional.embedding(ids, self.fixed_embedding)
        return self.t5.get_input_embeddings()(ids)

    def export(self, directory: str, dtype: str = "float32") -> None:
        """Write the model as a Hugging Face directory that ``checkpoint=<directory>`` loads.

        ``dtype="float16"`` halves the file (the bundled checkpoint); loading casts back to fp32.
        Its ``chronos_config`` is the loaded checkpoint's, unchanged, so that ``ChronosPipeline``
        reads as many steps as the checkpoint did; a model pretrained here (scratch) records the
        run's lengths and sampling settings.
        """
        export = copy.deepcopy(self.t5).to(getattr(torch, dtype))
        export.config.chronos_config = dataclasses.asdict(self.saved_chronos_config)
        export.save_pretrained(directory, safe_serialization=True)

    def training_memory_bytes(self, batch_size: int) -> int:
        """Float32 bytes of a T5 training step: weights, gradients and two AdamW moments of what
        trains (weight_floats), and per encoder layer the attention tensors kept for backward
        (scores, softmax, dropout output: 3 x B x H x T^2) and the hidden activations (~ B x T x (8
        d_model + 2 d_ff)); the decoder's are the same with the horizon, plus cross-attention."""
        config = self.t5.config
        tokens = self._context_tokens()
        steps = self.prediction_length + 1  # start token
        heads, width, ff = config.num_heads, config.d_model, config.d_ff
        encoder = 3 * heads * tokens**2 + tokens * (8 * width + 2 * ff)
        decoder = 3 * heads * (steps**2 + steps * tokens) + steps * (10 * width + 2 * ff)
        activations = batch_size * (
            config.num_layers * encoder + config.num_decoder_layers * decoder
        )
        weights = self.weight_floats(training=True)
        return 4 * (activations + weights)

    def forecast_memory_bytes(self, batch_size: int) -> int:
        """Float32 bytes of sampled forecasting: the weights, the encoder's largest attention
        tensors (scores and softmax, 2 x B x H x T^2), and for the B x num_samples sequences
        the expanded encoder states and every decoder layer's cross-attention keys and values
        (S x T x d_model each)."""
        config = self.t5.config
        tokens = self._context_tokens()
        sequences = batch_size * self.chronos_config.num_samples
        encoder = 2 * batch_size * config.num_heads * tokens**2
        cross = sequences * tokens * config.d_model * (1 + 2 * config.num_decoder_layers)
        weights = self.weight_floats(training=False)
        return 4 * (encoder + cross + weights)

    def _tokenize_context(self, batch: Batch) -> tuple[Tensor, Tensor, Tensor]:
        ids, mask, scale = self.tokenizer.context_input_transform(batch["context"].cpu())
        return ids.to(self.device), mask.to(self.device), scale

    def _tokenize_target(self, batch: Batch, scale: Tensor) -> tuple[Tensor, Tensor]:
        labels, mask = self.tokenizer.label_input_transform(batch["target"].cpu(), scale)
        labels[~mask] = IGNORE_INDEX
        return labels.to(self.device), mask.to(self.device)

    def loss(self, batch: Batch) -> Tensor:
        ids, mask, scale = self._tokenize_context(batch)
        labels, _ = self._tokenize_target(batch, scale)
        embeds = self.embed_tap(self._encoder_embeds(ids))
        return self.t5(inputs_embeds=embeds, attention_mask=mask, labels=labels).loss

    @torch.no_grad()
    def forecast(self, batch: Batch) -> Forecast:
        ids, mask, scale = self._tokenize_context(batch)
        sample = self._sample_fast if self.sampler == "fast" else self._sample_generate
        tokens = sample(ids, mask)
        samples = self.tokenizer.output_transform(tokens.cpu(), scale).to(self.device)
        return Forecast.from_samples(samples, self.quantile_levels)

    def _sample_fast(self, ids: Tensor, mask: Tensor) -> Tensor:
        config = self.chronos_config
        states = self.t5.encoder(inputs_embeds=self._encoder_embeds(ids), attention_mask=mask)
        return sample_tokens(
            self.t5,
            states.last_hidden_state,
            mask,
            steps=self.prediction_length,
            num_samples=config.num_samples,
            start_token=config.pad_token_id,
            banned_token=config.eos_token_id,
            temperature=config.temperature,
            top_k=config.top_k,
            top_p=config.top_p,
        )

    def _sample_generate(self, ids: Tensor, mask: Tensor) -> Tensor:
        horizon, num_samples = self.prediction_length, self.chronos_config.num_samples
        encoder_input = (
            {"input_ids": ids}
            if self.fixed_embedding is None
            else {"inputs_embeds": self._encoder_embeds(ids)}
        )
        tokens = self.t5.generate(
            **encoder_input,
            attention_mask=mask,
            generation_config=GenerationConfig(
                min_new_tokens=horizon,
                max_new_tokens=horizon,
                do_sample=True,
                num_return_sequences=num_samples,
                eos_token_id=self.chronos_config.eos_token_id,
                pad_token_id=self.chronos_config.pad_token_id,
                decoder_start_token_id=self.chronos_config.pad_token_id,
                temperature=self.chronos_config.temperature,
                top_k=self.chronos_config.top_k,
                top_p=self.chronos_config.top_p,
            ),
        )
        return tokens[:, 1:].reshape(ids.shape[0], num_samples, horizon)

    def embed_module(self) -> nn.Module:
        """The encoder's input embeddings (an identity tap: the shared table runs twice)."""
        return self.embed_tap

    def stack_blocks(self, stack: str) -> Sequence[nn.Module]:
        return getattr(self.t5, stack).block

    def self_attention_module(self, stack: str, index: int) -> nn.Module:
        """``T5Attention``, which returns (its output after the ``o`` projection, ...)."""
        return self.stack_blocks(stack)[index].layer[0].SelfAttention

    def input_modules(self) -> list[nn.Module]:
        """The token embedding (tied to the head; Chebyshev's fixed one has no parameter)."""
        return [self.t5.get_input_embeddings()]

    def head_modules(self) -> list[nn.Module]:
        """``lm_head``, the token logits (tied to the input embedding)."""
        return [self.t5.lm_head]

    def feed_forward_modules(self) -> list[nn.Module]:
        return [block.layer[-1] for block in (*self.t5.encoder.block, *self.t5.decoder.block)]

    def attention_weights(self) -> dict[str, dict[str, Tensor]]:
        """Every block's self-attention (:func:`t5_self_attention_weights`)."""
        return t5_self_attention_weights(self.t5)

    def cross_attention_weights(self) -> dict[str, dict[str, Tensor]]:
        """Every decoder block's cross-attention (:func:`t5_cross_attention_weights`)."""
        return t5_cross_attention_weights(self.t5.decoder.block)

    def token_masks(self, batch: Batch, layers: Iterable[str]) -> dict[str, Tensor]:
        """Real tokens only, the batch tokenised once: observed context values (no EOS, no NaN
        padding) in the embedding and the encoder; in the decoder, positions whose input is an
        observed target value (teacher forcing), i.e. not the start token, not a missing value."""
        _, context_mask, scale = self._tokenize_context(batch)
        encoder = context_mask.clone()
        if self.chronos_config.use_eos_token:
            encoder[:, -1] = False
        _, target_mask = self._tokenize_target(batch, scale)
        start = torch.zeros_like(target_mask[:, :1])
        decoder = torch.cat([start, target_mask[:, : self.prediction_length]], dim=1)
        identities = self.identify_layers(layers, "Chronos-T5")
        return {
            name: decoder if layer.stack == "decoder" else encoder
            for name, layer in identities.items()
        }


def _load(
    resolved: ResolvedCheckpoint, scratch: Mapping[str, Any] | None
) -> tuple[T5ForConditionalGeneration, ChronosConfig]:
    if resolved.kind == "scratch":
        t5_fields = dict(scratch_shape(scratch))
        chronos_fields = t5_fields.pop("chronos_config", None)
        where = "model.sizes (model.checkpoint=scratch)"
        return T5ForConditionalGeneration(T5Config(**t5_fields)), chronos_config(
            chronos_fields, where
        )
    source = resolved.location
    check_pretrained_config(source, CHRONOS_T5)
    config = pretrained_config(
        source, "model=chronos loads Chronos-T5 checkpoints such as amazon/chronos-t5-small."
    )
    pipeline = getattr(config, "chronos_pipeline_class", "") or ""
    architectures = " ".join(getattr(config, "architectures", None) or [])
    if "Bolt" in pipeline or "Bolt" in architectures:
        raise CheckpointError(
            f"{source} is a Chronos-Bolt checkpoint ({pipeline or architectures}), not a "
            "Chronos-T5 one: model=chronos loads seq2seq Chronos-T5 checkpoints such as "
            "amazon/chronos-t5-small; load Chronos-Bolt checkpoints with model=chronos_bolt."
        )
    chronos_fields = getattr(config, "chronos_config", None)
    if chronos_fields is None or config.model_type != "t5":
        raise CheckpointError(
            f"{source} is not a Chronos-T5 checkpoint (model_type={config.model_type!r}, "
            f"chronos_config {'present' if chronos_fields else 'missing'}). model=chronos loads "
            "seq2seq Chronos checkpoints such as amazon/chronos-t5-small."
        )
    chronos = chronos_config(chronos_fields, f"{source}/config.json")
    t5, info = load_pretrained(T5ForConditionalGeneration, source)
    check_weights_fit(info, source)
    return t5, chronos
