"""A text LLM reading the series as digits: GPT-2 or T5 with LLMTime serialisation.

The context is serialised as in LLMTime (:mod:`isoprobe.models.llm.serialization`) and the
model is trained with next-token cross-entropy on the target's tokens: GPT-2 reads context and
target as one sequence (teacher forcing, the loss on the target's tokens only), T5 reads the
context in its encoder and the target in its decoder. Forecasts are ``num_samples`` sampled
continuations, constrained to well-formed numbers (digits, an optional leading ``-``, at most
``max_digits`` digits, then ``,``), read back and summarised by quantiles.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

from isoprobe.models.base import (
    ATTENTION_PROJECTIONS,
    Batch,
    Forecast,
    ForecastModule,
)
from isoprobe.models.checkpoints import resolve_checkpoint, scratch_fields, scratch_shape
from isoprobe.models.llm.grammar import NumberGrammar, StopAfterValues
from isoprobe.models.llm.loading import ARCHITECTURES, HUB_IDS, SERIALIZER_KEY, load_lm
from isoprobe.models.llm.prompts import Encoded, PromptEncoding
from isoprobe.models.llm.serialization import COMMA, CharVocabulary, Serializer
from isoprobe.models.t5_attention import t5_cross_attention_weights

log = logging.getLogger(__name__)


class LlmModule(PromptEncoding, ForecastModule):
    """GPT-2 / T5 on LLMTime-serialised series.

    Args:
        arch: ``gpt2`` (decoder-only, GPT2LMHeadModel) | ``t5`` (T5ForConditionalGeneration).
        checkpoint: ``auto`` | ``bundled`` | ``scratch`` | a local HF directory | a hub id.
        hub_id: the checkpoint ``auto`` prefers; None: the arch's official one
            (:data:`HUB_IDS`).
        bundled_name: the shipped checkpoint; None: ``llm-<arch>-mini``.
        size / sizes: ``sizes[arch][size]`` is the config ``checkpoint=scratch`` builds.
        precision / max_digits / alpha: the LLMTime serialisation (:class:`Serializer`) of
            scratch models; a checkpoint brings its own.
        num_samples / temperature / top_k / top_p: sampling of forecasts.
        **base: the :class:`ForecastModule` arguments.
    """

    samples = True
    lagged = False
    #: GPT-2's (the default ``arch``); ``__init__`` sets T5's
    stacks = ("decoder",)

    def __init__(
        self,
        arch: str = "gpt2",
        checkpoint: str = "auto",
        hub_id: str | None = None,
        bundled_name: str | None = None,
        size: str = "mini",
        sizes: Mapping[str, Mapping[str, Mapping[str, Any]]] | None = None,
        precision: int = 3,
        max_digits: int = 5,
        alpha: float = 0.95,
        num_samples: int = 20,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        **base: Any,
    ) -> None:
        super().__init__(**base)
        if arch not in ARCHITECTURES:
            raise ValueError(f"model.arch must be one of {tuple(ARCHITECTURES)}, got {arch!r}")
        self.arch = arch
        if arch == "t5":
            self.stacks = ("encoder", "decoder")
        self.resolved_checkpoint = resolve_checkpoint(
            checkpoint, hub_id or HUB_IDS[arch], bundled_name or f"llm-{arch}-mini"
        )
        scratch = scratch_fields(size, (sizes or {}).get(arch))
        if self.resolved_checkpoint.kind == "scratch":
            scratch = scratch_shape(scratch, f"model.sizes.{arch}")
        self.serializer = Serializer(precision, max_digits, alpha)
        self.lm, self.vocabulary, self.token_map = load_lm(
            self.resolved_checkpoint, arch, scratch, self.serializer
        )
        saved = getattr(self.lm.config, SERIALIZER_KEY, None)
        if saved is not None:
            self.serializer = Serializer(**saved)
        self.num_samples = int(num_samples)
        self.temperature, self.top_k, self.top_p = float(temperature), int(top_k), float(top_p)
        self.embed_tap = (
            nn.Identity()
        )  # T5's encoder input embeddings (the shared table runs twice)
        self.unreadable_values = 0
        budget = self._context_budget()
        typical = self.context_length * (self.serializer.precision + 1)  # digits and ","
        if budget is not None and typical > budget:
            log.warning(
                "GPT-2's %d positions hold about %d of the %d context steps once %d horizon "
                "steps are reserved: the oldest values are cut from the prompt (as LLMTime does).",
                self.lm.config.n_positions,
                budget // (self.serializer.precision + 1),
                self.context_length,
                self.prediction_length,
            )
        log.info("LLM (%s) weights: %s", arch, self.resolved_checkpoint.describe())

    # ----- objective and forecasts ---------------------------------------------------------

    def loss(self, batch: Batch) -> Tensor:
        encoded = self.encode_training(batch)
        if self.arch == "t5":
            encoder, decoder = encoded
            return self.lm(
                inputs_embeds=self.embed_tap(self.lm.get_input_embeddings()(encoder.ids)),
                attention_mask=encoder.attention,
                labels=decoder.labels,
            ).loss
        return self.lm(
            input_ids=encoded.ids,
            attention_mask=encoded.attention,
            position_ids=positions(encoded.attention),
            labels=encoded.labels,
        ).loss

    def probe_forward(self, batch: Batch) -> None:
        """GPT-2 reads the context only (the prompt a forecast starts from); T5 runs as in the
        loss, its decoder reading the target (teacher forcing)."""
        if self.arch == "t5":
            self.loss(batch)
            return
        encoded, _ = self.encode_context(batch)
        self.lm.transformer(
            input_ids=encoded.ids,
            attention_mask=encoded.attention,
            position_ids=positions(encoded.attention),
        )

    def generation_inputs(self, batch: Batch) -> tuple[dict[str, Any], Tensor]:
        """The keyword arguments of ``self.lm.generate`` for ``batch`` and the scales."""
        encoded, q = self.encode_context(batch)
        horizon = self.prediction_length
        config = GenerationConfig(
            do_sample=True,
            max_new_tokens=horizon * self._value_tokens,
            num_return_sequences=self.num_samples,
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            pad_token_id=self.token_map.pad_id,
            eos_token_id=None,
            bos_token_id=None,
            decoder_start_token_id=self.token_map.pad_id if self.arch == "t5" else None,
        )
        grammar = NumberGrammar(self.token_map, self.serializer.max_digits)
        stop = StopAfterValues(self._comma_id, horizon, encoded.ids.shape[1], self.arch == "t5")
        kwargs = {
            "input_ids": encoded.ids,
            "attention_mask": encoded.attention,
            "generation_config": config,
            "logits_processor": LogitsProcessorList([grammar]),
            "stopping_criteria": StoppingCriteriaList([stop]),
        }
        return kwargs, q

    def read_samples(self, generated: Tensor, prompt_length: int, q: Tensor) -> Tensor:
        """[B, S, H] samples in the batch's scale from generated ids [B S, L]; a value that
        cannot be read is NaN and counted in ``unreadable_values``."""
        new = generated[:, prompt_length:].cpu().tolist()
        rows, unreadable = [], 0
        for ids in new:
            values, bad = self.serializer.parse(self.token_map.symbols(ids), self.prediction_length)
            rows.append(values)
            unreadable += bad
        if unreadable:
            log.warning("LLM forecast: %d sampled values could not be read (NaN)", unreadable)
        self.unreadable_values += unreadable
        samples = torch.tensor(rows, dtype=torch.float64).view(len(q), self.num_samples, -1)
        return (samples * q.view(-1, 1, 1)).to(torch.float32).to(self.device)

    @torch.no_grad()
    def forecast(self, batch: Batch) -> Forecast:
        kwargs, q = self.generation_inputs(batch)
        generated = self.lm.generate(**kwargs)
        prompt = 1 if self.arch == "t5" else kwargs["input_ids"].shape[1]
        samples = self.read_samples(generated, prompt, q)
        read = Forecast.from_samples(samples, self.quantile_levels, ignore_nan=True)
        fallback = last_observed(batch["context"]).view(-1, 1).to(samples)
        quantiles = torch.where(read.quantiles.isnan(), fallback.unsqueeze(1), read.quantiles)
        median = torch.where(read.median.isnan(), fallback, read.median)
        return Forecast(quantiles, self.quantile_levels, median, samples)

    # ----- probe contract ------------------------------------------------------------------

    def embed_module(self) -> nn.Module:
        """GPT-2: token plus position embeddings, the dropout's output; T5: the encoder's
        input embeddings (an identity tap)."""
        return self.lm.transformer.drop if self.arch == "gpt2" else self.embed_tap

    def stack_blocks(self, stack: str) -> Sequence[nn.Module]:
        if self.arch == "gpt2":
            return self.lm.transformer.h
        return getattr(self.lm, stack).block

    def self_attention_module(self, stack: str, index: int) -> nn.Module:
        """The self-attention's output after ``c_proj`` (GPT-2) / ``o`` (T5)."""
        block = self.stack_blocks(stack)[index]
        return block.attn if self.arch == "gpt2" else block.layer[0].SelfAttention

    def token_masks(self, batch: Batch, layers: Iterable[str]) -> dict[str, Tensor]:
        """Real tokens are those that write an observed value: its digits and sign; not the
        ``,`` after it (a separator carries no value), padding, EOS, nor a missing value's
        ``NaN``. GPT-2 and T5's encoder read the context; T5's decoder positions are real where
        their input is such a target token (teacher forcing; not the start token)."""
        if self.arch == "t5":
            encoder, decoder = self.encode_training(batch)
            encoder_mask = self._writing_values(encoder)
            start = torch.zeros_like(decoder.real[:, :1])
            decoder_mask = torch.cat([start, self._writing_values(decoder)[:, :-1]], dim=1)
        else:
            encoder_mask = decoder_mask = self._writing_values(self.encode_context(batch)[0])
        masks = {}
        for name, layer in self.identify_layers(layers, "LLM").items():
            reads_target = self.arch == "t5" and layer.stack == "decoder"
            masks[name] = decoder_mask if reads_target else encoder_mask
        return masks

    def training_token_masks(self, batch: Batch, layers: Iterable[str]) -> dict[str, Tensor]:
        """GPT-2's loss reads the context followed by the target as one sequence: its real
        tokens are the context's value tokens there, the positions whose states equal the
        probe pass's (causal attention, the same position ids), the target's left out as the
        probe leaves them out. T5's loss reads what its probe pass reads."""
        if self.arch == "t5":
            return self.token_masks(batch, layers)
        layers = list(layers)
        self.identify_layers(layers, "LLM")
        real = self._writing_values(self.encode_training(batch))
        return {name: real for name in layers}

    def _writing_values(self, encoded: Encoded) -> Tensor:
        """The tokens of ``encoded`` that write an observed value (``real``, separators out;
        the loss still trains the separators, which forecasts need to be read)."""
        separators = torch.tensor(self.token_map.symbol_ids[COMMA], device=encoded.ids.device)
        return encoded.real & ~torch.isin(encoded.ids, separators)

    def input_modules(self) -> list[nn.Module]:
        """The token embedding (tied to the head) and, GPT-2, the position embedding."""
        positions = [self.lm.transformer.wpe] if self.arch == "gpt2" else []
        return [self.lm.get_input_embeddings(), *positions]

    def head_modules(self) -> list[nn.Module]:
        """``lm_head``, the token logits (tied to the input embedding)."""
        return [self.lm.get_output_embeddings()]

    def feed_forward_modules(self) -> list[nn.Module]:
        blocks = [block for stack in self.stacks for block in self.stack_blocks(stack)]
        return [block.mlp if self.arch == "gpt2" else block.layer[-1] for block in blocks]

    def attention_weights(self) -> dict[str, dict[str, Tensor]]:
        """GPT-2: ``c_attn`` is a Conv1D whose weight is ``[in, 3 out]`` (``y = x @ W``): q, k, v
        are transposed views of its thirds, o of ``c_proj``'s weight. T5: q, k, v, o as they are."""
        weights = {}
        for stack in self.stacks:
            for i in range(len(self.stack_blocks(stack))):
                attention = self.self_attention_module(stack, i)
                if self.arch == "gpt2":
                    q, k, v = attention.c_attn.weight.split(attention.embed_dim, dim=1)
                    parts = {"q": q.T, "k": k.T, "v": v.T, "o": attention.c_proj.weight.T}
                else:
                    parts = {p: getattr(attention, p).weight for p in ATTENTION_PROJECTIONS}
                weights[f"{stack}.{i}"] = parts
        return weights

    def cross_attention_weights(self) -> dict[str, dict[str, Tensor]]:
        """T5: every decoder block's ``EncDecAttention`` q, k, v, o; GPT-2 has none."""
        if self.arch == "gpt2":
            return {}
        return t5_cross_attention_weights(self.lm.decoder.block)

    # ----- checkpoints and memory ----------------------------------------------------------

    def export(self, directory: str, dtype: str = "float32") -> None:
        """A Hugging Face directory: the model (``save_pretrained``, config.json recording the
        serialisation) and the tokenizer (isoprobe's vocabulary file, or the hub tokenizer's
        files)."""
        setattr(self.lm.config, SERIALIZER_KEY, dataclasses.asdict(self.serializer))
        copy.deepcopy(self.lm).to(getattr(torch, dtype)).save_pretrained(directory)
        if isinstance(self.vocabulary, CharVocabulary):
            path = Path(directory) / CharVocabulary.FILE
            path.write_text(json.dumps({"tokens": self.vocabulary.tokens}, indent=2))
        else:
            self.vocabulary.save_pretrained(directory)

    def _sequence_lengths(self) -> tuple[int, int]:
        """Upper bounds of the context's and the target's tokens."""
        context = self.context_length * self._value_tokens
        budget = self._context_budget()
        return (context if budget is None else min(context, budget)), (
            self.prediction_length * self._value_tokens
        )

    def training_memory_bytes(self, batch_size: int) -> int:
        """Float32 bytes of a training step: weights, gradients and two AdamW moments, and per
        layer the attention tensors kept for backward (3 x B x heads x L^2) and the hidden
        activations (~ B x L x 16 d_model, the 4x MLP included) over the token upper bounds."""
        context, target = self._sequence_lengths()
        config = self.lm.config
        weights = self.weight_floats(training=True)
        if self.arch == "gpt2":
            length, heads, width = context + target, config.n_head, config.n_embd
            per_layer = 3 * heads * length**2 + length * 16 * width
            activations = config.n_layer * per_layer + length * config.vocab_size
        else:
            heads, width = config.num_heads, config.d_model
            encoder = 3 * heads * context**2 + context * (8 * width + 2 * config.d_ff)
            decoder = 3 * heads * (target**2 + target * context) + target * (
                10 * width + 2 * config.d_ff
            )
            activations = config.num_layers * encoder + config.num_decoder_layers * decoder
        return 4 * (batch_size * activations + weights)

    def forecast_memory_bytes(self, batch_size: int) -> int:
        """Float32 bytes of sampled forecasting: the weights, the prompt's attention scores and
        softmax (2 x B x heads x L^2) and the key/value cache of B x num_samples sequences
        (2 x layers x L x d_model each)."""
        context, target = self._sequence_lengths()
        config = self.lm.config
        sequences = batch_size * self.num_samples
        if self.arch == "gpt2":
            heads, width, layers = config.n_head, config.n_embd, config.n_layer
            prompt = 2 * batch_size * heads * context**2
            cache = sequences * 2 * layers * (context + target) * width
        else:
            heads, width, layers = config.num_heads, config.d_model, config.num_decoder_layers
            prompt = 2 * batch_size * heads * context**2
            cache = sequences * 2 * layers * (context + target) * width
        return 4 * (prompt + cache + self.weight_floats(training=False))


def positions(attention: Tensor) -> Tensor:
    """Position ids of left-padded rows (0 at the first real token), as ``generate`` makes them."""
    return (attention.long().cumsum(-1) - 1).clamp(min=0)


def last_observed(context: Tensor) -> Tensor:
    """[B] each window's last observed value (0 where none is)."""
    observed = ~context.isnan()
    index = torch.where(observed, torch.arange(context.shape[1], device=context.device), -1)
    last = index.max(dim=1).values
    value = context.gather(1, last.clamp(min=0).view(-1, 1)).squeeze(1)
    return torch.where(last >= 0, value, torch.zeros_like(value))
