"""Reading a pickle a user is handed without running any of its code: the standard library's
"restricting globals" recipe. An unpickler resolves only the globals an allow-list names (the
tensor rebuilders, containers) and turns the classes a reader declares foreign (gluonts' in a
Lag-Llama checkpoint, TOTEM's modules in a whole-module pickle) into inert stand-ins that keep
the state the pickle gives them; any other global is refused by name before anything of it runs.

:func:`allow_list_pickle` makes what ``torch.load`` takes as its ``pickle_module``: both its
``Unpickler`` (a zip archive's ``data.pkl``) and its ``load`` (a legacy file's header records)
go through the allow-list, so a payload anywhere in the file is refused."""

from __future__ import annotations

import collections
import functools
import pickle
import types
from collections.abc import Callable, Mapping
from typing import Any

import torch


class PickledObject:
    """An inert stand-in for a class a pickle names: it keeps the arguments and state the
    pickle gives it and runs no code of the original class."""

    qualified_name = ""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args, self.kwargs = args, kwargs

    def __setstate__(self, state: Any) -> None:
        self.state = state


@functools.cache
def stand_in(module: str, name: str) -> type:
    """The stand-in class (a :class:`PickledObject`) for ``module.name``, one per name."""
    return type(name, (PickledObject,), {"qualified_name": f"{module}.{name}"})


#: what every torch file needs: tensors and parameters rebuilt from storages, ordered dicts
TENSOR_GLOBALS: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("torch._utils", "_rebuild_tensor_v2"): torch._utils._rebuild_tensor_v2,
    ("torch._utils", "_rebuild_parameter"): torch._utils._rebuild_parameter,
    ("torch", "Size"): torch.Size,
}


def allow_list_pickle(
    allowed: Mapping[tuple[str, str], Any],
    stands_in: Callable[[str, str], bool],
    subject: str,
) -> types.SimpleNamespace:
    """A ``pickle_module`` for ``torch.load``: globals in ``allowed`` ((module, name) -> what
    they unpickle as), inert stand-ins for those ``stands_in(module, name)`` accepts, and for
    anything else an ``UnpicklingError`` saying that ``subject`` (``the checkpoint``) pickles
    ``module.name``, which is not on the allow-list."""

    class AllowListUnpickler(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            if (module, name) in allowed:
                return allowed[module, name]
            if stands_in(module, name):
                return stand_in(module, name)
            raise pickle.UnpicklingError(
                f"{subject} pickles {module}.{name}, which is not on the allow-list"
            )

    def load(file: Any, **kwargs: Any) -> Any:
        return AllowListUnpickler(file, **kwargs).load()

    return types.SimpleNamespace(
        Unpickler=AllowListUnpickler, load=load, __name__="isoprobe_allow_list_pickle"
    )
