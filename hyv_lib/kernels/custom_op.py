"""hyv_lib's masked attention as one opaque torch operator (``torch.ops.hyv.attention``), so that torch.compile traces
a transformer block through its attention call without a graph break.

The eager kernels decide per call in Python (``int(valid.sum())`` and ``.nonzero()`` for each sample's valid tokens,
an installed package, SSTA's tile choice), which dynamo cannot trace: every such line would split a compiled block
into several graphs. Inside ``torch.compile`` the processors call :class:`CompilableAttention`, which emits this one
custom op instead; dynamo and inductor see an opaque call whose output has q's shape and dtype (``register_fake``),
and the op runs :func:`hyv_lib.kernels.dispatch.attention` eagerly when the compiled code reaches it. Outside
``torch.compile`` (eager torch, torchax's JAX jit) the same object calls :func:`~hyv_lib.kernels.dispatch.attention`
directly.

A custom op's schema takes tensors, strings, ints and lists of ints, not a backend's option objects (an
:class:`hyv_lib.SstaConfig`): the options are bound outside the graph, interned once in :data:`OPTION_SETS` when a
processor is built, and the op receives their index; SSTA's token grid, which changes with the video's shape, is
an ``int[]`` argument.
"""

from __future__ import annotations

from typing import Any

import torch

from .dispatch import attention

#: The backends' option sets that compiled attention calls refer to by index (``OPTION_SETS[0]`` is no options). A
#: set is added once per distinct value by :func:`options_key`, when a processor is built: never inside a trace.
OPTION_SETS: list[dict[str, Any]] = [{}]
_KEYS: dict[tuple, int] = {(): 0}


def options_key(options: dict[str, Any]) -> int:
    """The index of ``options`` in :data:`OPTION_SETS` (added on first sight; equal option sets share an index, so
    identical blocks guard on the same int and share one compiled graph). Values must be hashable (SstaConfig is
    frozen); a TypeError names an option that is not."""
    if "grid" in options:
        raise TypeError("grid is a per-call argument of the attention op, not a bound option")
    frozen = tuple(sorted(options.items()))
    try:
        key = _KEYS.get(frozen)
    except TypeError:
        unhashable = [name for name, value in frozen if not _hashable(value)]
        raise TypeError(f"attention options {unhashable} are not hashable: a compiled attention call binds its "
                        "options by value") from None
    if key is None:
        key = _KEYS[frozen] = len(OPTION_SETS)
        OPTION_SETS.append(dict(options))
    return key


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


@torch.library.custom_op("hyv::attention", mutates_args=())
def attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_mask: torch.Tensor | None, backend: str,
                 grid: list[int], options: int) -> torch.Tensor:
    """``torch.ops.hyv.attention``: :func:`hyv_lib.kernels.dispatch.attention` of [B, H, S, D] tensors with the
    option set ``OPTION_SETS[options]`` and, when ``grid`` is not empty, SSTA's token grid (t, h, w). Returns a new
    contiguous [B, H, S, D_v] tensor in q's dtype (the layout the fake implementation promises inductor)."""
    extra = {"grid": tuple(grid)} if grid else {}
    out = attention(q, k, v, kv_mask, backend=backend, **OPTION_SETS[options], **extra).to(q.dtype)
    inputs = {x.untyped_storage().data_ptr() for x in (q, k, v)}
    if out.untyped_storage().data_ptr() in inputs:  # a custom op's output may not alias an input
        return out.clone(memory_format=torch.contiguous_format)
    return out.contiguous()


@attention_op.register_fake
def _attention_fake(q, k, v, kv_mask, backend, grid, options):
    return q.new_empty(*q.shape[:3], v.shape[-1])


class CompilableAttention:
    """One attention backend with its options bound (``backend``, ``options``, their :func:`options_key`), called
    like :func:`hyv_lib.kernels.dispatch.attention`: ``call(q, k, v, kv_mask, grid=None)``. Under ``torch.compile``
    the call is the opaque ``torch.ops.hyv.attention`` (no graph break); elsewhere the eager dispatch itself."""

    def __init__(self, backend: str = "auto", **options: Any):
        self.backend, self.options = backend, options
        self.key = options_key(options)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_mask: torch.Tensor | None = None,
                 grid: tuple[int, int, int] | None = None) -> torch.Tensor:
        if torch.compiler.is_compiling():
            return torch.ops.hyv.attention(q, k, v, kv_mask, self.backend, list(grid or ()), self.key)
        extra = {} if grid is None else {"grid": grid}
        return attention(q, k, v, kv_mask, backend=self.backend, **self.options, **extra)
