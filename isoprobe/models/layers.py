"""A probed layer's identity as data: its stack, its index there, its depth, its site.

A model's probed layers are ``embed`` (the first block's input) and every block of each of its
stacks (``encoder``, ``decoder``), in the order the model runs them, at one of two sites:
``block``, the block's output, and ``attention``, its self-attention sub-layer's output
(:data:`PROBE_SITES`). :class:`Layer` holds what a layer is; :attr:`Layer.name` is the string
records, CSV columns and logger keys use (``embed``, ``encoder.3``, ``decoder.0.attn``), and
:func:`parse_layer` reads such a name back. This module imports no torch, so the analysis of
records reads layer names with it cheaply.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

#: where a probe reads the representations (see ``ForecastModule.probe_layers``)
PROBE_SITES = ("block", "attention")
#: the stack name of the layer every first block reads
EMBED = "embed"
#: the suffix that names a block's self-attention sub-layer (site ``attention``)
ATTENTION_SUFFIX = ".attn"
_NAME = re.compile(r"^(?P<stack>[A-Za-z_]+)\.(?P<index>\d+)(?P<attention>\.attn)?$")


@dataclass(frozen=True)
class Layer:
    """One probed layer. ``stack``: ``embed`` or the stack of blocks it belongs to;
    ``index``: the block's place in its stack (0 for ``embed``); ``depth``: that place as a
    fraction of the stack, 0 for its first block and 1 for its last (0 for ``embed`` and for
    the block of a one-block stack); ``site``: of :data:`PROBE_SITES`."""

    stack: str
    index: int = 0
    depth: float = 0.0
    site: str = "block"

    @property
    def is_block(self) -> bool:
        """Whether the layer is a block of a stack (at either site), not ``embed``."""
        return self.stack != EMBED

    @property
    def name(self) -> str:
        """``embed``, ``<stack>.<index>`` or, at site ``attention``, ``<stack>.<index>.attn``."""
        if not self.is_block:
            return EMBED
        block = f"{self.stack}.{self.index}"
        return block + ATTENTION_SUFFIX if self.site == "attention" else block


def check_probe_site(site: str) -> None:
    if site not in PROBE_SITES:
        raise ValueError(f"probe site must be one of {PROBE_SITES}, got {site!r}")


def stack_layers(stack_sizes: Mapping[str, int], site: str = "block") -> list[Layer]:
    """Every probed layer of a model whose stacks (in the order it runs them) hold
    ``stack_sizes`` blocks: ``embed`` then each stack's blocks at site ``block``; each stack's
    blocks at site ``attention`` (``embed`` has no attention)."""
    check_probe_site(site)
    layers = [Layer(EMBED)] if site == "block" else []
    for stack, size in stack_sizes.items():
        last = max(size - 1, 1)
        layers += [Layer(stack, i, i / last, site) for i in range(size)]
    return layers


def parse_layer(name: str) -> tuple[str, int, str] | None:
    """``(stack, index, site)`` of a layer named as :attr:`Layer.name` names it, such as
    ``("encoder", 3, "block")`` for ``encoder.3``; None for ``embed`` and for any other name
    (a depth choice such as ``last``, a cross-attention ``decoder.0.cross``). Its depth needs
    the stack's size, which a name does not hold."""
    match = _NAME.match(name)
    if match is None:
        return None
    site = "attention" if match["attention"] else "block"
    return match["stack"], int(match["index"]), site


def is_block(name: str) -> bool:
    """Whether ``name`` is a block's output (``encoder.3``), not ``embed`` nor a sub-layer."""
    parsed = parse_layer(name)
    return parsed is not None and parsed[2] == "block"
