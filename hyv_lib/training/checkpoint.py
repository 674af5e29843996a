"""Training checkpoints: a nested state of tensors and plain values in one safetensors file, written atomically."""

from __future__ import annotations

import json
import os
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from ..base.errors import HyvInputError
from ..base.files import atomic_path

#: The checkpoint of a training run, in its output folder (the latest one; each save replaces it whole).
CHECKPOINT_FILE = "checkpoint.safetensors"
FORMAT = "hyv_lib.train_checkpoint/1"
_TREE, _FORMAT, _INFO = "hyv_lib_tree", "format", "hyv_lib_info"


def flatten(tree: Any) -> tuple[dict[str, torch.Tensor], Any]:
    """(tensors by generated key, a JSON skeleton) of a nested ``tree`` of dicts (int or str keys), lists, tuples,
    tensors and JSON values (None, bool, int, float, str). :func:`unflatten` rebuilds it exactly: key types, tuple vs
    list, tensor dtypes and shapes (each tensor copied to the CPU and made contiguous)."""
    tensors: dict[str, torch.Tensor] = {}

    def walk(node: Any) -> Any:
        if isinstance(node, torch.Tensor):
            key = f"t{len(tensors)}"
            tensors[key] = node.detach().to("cpu", copy=True).contiguous()
            return {"T": key}
        if isinstance(node, dict):
            for k in node:
                if not isinstance(k, (str, int)) or isinstance(k, bool):
                    raise TypeError(f"checkpoint: dict key {k!r} is neither str nor int")
            return {"d": [[k, walk(v)] for k, v in node.items()]}
        if isinstance(node, (list, tuple)):
            return {"l" if isinstance(node, list) else "u": [walk(v) for v in node]}
        if node is None or isinstance(node, (bool, int, float, str)):
            return {"v": node}
        raise TypeError(f"checkpoint: cannot store a {type(node).__name__}")

    return tensors, walk(tree)


def unflatten(skeleton: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """The tree :func:`flatten` took apart."""
    (kind, value), = skeleton.items()
    if kind == "T":
        return tensors[value]
    if kind == "d":
        return {k: unflatten(v, tensors) for k, v in value}
    if kind == "l":
        return [unflatten(v, tensors) for v in value]
    if kind == "u":
        return tuple(unflatten(v, tensors) for v in value)
    return value


def save_checkpoint(path: str, state: dict[str, Any], info: dict[str, Any] | None = None) -> str:
    """Write ``state`` (:func:`flatten`-able) and ``info`` (a JSON dict: what made the run, its step) to ``path``,
    atomically (a crash leaves the previous checkpoint or the new one, never a mix); returns ``path``."""
    from safetensors.torch import save

    tensors, skeleton = flatten(state)
    metadata = {_FORMAT: FORMAT, _TREE: json.dumps(skeleton), _INFO: json.dumps(info or {}, sort_keys=True)}
    data = save(tensors, metadata=metadata)
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
    return path


def read_info(path: str, argument: str = "output_dir") -> dict[str, Any]:
    """The ``info`` of the checkpoint at ``path`` without reading its tensors (a HyvInputError naming ``argument`` for
    a file that is not a hyv_lib training checkpoint)."""
    try:
        with safe_open(path, "pt") as f:
            metadata = f.metadata() or {}
        if metadata.get(_FORMAT) != FORMAT:
            raise ValueError(f"format {metadata.get(_FORMAT)!r}, expected {FORMAT}")
        return json.loads(metadata[_INFO])
    except (SafetensorError, OSError, ValueError, KeyError) as err:
        raise HyvInputError(argument, f"{path!r} is not a readable training checkpoint ({err}); remove it to start "
                                      "the run again, or use another folder") from None


def load_checkpoint(path: str, argument: str = "output_dir") -> tuple[dict[str, Any], dict[str, Any]]:
    """(state, info) of the checkpoint at ``path``, as :func:`save_checkpoint` was given them."""
    from safetensors.torch import load

    info = read_info(path, argument)
    try:
        with open(path, "rb") as f:
            tensors = load(f.read())
        with safe_open(path, "pt") as f:
            skeleton = json.loads((f.metadata() or {})[_TREE])
    except (SafetensorError, OSError, ValueError, KeyError) as err:
        raise HyvInputError(argument, f"{path!r} is not a readable training checkpoint ({err}); remove it to start "
                                      "the run again, or use another folder") from None
    return unflatten(skeleton, tensors), info


def checkpoint_path(output_dir: str) -> str:
    """Where a run in ``output_dir`` keeps its checkpoint."""
    return os.path.join(output_dir, CHECKPOINT_FILE)
