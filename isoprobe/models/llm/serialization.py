"""LLMTime serialisation (Gruver et al. 2023): a series as the digits a text LLM reads.

A window is scaled by ``q``, the ``alpha`` quantile of its observed ``|x|`` (so that value maps
to ``10**precision`` once written), each value is written with ``precision`` implied decimals and
no decimal point, leading zeros dropped, digits separated by spaces and time steps by ``" ,"``::

    [0.5, -1.25, 0.01] with q = 1, precision 3  ->  "5 0 0 , - 1 2 5 0 , 1 0 ,"

A missing value (NaN inside the series) is written ``NaN``; the left padding of a short series
is not written at all. Written as symbols (one per digit, sign, separator or ``NaN``), the
series maps one symbol to one token both in isoprobe's character vocabulary and, because the
digits are separated by spaces, in GPT-2's BPE (``" 1"``, ``" ,"`` ...), LLMTime's rule.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

DIGITS = tuple("0123456789")
COMMA, MINUS, MISSING = ",", "-", "NaN"
#: every symbol a serialised series is made of
SYMBOLS = (*DIGITS, COMMA, MINUS, MISSING)
PAD, EOS = "<pad>", "<eos>"


@dataclass(frozen=True)
class Serializer:
    """LLMTime's settings: ``precision`` implied decimals, at most ``max_digits`` digits per value
    (larger magnitudes are clipped to ``10**max_digits - 1``), scale = the ``alpha`` quantile of
    the observed ``|x|`` of the context."""

    precision: int = 3
    max_digits: int = 5
    alpha: float = 0.95

    def scales(self, context: Tensor) -> Tensor:
        """[B] the per-window scale ``q``: the ``alpha`` quantile of the observed ``|x|``; 1 for a
        window that is all missing or all zero."""
        q = torch.nanquantile(context.double().abs(), self.alpha, dim=-1)
        return torch.where(torch.isfinite(q) & (q > 0), q, torch.ones_like(q))

    def value_symbols(self, value: float) -> list[str]:
        """One scaled value's symbols, without the separator: ``NaN``, or sign and digits."""
        if math.isnan(value):
            return [MISSING]
        integer = min(math.floor(abs(value) * 10**self.precision + 0.5), 10**self.max_digits - 1)
        sign = [MINUS] if value < 0 and integer > 0 else []
        return [*sign, *str(integer)]

    def symbols(self, scaled: Sequence[float], skip_leading_missing: bool = True) -> list[str]:
        """A scaled series' symbols, every value followed by ``,``; the leading NaNs (left
        padding) are dropped unless ``skip_leading_missing`` is False."""
        values = list(scaled)
        start = 0
        if skip_leading_missing:
            while start < len(values) and math.isnan(values[start]):
                start += 1
        out: list[str] = []
        for value in values[start:]:
            out += [*self.value_symbols(value), COMMA]
        return out

    def parse_value(self, symbols: Sequence[str]) -> float | None:
        """The scaled value written by ``symbols`` (no separator); NaN for ``NaN``; None when
        they are no value (empty, a sign without digits, a symbol out of place)."""
        if list(symbols) == [MISSING]:
            return math.nan
        negative = bool(symbols) and symbols[0] == MINUS
        digits = list(symbols[1:] if negative else symbols)
        if not digits or not all(s in DIGITS for s in digits):
            return None
        value = int("".join(digits)) / 10**self.precision
        return -value if negative else value

    def parse(self, symbols: Sequence[str], steps: int) -> tuple[list[float], int]:
        """The first ``steps`` scaled values of a symbol stream and how many of them could not
        be read (written as NaN): a value cut off or missing at the end counts as unreadable."""
        values: list[float] = []
        current: list[str] = []
        unreadable = 0
        for symbol in symbols:
            if len(values) == steps:
                break
            if symbol == COMMA:
                value = self.parse_value(current)
                if value is None or math.isnan(value):
                    unreadable += 1
                    value = math.nan
                values.append(value)
                current = []
            else:
                current.append(symbol)
        unreadable += steps - len(values)
        values += [math.nan] * (steps - len(values))
        return values, unreadable


