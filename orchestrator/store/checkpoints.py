"""Checkpoints of a run directory: state dicts under ``checkpoints/<name>.pt`` or ``.json``, never unpickled.

docs/event-log.md (the run directory's layout): a state that holds tensors (or int keys, tuples) is written
with `torch.save` and read with ``weights_only=True``; any other is plain JSON. Only the types `weights_only`
reads back without unpickling code are accepted, and a write is atomic. A checkpoint speeds a resume up; the
event log alone is the run's record (ARCHITECTURE.md "The path of one evaluation", step 6).
"""

from __future__ import annotations

import io
import json
import os
import re
from collections.abc import Mapping
from typing import Any

from orchestrator.store.errors import StoreError, _first_line

_CHECKPOINT_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def save_checkpoint(backend: Any, name: str, state: dict) -> None:
    """Save `state` on `backend` atomically: `torch.save` if it holds tensors (or int keys, tuples), JSON
    otherwise.

    Only tensors, dicts with string keys, lists, tuples, str, int, float, bool and None are accepted,
    which is exactly what `torch.load(weights_only=True)` reads back without unpickling code.

    Raises:
        StoreError: a bad name, or a value of another type (the message names its key path).
    """
    _check_checkpoint_name(name)
    if not isinstance(state, Mapping):
        raise StoreError(f"checkpoint {name!r} must be a dict; got {type(state).__name__}")
    if _check_state(state, f"checkpoint {name!r}"):  # tensors, int keys or tuples: JSON would not keep them
        import torch

        buf = io.BytesIO()
        torch.save(dict(state), buf)
        new, old, data = "pt", "json", buf.getvalue()
    else:
        new, old, data = "json", "pt", json.dumps(state, allow_nan=True).encode()
    # the other format's file goes first: `load_checkpoint` prefers .pt, so a crash between the two steps
    # must leave no checkpoint (a cold start) rather than a stale one that would be loaded as current
    backend.delete(f"checkpoints/{name}.{old}")
    backend.write_atomic(f"checkpoints/{name}.{new}", data)

def load_checkpoint(backend: Any, name: str) -> dict | None:
    """The state saved on `backend` under `name`, or None if there is none. Never unpickles code.

    Raises:
        StoreError: the file exists but cannot be read safely (corrupt, or holds non-weights objects).
    """
    _check_checkpoint_name(name)
    if backend.exists(f"checkpoints/{name}.pt"):
        import torch

        data = backend.read(f"checkpoints/{name}.pt")
        try:
            state = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
        except Exception as exc:  # noqa: BLE001 -- UnpicklingError, RuntimeError of a torn zip, ...
            raise StoreError(
                f"checkpoint {name!r} cannot be loaded safely ({type(exc).__name__}: {_first_line(exc)})"
            ) from None
    elif backend.exists(f"checkpoints/{name}.json"):
        try:
            state = json.loads(backend.read(f"checkpoints/{name}.json"))
        except (ValueError, UnicodeDecodeError) as exc:
            raise StoreError(f"checkpoint {name!r} is not valid JSON: {_first_line(exc)}") from None
    else:
        return None
    if not isinstance(state, dict):
        raise StoreError(f"checkpoint {name!r} holds a {type(state).__name__}, not a dict")
    return state


def checkpoint_names(backend: Any) -> list[str]:
    """Names of the checkpoints saved on `backend`."""
    names = {os.path.splitext(n)[0] for n in backend.listdir("checkpoints") if n.endswith((".pt", ".json"))}
    return sorted(n for n in names if not n.startswith("."))


def _check_checkpoint_name(name: Any) -> None:
    if not isinstance(name, str) or not _CHECKPOINT_NAME_RE.match(name):
        raise StoreError(
            f"checkpoint name must be 1-128 characters of letters, digits, '_', '.', '-' (not starting with "
            f"'.' or '-'); got {name!r}"
        )


def _check_state(value: Any, where: str) -> bool:
    """Raise StoreError if `value` holds a type weights_only cannot load; return whether JSON would not keep
    it
    as it is: it holds tensors, or non-str keys or tuples, which JSON turns into strings and lists (a
    checkpoint would come back changed, and keys 1 and "1" would merge into one)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return False
    if type(value).__module__.startswith("torch"):
        import torch

        if isinstance(value, torch.Tensor):
            return True
    if isinstance(value, Mapping):
        found = False
        for k, v in value.items():
            if not isinstance(k, (str, int)):
                raise StoreError(f"{where} has a key {k!r} of type {type(k).__name__}; use str or int keys")
            found = _check_state(v, f"{where}[{k!r}]") or not isinstance(k, str) or found
        if not isinstance(value, dict):
            raise StoreError(f"{where} is a {type(value).__name__}; use a plain dict")
        return found
    if isinstance(value, (list, tuple)):
        found = isinstance(value, tuple)
        for i, v in enumerate(value):
            found = _check_state(v, f"{where}[{i}]") or found
        return found
    raise StoreError(
        f"{where} is a {type(value).__name__}; checkpoints hold only tensors, dicts, lists, tuples, str, "
        "int, float, bool and None (convert numpy arrays with torch.as_tensor)"
    )

