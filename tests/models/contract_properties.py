"""Properties any wrapper must have, checked from the outside (forward hooks, gradients,
perturbations), not by restating a wrapper's internals. Each ``check_*`` raises AssertionError
naming what is wrong; ``tests/models/test_contract.py`` applies every check to every model, and
plants each mistake the checks exist for into every model to see it caught.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn
from transformers.pytorch_utils import Conv1D

from isoprobe.models.base import Forecast, ForecastModule

#: a window's observed values, in time order: neighbours differ in every digit the LLM writes
#: and in Chronos-T5's bins (see ``OBSERVED_ROW`` in test_contract.py), so that swapping any two
#: neighbours changes every model's input while keeping the values' multiset (so any scale)
DISTINCT_NEIGHBOURS = [4.56, 7.89, 1.23, 4.56] + [1.23, 4.56] * 13 + [10.0, 21.11]


def hidden_of(output) -> Tensor:
    """A module's representation: its output, or the first element of a tuple output."""
    return output[0] if isinstance(output, tuple | list) else output


def input_of(args: tuple, kwargs: dict) -> Tensor:
    """The hidden state a block reads: its first positional tensor, else its first tensor
    keyword argument."""
    tensors = [a for a in args if torch.is_tensor(a)]
    return tensors[0] if tensors else next(v for v in kwargs.values() if torch.is_tensor(v))


def stacks(model: ForecastModule) -> dict[str, list[str]]:
    """The block layers of ``probe_layers("block")`` by stack (``encoder``, ``decoder``), in
    their order, from the model's layer identities (not from the modules it lists)."""
    found: dict[str, list[str]] = {}
    for name, layer in model.probe_layer_identities("block").items():
        if layer.is_block:
            found.setdefault(layer.stack, []).append(name)
    return found


