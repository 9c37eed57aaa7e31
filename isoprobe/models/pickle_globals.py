"""The globals a pickled file would import, read without unpickling it: what a refusal of a
checkpoint names when ``torch.load(weights_only=True)`` will not read it.

A pickle calls code only through the globals it imports (``GLOBAL``, ``INST`` and
``STACK_GLOBAL`` opcodes, the last taking the module and the name from the two strings pushed
before it); :func:`pickle_globals` lists them by walking the opcodes with :mod:`pickletools`, which
executes nothing. :func:`refused_globals` keeps those ``torch.load(weights_only=True)`` refuses.
"""

from __future__ import annotations

import io
import pickletools
import re
import zipfile
from pathlib import Path
from typing import IO

from torch._weights_only_unpickler import _get_allowed_globals

#: the opcodes that push a string, that copy a memo entry onto the stack, and that store one
_STRINGS = {
    "STRING",
    "BINSTRING",
    "SHORT_BINSTRING",
    "UNICODE",
    "BINUNICODE",
    "SHORT_BINUNICODE",
    "BINUNICODE8",
}
_GETS = {"GET", "BINGET", "LONG_BINGET"}
_PUTS = {"PUT", "BINPUT", "LONG_BINPUT"}
#: torch's legacy (non-zip) format: magic number, protocol, system info, the object, storage keys
_LEGACY_RECORDS = 5


def _record_globals(stream: IO[bytes]) -> list[str]:
    """``module.name`` of each global one pickle record imports, in order (``?`` for a part of
    a ``STACK_GLOBAL`` that is not a plain string)."""
    found: list[str] = []
    stack: list[object] = []  # what each opcode pushed, strings kept, anything else None
    memo: dict[int, object] = {}
    for opcode, argument, _ in pickletools.genops(stream):
        name = opcode.name
        if name in _STRINGS:
            stack.append(argument)
        elif name in _GETS:
            stack.append(memo.get(argument))
        elif name in _PUTS:
            memo[argument] = stack[-1] if stack else None
        elif name == "MEMOIZE":
            memo[len(memo)] = stack[-1] if stack else None
        elif name in ("GLOBAL", "INST"):
            found.append(".".join(str(argument).split(" ", 1)))
            stack.append(None)
        elif name == "STACK_GLOBAL":
            parts = [stack.pop() if stack else None for _ in range(2)][::-1]
            found.append(".".join(p if isinstance(p, str) else "?" for p in parts))
            stack.append(None)
        elif opcode.stack_after:
            stack.append(None)
    return found


def _records_globals(stream: IO[bytes], records: int) -> list[str]:
    """The globals of the first ``records`` pickle records of ``stream``, each once."""
    found: list[str] = []
    for _ in range(records):
        try:
            found += _record_globals(stream)
        except (ValueError, EOFError):  # not (or no longer) a pickle
            break
    return list(dict.fromkeys(found))


def pickle_globals(path: Path) -> list[str]:
    """Every global the pickles in ``path`` import, each once, in order: a ``torch.save`` zip
    archive's ``data.pkl``, else the file's first pickle records (torch's legacy format, or a
    bare pickle). Reading stops quietly where the bytes stop being a pickle."""
    try:
        with zipfile.ZipFile(path) as archive:
            member = next((n for n in archive.namelist() if n.endswith("data.pkl")), None)
            if member is None:
                return []
            return _records_globals(io.BytesIO(archive.read(member)), 1)
    except zipfile.BadZipFile:
        pass
    with path.open("rb") as stream:
        return _records_globals(stream, _LEGACY_RECORDS)


def refused_globals(err: BaseException, path: Path | None = None) -> list[str]:
    """The globals ``torch.load(weights_only=True)`` refuses: the one its error ``err`` names
    (it names one in two wordings), else those the file at ``path`` imports that torch does not
    allow by default (its error names none where it stops at an opcode first)."""
    named = re.findall(r"GLOBAL (\S+)", str(err))
    if named:
        return named[:1]
    if path is None or not path.is_file():
        return []
    allowed = _get_allowed_globals()
    # protocol 2 writes Python 3's builtins under their Python 2 module name, read back as builtins
    found = [re.sub(r"^__builtin__\.", "builtins.", name) for name in pickle_globals(path)]
    return [name for name in found if name not in allowed]
