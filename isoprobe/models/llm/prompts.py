"""The LLM's prompts and training sequences: LLMTime-serialised series as token ids.

A mixin of :class:`isoprobe.models.llm.module.LlmModule`, which provides ``arch``, ``lm``,
``serializer``, ``token_map``, ``prediction_length`` and ``device``: the context's tokens
(oldest values cut where GPT-2's positions run short, as LLMTime does), the target's, and the
padded batches a loss, a probe pass or ``generate`` reads.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from isoprobe.models.base import Batch
from isoprobe.models.llm.serialization import COMMA

IGNORE_INDEX = -100


@dataclasses.dataclass
class Encoded:
    """A batch as token ids [B, L] (left padded), its attention mask and real-token mask, and
    for a loss the labels [B, L] (IGNORE_INDEX where no target token is predicted)."""

    ids: Tensor
    attention: Tensor
    real: Tensor
    labels: Tensor | None = None


class PromptEncoding:
    """Series to token ids for the LLM (see the module docstring for what it reads)."""

    @property
    def _value_tokens(self) -> int:
        """Most tokens one value takes: sign, ``max_digits`` digits, separator."""
        return self.serializer.max_digits + 2

    def _context_budget(self) -> int | None:
        """Most context tokens GPT-2 can read and still write the horizon within its positions
        (None for T5, whose relative positions have no limit)."""
        if self.arch != "gpt2":
            return None
        budget = self.lm.config.n_positions - self.prediction_length * self._value_tokens
        if budget < self._value_tokens:
            raise ValueError(
                f"GPT-2 with n_positions={self.lm.config.n_positions} cannot hold a horizon of "
                f"{self.prediction_length} steps ({self._value_tokens} tokens each); use a model "
                "with more positions or a shorter data.prediction_length"
            )
        return budget

    def _context_tokens(self, context: Tensor, q: Tensor) -> list[tuple[list[int], list[bool]]]:
        """Per window, the context's token ids and real flags, oldest values dropped (whole
        values) where the budget is short, as LLMTime truncates the prompt."""
        budget = self._context_budget()
        rows = []
        for values, scale in zip(context.double().cpu(), q.tolist(), strict=True):
            ids, real = self.token_map.ids(self.serializer.symbols((values / scale).tolist()))
            if budget is not None and len(ids) > budget:
                cut = len(ids) - budget
                separators = [i for i, t in enumerate(ids) if t == self._comma_id and i >= cut - 1]
                start = separators[0] + 1 if separators else len(ids)
                ids, real = ids[start:], real[start:]
            rows.append((ids, real))
        return rows

    def _target_tokens(self, target: Tensor, q: Tensor) -> list[tuple[list[int], list[bool]]]:
        symbols = [
            self.serializer.symbols((values / scale).tolist(), skip_leading_missing=False)
            for values, scale in zip(target.double().cpu(), q.tolist(), strict=True)
        ]
        return [self.token_map.ids(s) for s in symbols]

    @property
    def _comma_id(self) -> int:
        return self.token_map.symbol_ids[COMMA][0]

    def _pad(self, rows: list[tuple[list[int], list[bool]]], left: bool) -> Encoded:
        length = max(len(ids) for ids, _ in rows)
        ids = torch.full((len(rows), length), self.token_map.pad_id, dtype=torch.long)
        attention = torch.zeros(len(rows), length, dtype=torch.long)
        real = torch.zeros(len(rows), length, dtype=torch.bool)
        for row, (tokens, flags) in enumerate(rows):
            span = slice(length - len(tokens), length) if left else slice(0, len(tokens))
            ids[row, span] = torch.tensor(tokens, dtype=torch.long)
            attention[row, span] = 1
            real[row, span] = torch.tensor(flags, dtype=torch.bool)
        return Encoded(ids.to(self.device), attention.to(self.device), real.to(self.device))

    def encode_context(self, batch: Batch) -> tuple[Encoded, Tensor]:
        """The prompt: the context's tokens (left padded; T5's end with EOS) and the scales."""
        q = self.serializer.scales(batch["context"].cpu())
        rows = self._context_tokens(batch["context"], q)
        if self.arch == "t5":
            rows = [(ids + [self.token_map.eos_id], real + [False]) for ids, real in rows]
        return self._pad(rows, left=True), q

    def encode_training(self, batch: Batch) -> Encoded | tuple[Encoded, Encoded]:
        """GPT-2: one sequence, context then target, labels on the target's tokens (missing
        values' tokens ignored). T5: the context for the encoder and the target as labels."""
        q = self.serializer.scales(batch["context"].cpu())
        context = self._context_tokens(batch["context"], q)
        target = self._target_tokens(batch["target"], q)
        if self.arch == "t5":
            rows = [(ids + [self.token_map.eos_id], real + [False]) for ids, real in context]
            decoder = self._pad(target, left=False)
            labels = decoder.ids.masked_fill(~decoder.real, IGNORE_INDEX)
            decoder.labels = labels
            return self._pad(rows, left=True), decoder
        joined = [
            (c + t, cr + [False] * len(t)) for (c, cr), (t, _) in zip(context, target, strict=True)
        ]
        encoded = self._pad(joined, left=True)
        labels = torch.full_like(encoded.ids, IGNORE_INDEX)
        for row, (tokens, flags) in enumerate(target):
            start = encoded.ids.shape[1] - len(tokens)
            label = torch.tensor(tokens, device=labels.device)
            observed = torch.tensor(flags, device=labels.device)
            labels[row, start:] = label.masked_fill(~observed, IGNORE_INDEX)
        encoded.labels = labels
        return encoded