class CharVocabulary:
    """isoprobe's character vocabulary for scratch and bundled models: ``<pad>``, ``<eos>`` and
    one token per symbol (digits, ``,``, ``-``, ``NaN``); text is split on whitespace."""

    FILE = "llmtime_vocabulary.json"

    def __init__(self, tokens: Sequence[str] = (PAD, EOS, *SYMBOLS)) -> None:
        self.tokens = list(tokens)
        missing = [s for s in (PAD, EOS, *SYMBOLS) if s not in self.tokens]
        if missing:
            raise ValueError(f"a character vocabulary needs the tokens {missing}")
        self.ids = {token: i for i, token in enumerate(self.tokens)}

    def __len__(self) -> int:
        return len(self.tokens)

    def encode(self, text: str) -> list[int]:
        return [self.ids[token] for token in text.split()]

    def decode(self, ids: Sequence[int]) -> str:
        return " ".join(self.tokens[i] for i in ids)


@dataclass(frozen=True)
class TokenMap:
    """Symbols -> token ids of one tokenizer. Digits, ``,`` and ``-`` are one token each (the
    constrained sampler relies on it); ``NaN`` may take several."""

    symbol_ids: dict[str, tuple[int, ...]]
    pad_id: int
    eos_id: int

    @classmethod
    def from_vocabulary(cls, vocabulary: CharVocabulary) -> TokenMap:
        ids = {s: (vocabulary.ids[s],) for s in SYMBOLS}
        return cls(ids, vocabulary.ids[PAD], vocabulary.ids[EOS])

    @classmethod
    def from_tokenizer(cls, tokenizer, name: str) -> TokenMap:
        """The map of a Hugging Face tokenizer, each symbol written as LLMTime writes it (with a
        leading space: GPT-2's BPE has ``" 0"`` ... ``" 9"``, ``" ,"``, ``" -"``). A tokenizer
        that lacks a symbol (writes it as no token or as its unknown token), splits a digit,
        ``,`` or ``-`` into several, gives two symbols one token, or has no end-of-sequence
        token is refused in one message naming ``name`` (its directory or hub id)."""
        ids: dict[str, tuple[int, ...]] = {}
        for symbol in SYMBOLS:
            spaced = tuple(tokenizer.encode(" " + symbol, add_special_tokens=False))
            bare = tuple(tokenizer.encode(symbol, add_special_tokens=False))
            ids[symbol] = spaced if len(spaced) == 1 or len(bare) != 1 else bare
        unknown = tokenizer.unk_token_id
        lacking = [s for s, found in ids.items() if not found or unknown in found]
        split = [s for s, found in ids.items() if s != MISSING and len(found) > 1]
        singles = [found for s, found in ids.items() if s != MISSING and len(found) == 1]
        eos = tokenizer.eos_token_id
        problems = []
        if lacking:
            problems.append(f"it lacks {lacking} (writes them as no token or its unknown token)")
        if split:
            problems.append(f"it writes {split} as several tokens each")
        if len(set(singles)) != len(singles):
            problems.append("it writes two different symbols as one token")
        if eos is None:
            problems.append("it has no end-of-sequence token")
        if problems:
            raise ValueError(
                f"the tokenizer of {name} cannot write LLMTime series: {'; '.join(problems)}. "
                "LLMTime serialisation needs one token for each digit, ',' and '-', at least one "
                "for 'NaN', and an end-of-sequence token. Use a GPT-2 or T5 checkpoint with its "
                "own tokenizer, or model.checkpoint=scratch|bundled (isoprobe's vocabulary)."
            )
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
        return cls(ids, int(pad), int(eos))

    @property
    def single(self) -> dict[int, str]:
        """Token id -> symbol, for the symbols that are one token."""
        return {ids[0]: s for s, ids in self.symbol_ids.items() if len(ids) == 1}

    def ids(self, symbols: Sequence[str]) -> tuple[list[int], list[bool]]:
        """The token ids of ``symbols`` and, per token, whether it carries an observed value
        (its digits, sign and separator; not ``NaN`` nor the separator after it)."""
        ids: list[int] = []
        real: list[bool] = []
        observed = True
        for symbol in symbols:
            if symbol == MISSING:
                observed = False
            tokens = self.symbol_ids[symbol]
            ids += tokens
            real += [observed] * len(tokens)
            if symbol == COMMA:
                observed = True
        return ids, real

    def symbols(self, ids: Sequence[int]) -> list[str]:
        """The symbols of generated single-token ids; any other id reads as ``?`` (unreadable)."""
        single = self.single
        return [single.get(int(i), "?") for i in ids]