def observed_batch(rows: int, context: int, horizon: int) -> dict[str, Tensor]:
    """``rows`` fully observed windows of :data:`DISTINCT_NEIGHBOURS` (cut or repeated to
    ``context``)."""
    values = (DISTINCT_NEIGHBOURS * (context // len(DISTINCT_NEIGHBOURS) + 1))[-context:]
    window = torch.tensor(values)
    target = torch.linspace(2.0, 9.0, horizon)
    zeros = torch.zeros(rows)
    return {
        "context": window.repeat(rows, 1),
        "target": target.repeat(rows, 1),
        "loc": zeros,
        "scale": zeros + 1,
    }


# 1. blocks in order ---------------------------------------------------------------------------


def check_block_order(model: ForecastModule, batch: dict[str, Tensor]) -> None:
    """Within a stack, block ``i`` runs before block ``i + 1``, and block ``i``'s output is
    exactly block ``i + 1``'s input. (A layer that is a tap, whose output is its input, shows
    only the order: its input is its own block's output.)"""
    layers = model.probe_layers("block")
    read: dict[str, Tensor] = {}
    wrote: dict[str, Tensor] = {}
    order: list[str] = []
    handles = []
    for name, module in layers.items():

        def keep_input(_m, args, kwargs, name=name):
            read.setdefault(name, input_of(args, kwargs).detach().clone())

        def keep_output(_m, _args, output, name=name):
            if name not in wrote:
                order.append(name)
            wrote.setdefault(name, hidden_of(output).detach().clone())

        handles.append(module.register_forward_pre_hook(keep_input, with_kwargs=True))
        handles.append(module.register_forward_hook(keep_output))
    try:
        with torch.no_grad():
            model.probe_forward(batch)
    finally:
        for handle in handles:
            handle.remove()
    for names in stacks(model).values():
        ran = [n for n in order if n in names]
        assert ran == names, f"the blocks ran in the order {ran}, not {names}: out of order"
        for earlier, later in zip(names, names[1:], strict=False):
            if _same(read[later], wrote[later]):
                continue  # a tap: its input is its own block's output
            assert _same(wrote[earlier], read[later]), (
                f"{earlier}'s output is not {later}'s input: the blocks are out of order"
            )


def _same(a: Tensor, b: Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a, b)


# 2. each projection does what its name says ---------------------------------------------------


def _owner_and_features(model: ForecastModule, weight: Tensor) -> tuple[nn.Module, slice]:
    """The module that applies ``weight`` and the output features of that module that are
    ``weight``'s rows (a fused projection's part is a view of the module's matrix)."""
    parameter = weight if weight._base is None else weight._base
    owners = {id(p): m for m in model.modules() for p in m.parameters(recurse=False)}
    owner = owners[id(parameter)]
    offset = (weight.data_ptr() - parameter.data_ptr()) // parameter.element_size()
    # nn.Linear keeps [out, in] (a part's rows start at a multiple of the row length);
    # transformers' Conv1D keeps [in, out] (a part is a slice of columns)
    start = offset if isinstance(owner, Conv1D) else offset // parameter.stride(0)
    return owner, slice(start, start + weight.shape[0])


@contextmanager
def _added_at(module: nn.Module, features: slice, position: int, delta: Tensor) -> Iterator[None]:
    """``delta`` added to ``module``'s output ``features`` at token ``position`` (the
    second-to-last axis) while the context is open."""

    def add(_m, _args, output):
        hidden = hidden_of(output).clone()
        hidden[..., position, features] += delta.to(hidden.dtype)
        return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

    handle = module.register_forward_hook(add)
    try:
        yield
    finally:
        handle.remove()


def _attention_output(model: ForecastModule, block: str, batch: dict[str, Tensor]) -> Tensor:
    site = model.probe_layers("attention")[f"{block}.attn"]
    kept = []
    handle = site.register_forward_hook(lambda _m, _a, out: kept.append(hidden_of(out).clone()))
    try:
        with torch.no_grad():
            torch.manual_seed(0)
            model.probe_forward(batch)
    finally:
        handle.remove()
    return kept[0]


def _changed_positions(before: Tensor, after: Tensor) -> set[int]:
    """The token positions (second-to-last axis) where the two differ anywhere."""
    scale = 1e-6 * (1.0 + before.abs().max())
    moved = (after - before).abs().amax(dim=-1)
    moved = moved.reshape(-1, moved.shape[-1]).amax(dim=0)
    return set((moved > scale).nonzero().flatten().tolist())


def check_projection_roles(model: ForecastModule, batch: dict[str, Tensor]) -> None:
    """For every block's self-attention (:meth:`attention_weights`), each named projection
    changes the attention sub-layer's output (probe site ``<block>.attn``) the way its role says:

    - ``q``: a query perturbed at token ``t`` changes only output row ``t`` (query ``t`` only
      reweighs what token ``t`` reads), at every ``t`` tried, and some row at some ``t``;
    - ``k``: a key perturbed at ``t`` reweighs every query that sees ``t``, so at some ``t`` rows
      other than ``t`` change;
    - ``v``: a value perturbed in one feature at ``t`` also reaches other rows, and moves every
      changed row along one direction (the output projection of that one feature: the changes
      have rank 1), which a key does not;
    - ``o``: its module's output is the attention sub-layer's output.

    Tried at the first, middle and last real token (of :meth:`token_masks`), so that both
    causal and bidirectional attention show each role; the perturbation is large (a randomly
    initialised query is small, and a key's change is its product with the query). A stack with
    fewer than two real tokens (a one-step decoder) cannot tell query from key.
    """
    masks = model.token_masks(batch, list(model.attention_weights()))
    checked = 0
    for block, parts in model.attention_weights().items():
        reference = _attention_output(model, block, batch)
        real = masks[block].reshape(-1, masks[block].shape[-1])[0].nonzero().flatten().tolist()
        if len(real) < 2:
            continue
        checked += 1
        positions = sorted({real[0], real[len(real) // 2], real[-1]})
        changed: dict[str, dict[int, set[int]]] = {"q": {}, "k": {}}
        for role in changed:
            owner, features = _owner_and_features(model, parts[role])
            for t in positions:
                delta = torch.full((features.stop - features.start,), 1000.0)
                with _added_at(owner, features, t, delta):
                    after = _attention_output(model, block, batch)
                changed[role][t] = _changed_positions(reference, after)
        queries = changed["q"]
        assert all(rows <= {t} for t, rows in queries.items()) and any(queries.values()), (
            f"{block}: the projection named q is no query: perturbed at tokens {positions}, "
            f"it changed rows {queries}"
        )
        keys = changed["k"]
        assert any(rows - {t} for t, rows in keys.items()), (
            f"{block}: the projection named k is no key: perturbed at tokens {positions}, it "
            f"changed only rows {keys}"
        )
        owner, features = _owner_and_features(model, parts["v"])
        one = slice(features.start, features.start + 1)
        for t in positions:
            with _added_at(owner, one, t, torch.ones(1)):
                after = _attention_output(model, block, batch)
            rows = sorted(_changed_positions(reference, after) - {t})
            if rows:
                moves = (after - reference)[..., rows, :].reshape(-1, after.shape[-1])
                singular = torch.linalg.svdvals(moves.double())
                assert singular[1] <= 1e-4 * singular[0], (
                    f"{block}: the projection named v is no value: one feature perturbed at "
                    f"token {t} moved rows {rows} in more than one direction "
                    f"(singular values {singular[:3].tolist()})"
                )
                break
        else:
            raise AssertionError(f"{block}: the projection named v reached no other token")
        owner, _ = _owner_and_features(model, parts["o"])
        written: list[Tensor] = []
        handle = owner.register_forward_hook(
            lambda _m, _a, out, written=written: written.append(hidden_of(out))
        )
        try:
            out = _attention_output(model, block, batch)
        finally:
            handle.remove()
        assert any(w.shape == out.shape and torch.equal(w, out) for w in written), (
            f"{block}: the module of the projection named o does not write the attention "
            "sub-layer's output"
        )
    assert checked, "no self-attention reads two real tokens of these windows: use longer ones"


# 3. the head maps the last hidden state to the output -----------------------------------------


def _parameters(modules: list[nn.Module]) -> dict[int, nn.Parameter]:
    return {id(p): p for m in modules for p in m.parameters()}


def last_block(model: ForecastModule) -> str:
    """The last block of the last stack (``decoder`` where there is one): what the head reads."""
    found = stacks(model)
    stack = "decoder" if "decoder" in found else list(found)[-1]
    return found[stack][-1]


def check_head(model: ForecastModule, batch: dict[str, Tensor]) -> None:
    """Every head module reads the last block's output: in the loss's forward, its input
    depends on that output (a gradient flows from the input back to it). An input embedding
    declared as the head reads the raw values instead. (Checked through the head's input, not
    the loss's gradients: a loss may have terms that bypass the head, as Time-MoE's router
    balance loss does.)"""
    module = model.probe_layers("block")[last_block(model)]
    leaves: list[Tensor] = []

    def cut(_m, _args, output):
        leaf = hidden_of(output).detach().requires_grad_()
        leaves.append(leaf)
        return (leaf, *output[1:]) if isinstance(output, tuple) else leaf

    head = model.head_modules()
    assert head, "head_modules() is empty"
    read: dict[int, list[Tensor]] = {id(m): [] for m in head}
    handles = [module.register_forward_hook(cut)]
    for m in head:
        handles.append(
            m.register_forward_pre_hook(
                lambda mod, args, kwargs: read[id(mod)].append(input_of(args, kwargs)),
                with_kwargs=True,
            )
        )
    try:
        with torch.enable_grad():
            torch.manual_seed(0)
            model.loss(batch)
            for m in head:
                assert read[id(m)], f"head module {type(m).__name__} does not run in the loss"
                reached = False
                for tensor in read[id(m)]:
                    if not tensor.requires_grad:
                        continue
                    grads = torch.autograd.grad(
                        tensor.sum(), leaves, retain_graph=True, allow_unused=True
                    )
                    reached = reached or any(g is not None and g.any() for g in grads)
                assert reached, (
                    f"head module {type(m).__name__} does not read the last block's output: "
                    "the declared head is not what maps the last hidden state to the output"
                )
    finally:
        for handle in handles:
            handle.remove()


# 4. the input modules make the embedding ------------------------------------------------------


def check_input_modules(model: ForecastModule, batch: dict[str, Tensor]) -> None:
    """Every parameter that ``embed`` (the first block's input) depends on belongs to
    :meth:`input_modules`, and every input module with a trainable parameter contributes to it
    (a fixed sinusoidal position table has none)."""
    kept = []
    embed = model.probe_layers()["embed"]
    handle = embed.register_forward_hook(lambda _m, _a, out: kept.append(hidden_of(out)))
    model.zero_grad(set_to_none=True)
    try:
        with torch.enable_grad():
            torch.manual_seed(0)
            model.probe_forward(batch)
            weights = torch.randn(kept[0].shape, generator=torch.Generator().manual_seed(1))
            (kept[0] * weights).sum().backward()
    finally:
        handle.remove()
    declared = _parameters(model.input_modules())
    names = {id(p): n for n, p in model.named_parameters()}
    reached = [
        names[id(p)] for p in model.parameters() if p.grad is not None and p.grad.abs().sum() > 0
    ]
    outside = [n for n in reached if id(dict(model.named_parameters())[n]) not in declared]
    assert not outside, f"embed depends on parameters outside input_modules(): {outside}"
    for m in model.input_modules():
        trained = [p for p in m.parameters() if p.requires_grad]
        assert not trained or any(p.grad is not None and p.grad.abs().sum() > 0 for p in trained), (
            f"input module {type(m).__name__} does not contribute to embed"
        )
    model.zero_grad(set_to_none=True)


# 5. a forecast reads every observed step ------------------------------------------------------


def block_module(model: ForecastModule, block: str) -> nn.Module:
    """The module that runs ``block`` (a name of :meth:`attention_weights`): the largest module
    holding that block's query weight and no other block's (a probed layer may be a tap after
    the block, whose input is the block's output). A model without attention has no query to
    find it by: its block is the one :meth:`stack_blocks` lists under that name."""
    if not model.attends:
        layer = model.probe_layer_identities()[block]
        return model.stack_blocks(layer.stack)[layer.index]

    def parameter(w: Tensor) -> Tensor:
        return w if w._base is None else w._base

    queries = {name: id(parameter(parts["q"])) for name, parts in model.attention_weights().items()}
    own, others = queries.pop(block), set(queries.values())
    holders = [
        m
        for m in model.modules()
        if own in (ids := {id(p) for p in m.parameters()}) and not ids & others
    ]
    return max(holders, key=lambda m: sum(1 for _ in m.modules()))


def first_block(model: ForecastModule) -> nn.Module:
    """The block ``embed`` feeds: the first of :meth:`attention_weights`' blocks (for a model
    without attention, the first block of its first stack)."""
    if not model.attends:
        return model.stack_blocks(model.stacks[0])[0]
    return block_module(model, next(iter(model.attention_weights())))


class _Read(Exception):
    """Raised by a hook once it has what it came for, to stop the forward pass there."""


def _first_block_input(model: ForecastModule, window: dict[str, Tensor]) -> Tensor:
    """The first block's input in the first pass of a seeded forecast of ``window`` (the
    forecast stops there)."""
    kept: list[Tensor] = []

    def keep(_m, args, kwargs):
        kept.append(input_of(args, kwargs).detach().clone())
        raise _Read

    handle = first_block(model).register_forward_pre_hook(keep, with_kwargs=True)
    torch.manual_seed(11)
    try:
        with torch.no_grad():
            model.forecast(window)
    except _Read:
        pass
    finally:
        handle.remove()
    assert kept, "the forecast does not run the first block"
    return kept[0]


def check_forecast_reads_every_step(model: ForecastModule, context: int, horizon: int) -> None:
    """Swapping two neighbouring observed values (the same values, so the same scale) changes
    what the forecast reads, for every pair of neighbours ``(p, p + 1)``: the first block's input
    in the forecast's first pass. Each window is forecast alone: in a batch, one window can
    move another's tokens (left padding to the longest prompt). The tokens, not the forecast's
    numbers, are compared: a sampler's draws may not flip on a small change of its distribution,
    and swaps keep the scale, so a step the tokens ignore is a step the forecast ignores."""
    window = observed_batch(1, context, horizon)
    read = _first_block_input(model, window)
    unchanged = []
    for p in range(context - 1):
        swapped = {**window, "context": window["context"].clone()}
        swapped["context"][0, [p, p + 1]] = window["context"][0, [p + 1, p]]
        moved = _first_block_input(model, swapped)
        if moved.shape == read.shape and torch.equal(moved, read):
            unchanged.append(p)
    assert not unchanged, (
        f"the forecast ignores context steps: swapping steps (p, p+1) for p in {unchanged} "
        "(of a fully observed window) leaves the first block's input unchanged"
    )


# 6. real tokens at the first block of every stack ---------------------------------------------


def _stack_first_blocks(
    model: ForecastModule, batch: dict[str, Tensor]
) -> dict[str, tuple[Tensor, Tensor]]:
    """Stack -> (input, output) of its first block in :meth:`probe_forward` (its first run)."""
    kept: dict[str, tuple[Tensor, Tensor]] = {}
    handles = []
    for stack, names in stacks(model).items():

        def keep(_m, args, kwargs, output, stack=stack):
            wrote = output if torch.is_tensor(output) else output[0]  # a tuple or ModelOutput
            kept.setdefault(stack, (input_of(args, kwargs).clone(), wrote.clone()))

        module = block_module(model, names[0])
        handles.append(module.register_forward_hook(keep, with_kwargs=True))
    try:
        with torch.no_grad():
            torch.manual_seed(0)
            model.probe_forward(batch)
    finally:
        for handle in handles:
            handle.remove()
    return kept


def check_real_tokens_at_every_stack(
    model: ForecastModule, batch: dict[str, Tensor], moved: dict[str, Tensor]
) -> None:
    """At the first block of every stack, every position :meth:`token_masks` marks real
    changes when the window's observed values move to their neighbours' steps (``moved``: the
    same values, so the same scale): a position whose own value changes, and that does not
    change, carries no observed value. Read at the block's input, what the position brings to
    the stack itself (a decoder's teacher-forced target, a patch, a lagged step), so that a
    placeholder, which learns what it holds from the real tokens inside the block, shows as
    the constant it is. A one-position stack (Chronos-Bolt's decoder: a learned query whose
    output is the window's summary) has nothing of its own to read; it is read at the block's
    output, after its cross-attention has read the window."""
    names = stacks(model)
    masks = model.token_masks(batch, [blocks[0] for blocks in names.values()])
    before, after = _stack_first_blocks(model, batch), _stack_first_blocks(model, moved)
    for stack, blocks in names.items():
        real = masks[blocks[0]]
        side = 1 if real.shape[-1] == 1 else 0
        first, second = before[stack][side], after[stack][side]
        assert tuple(first.shape[:-1]) == tuple(real.shape), (
            f"{stack}: the mask {tuple(real.shape)} is not of the first block's positions "
            f"{tuple(first.shape[:-1])}"
        )
        idle = real & ~(first != second).any(dim=-1)
        assert not idle.any(), (
            f"{stack}: positions {idle.nonzero().tolist()} (indices of the mask) are marked real "
            "but do not change when the observed values move: they carry no observed value"
        )


# 7. the loss reads the target -----------------------------------------------------------------

#: what an observed target step is moved by: enough to move it to other tokens where the loss
#: reads the target as tokens (several of Chronos-T5's bins, another digit of the LLM's)
TARGET_STEP = 3.0


def _seeded_loss(model: ForecastModule, batch: dict[str, Tensor], target: Tensor) -> Tensor:
    torch.manual_seed(0)
    with torch.no_grad():
        return model.loss({**batch, "target": target})


def _fills(batch: dict[str, Tensor]) -> dict[str, Tensor]:
    """What a loss that trains missing target steps as values would put there, per window
    [B, 1]: 0 in the batch's units, or the context's observed mean (0 once centred)."""
    context = batch["context"]
    mean = context.nansum(dim=1, keepdim=True) / context.isfinite().sum(dim=1, keepdim=True)
    return {"zero": torch.zeros_like(mean), "the context's mean": mean}


def check_loss_reads_the_target(model: ForecastModule, batch: dict[str, Tensor]) -> None:
    """The loss reads every observed target step and leaves out every missing one: each
    observed step moved alone (by :data:`TARGET_STEP`) changes the loss, and each missing step
    filled alone with a value (0, or the context's mean: what a loss that trains gaps as zeros
    reads there, in the batch's units or once centred) changes it too, as a term the loss had
    left out now counts. Step by step, not by the gradient: a loss that reads the target as
    tokens (bins, digits) passes no gradient to it, and a gap's NaN has no value to move."""
    target = batch["target"]
    observed = target.isfinite()
    assert observed.any() and not observed.all(), "the windows need observed and missing steps"
    reference = _seeded_loss(model, batch, target)
    unread = []
    for row, step in observed.nonzero().tolist():
        moved = target.clone()
        moved[row, step] += TARGET_STEP
        if torch.equal(_seeded_loss(model, batch, moved), reference):
            unread.append([row, step])
    assert not unread, f"the loss does not read the observed target steps {unread} (window, step)"
    for fill, values in _fills(batch).items():
        trained = []
        for row, step in (~observed).nonzero().tolist():
            filled = target.clone()
            filled[row, step] = values[row, 0]
            if torch.equal(_seeded_loss(model, batch, filled), reference):
                trained.append([row, step])
        assert not trained, (
            f"the loss reads the missing target steps {trained} (window, step) as {fill}: "
            "filled with it, they change nothing"
        )


# 8. the head list is complete -----------------------------------------------------------------


def _is_norm(module: nn.Module) -> bool:
    """A normalisation layer (LayerNorm, RMSNorm, T5's LayerNorm, ...), by its class's name."""
    return "norm" in type(module).__name__.lower()


def _reached_past_the_last_block(model: ForecastModule, batch: dict[str, Tensor]) -> set[int]:
    """The parameters (ids) the loss's gradient reaches with the last block's output cut from
    the graph (detached): what maps that output to the loss, and what the loss reads beside
    it."""
    module = model.probe_layers("block")[last_block(model)]

    def cut(_m, _args, output):
        if torch.is_tensor(output):
            return output.detach()
        return (output[0].detach(), *output[1:])

    model.zero_grad(set_to_none=True)
    handle = module.register_forward_hook(cut)
    try:
        with torch.enable_grad():
            torch.manual_seed(0)
            model.loss(batch).backward()
    finally:
        handle.remove()
    reached = {id(p) for p in model.parameters() if p.grad is not None and p.grad.any()}
    model.zero_grad(set_to_none=True)
    return reached


def check_head_list_is_complete(model: ForecastModule, batch: dict[str, Tensor]) -> None:
    """Every parameter the loss reaches past the last block (its output cut from the graph)
    is in :meth:`head_modules`, unless it belongs to a block (a router's balance loss reaches
    every block), to :meth:`input_modules` (a head tied to the input embedding) or to a norm
    (the final norm the head reads): ``model.adapt=head_only`` then trains every layer that
    maps the last hidden state to the forecast (all of Time-MoE's horizons' heads, not the
    first alone)."""
    reached = _reached_past_the_last_block(model, batch)
    blocks = [block for stack in model.stacks for block in model.stack_blocks(stack)]
    blocks += [block_module(model, name) for name in model.attention_weights()]
    norms = [m for m in model.modules() if _is_norm(m)]
    exempt = _parameters(blocks + model.input_modules() + norms)
    head = _parameters(model.head_modules())
    missing = [
        name
        for name, p in model.named_parameters()
        if id(p) in reached and id(p) not in head and id(p) not in exempt
    ]
    assert not missing, (
        f"the loss reaches {missing} past the last block, yet head_modules() leaves them out: "
        "head_only would not train them"
    )


# 9. a horizon longer than one call ------------------------------------------------------------

#: the length of the stretch of a long forecast that must not repeat its first steps
REPEAT_SPAN = 8


def _forecast_and_runs(model: ForecastModule, batch: dict[str, Tensor]) -> tuple[Forecast, int]:
    """A seeded forecast of ``batch`` and how many times its last block ran (the calls)."""
    module = model.probe_layers("block")[last_block(model)]
    runs = []
    handle = module.register_forward_hook(lambda *_: runs.append(1))
    torch.manual_seed(11)
    try:
        with torch.no_grad():
            forecast = model.forecast(batch)
    finally:
        handle.remove()
    return forecast, len(runs)


def check_forecast_past_one_call(
    short: ForecastModule,
    long: ForecastModule,
    short_batch: dict[str, Tensor],
    long_batch: dict[str, Tensor],
) -> bool:
    """A forecast past the reach of one call (the largest head, the output patches one call
    writes) is finite, of its horizon's shape; where the model rolls it out (its last block
    runs more than once), what it forecasts first is fixed before it goes on: its first steps
    are, exactly, the forecast at the shorter horizon of ``short`` (the same windows, the same
    seed), so the pieces are joined in the order they were made, and no later stretch of
    :data:`REPEAT_SPAN` steps repeats its first ones, so each call reads the last one's
    output. Returns whether the forecast was rolled out: its last block ran more than once, or
    not as a module at all (Chronos-T5's sampler reads the weights itself)."""
    first, _ = _forecast_and_runs(short, short_batch)
    forecast, runs = _forecast_and_runs(long, long_batch)
    windows, steps = long_batch["context"].shape[0], long.prediction_length
    levels = len(long.quantile_levels)
    assert tuple(forecast.quantiles.shape) == (windows, levels, steps)
    assert tuple(forecast.median.shape) == (windows, steps)
    assert torch.isfinite(forecast.quantiles).all() and torch.isfinite(forecast.median).all(), (
        f"a forecast of {steps} steps is not finite"
    )
    if runs == 1:
        return False  # one call forecasts the whole horizon: nothing is rolled out
    horizon = short.prediction_length
    assert torch.equal(forecast.median[:, :horizon], first.median) and torch.equal(
        forecast.quantiles[..., :horizon], first.quantiles
    ), (
        f"the first {horizon} steps of a {steps}-step roll-out are not the {horizon}-step "
        "forecast: the roll-out's pieces are not joined in the order they were made"
    )
    median = forecast.median
    repeats = [
        start
        for start in range(1, steps - REPEAT_SPAN + 1)
        if torch.equal(median[:, start : start + REPEAT_SPAN], median[:, :REPEAT_SPAN])
    ]
    assert not repeats, (
        f"the roll-out repeats its first {REPEAT_SPAN} steps from steps {repeats}: a call "
        "does not read the last one's output"
    )
    return True
