"""Whether a module's lean evaluation forward may run in place of the official one
(:mod:`isoprobe.models.t5_stack`, :mod:`isoprobe.models.patchtst_encoder`): only where nothing
could tell the difference, no submodule training and no hook that would see a call."""

from __future__ import annotations

from torch import nn
from torch.nn.modules import module as torch_module


def watched_or_training(stack: nn.Module) -> bool:
    """Whether a submodule of the stack trains (its dropout, an adapter's) or a hook would see
    its call (the stack's own hooks run around its forward either way), or a global module hook
    any call."""
    if (
        torch_module._global_forward_hooks
        or torch_module._global_forward_pre_hooks
        or torch_module._global_backward_hooks
        or torch_module._global_backward_pre_hooks
    ):
        return True
    pending = list(stack._modules.values())
    while pending:
        module = pending.pop()
        if module is None:
            continue
        if (
            module.training
            or module._forward_hooks
            or module._forward_pre_hooks
            or module._backward_hooks
            or module._backward_pre_hooks
        ):
            return True
        pending.extend(module._modules.values())
    return False
