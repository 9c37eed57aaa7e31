"""Constrained sampling for :class:`~isoprobe.models.llm.module.LlmModule`: a logits processor that
admits only well-formed LLMTime values and a stopping criterion after the horizon's values."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor
from transformers import LogitsProcessor, StoppingCriteria

from isoprobe.models.llm.serialization import COMMA, DIGITS, MINUS, TokenMap


class NumberGrammar(LogitsProcessor):
    """Sampling constrained to well-formed values: after ``,`` (or the decoder start) a digit or
    ``-``; after ``-`` a digit; after a digit another digit (fewer than ``max_digits`` in a row)
    or ``,``. Every other token's score is -inf, so every sample reads back."""

    def __init__(self, token_map: TokenMap, max_digits: int) -> None:
        ids = token_map.symbol_ids
        self.digits = torch.tensor([ids[d][0] for d in DIGITS])
        self.comma, self.minus = ids[COMMA][0], ids[MINUS][0]
        self.max_digits = max_digits

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        digits = self.digits.to(input_ids.device)
        is_digit = torch.isin(input_ids[:, -self.max_digits :], digits)
        run = is_digit.flip(1).long().cumprod(1).sum(1)  # trailing digits
        last = input_ids[:, -1]
        allowed = torch.zeros_like(scores, dtype=torch.bool)
        after_digit = run > 0
        allowed[:, digits] = (~after_digit | (run < self.max_digits)).unsqueeze(1)
        allowed[:, self.comma] = after_digit
        allowed[:, self.minus] = ~after_digit & (last != self.minus)
        return scores.masked_fill(~allowed, -math.inf)


class StopAfterValues(StoppingCriteria):
    """A sequence is done once it has written ``steps`` separators after the prompt."""

    def __init__(self, comma: int, steps: int, prompt_length: int, seq2seq: bool) -> None:
        self.comma, self.steps = comma, steps
        self.start = 1 if seq2seq else prompt_length

    def __call__(self, input_ids: Tensor, scores: Tensor, **kwargs: Any) -> Tensor:
        return (input_ids[:, self.start :] == self.comma).sum(1) >= self.steps
