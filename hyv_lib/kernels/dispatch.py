"""Masked attention over [B, H, S, D] with a [B, S] key-padding mask: which backends run here, and the one call that picks one."""

from __future__ import annotations

from typing import Any

import torch

from ..base.errors import HyvInputError
from ..parallel.mesh import target_platform
from ..parallel.sharding import per_shard
from ..parallel.transfer import numpy_to_torch, torch_to_numpy
from .host import host_sdpa_attention_jax
from .registry import BACKEND_OPTIONS, BACKENDS, CUDA_HALF_BACKENDS, JAX_BACKENDS, available_backends
from .torch_kernels import flash_attention, kv_zeroing_attention, reference_attention, sage_attention, sdpa_attention
from .xla import xla_attention_jax


def resolve_backend(backend: str, device: torch.device, dtype: torch.dtype | None = None) -> str:
    """``auto`` -> the best backend for tensors on ``device`` (of ``dtype``); any other name is checked and
    returned: it must run on this machine and take tensors of this device and dtype."""
    available = available_backends()
    if backend == "auto":
        if device.type == "jax":
            return "splash" if target_platform() == "tpu" else "xla"
        half = dtype in (None, torch.float16, torch.bfloat16)
        order = ("flash3", "flash", "sdpa") if device.type == "cuda" and half else ("sdpa",)
        return next(name for name in order if available[name] is None)
    if backend not in available:
        raise ValueError(f"backend must be 'auto' or one of {', '.join(BACKENDS)}; got {backend!r}")
    if available[backend] is not None:
        raise RuntimeError(f"attention backend {backend!r} cannot run here: {available[backend]}")
    if device.type == "jax" and backend not in JAX_BACKENDS:
        raise ValueError(f"torchax tensors (device 'jax') need a JAX backend: {', '.join(JAX_BACKENDS)}; "
                         f"got {backend!r}")
    if backend in CUDA_HALF_BACKENDS and (device.type != "cuda" or dtype not in (None, torch.float16,
                                                                                   torch.bfloat16)):
        raise ValueError(f"attention backend {backend!r} takes fp16 or bf16 CUDA tensors, got "
                         f"{'' if dtype is None else str(dtype).removeprefix('torch.') + ' '}tensors on {device.type}")
    return backend


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_mask: torch.Tensor | None = None, *,
    backend: str = "auto", **options: Any,
) -> torch.Tensor:
    """Masked attention over [B, H, S, D] tensors with a [B, S] key-padding mask (True = valid).

    ``backend``: ``auto`` (flash3 > flash > sdpa on CUDA, sdpa on CPU), ``reference`` (the fp32
    oracle, O(S^2) memory), ``sdpa``, ``flash``/``flash3`` (varlen via cu_seqlens), ``sage`` (lossy),
    ``splash`` (JAX Pallas Splash with segment ids; interpret mode off TPU; ``options`` are its block
    sizes), ``xla`` (blockwise online softmax in JAX; option ``block_kv``), ``host_sdpa`` (torch's CPU kernel
    called back from jitted JAX on the CPU backend), ``kv_zeroing`` (the inexact teaching scheme).
    torchax tensors (device ``jax``, inside a jitted step) go to ``splash``, ``xla`` or ``host_sdpa``;
    ``auto`` picks Splash on TPU, XLA elsewhere. Returns [B, H, S, D] in q's dtype.
    """
    if q.ndim != 4 or k.shape != q.shape or v.shape[:3] != q.shape[:3]:
        raise ValueError(f"q, k, v must be [B, H, S, D] of one shape; got {list(q.shape)}, {list(k.shape)}, "
                         f"{list(v.shape)}")
    b, _, s, _ = q.shape
    if kv_mask is None:
        kv_mask = torch.ones(b, s, dtype=torch.bool, device=q.device)
    if kv_mask.shape != (b, s):
        raise ValueError(f"kv_mask must be [B, S] = [{b}, {s}], got {list(kv_mask.shape)}")
    if kv_mask.dtype != torch.bool:  # an additive 0/-inf float mask cast to bool would invert it
        raise HyvInputError("kv_mask", f"must be a bool [B, S] key-padding mask (True = valid token), got dtype "
                                       f"{kv_mask.dtype}; from an additive 0/-inf mask use `mask == 0`, from 0/1 "
                                       f"integers `mask.bool()`")
    kv_mask = kv_mask.to(device=q.device)
    name = resolve_backend(backend, q.device, q.dtype)
    check_options(name, options)
    if q.device.type == "jax":
        return _call_jax_backend(name, q, k, v, kv_mask, options)
    if name == "reference":
        return reference_attention(q, k, v, kv_mask)
    if name == "sdpa":
        return sdpa_attention(q, k, v, kv_mask)
    if name in ("flash", "flash3"):
        return flash_attention(q, k, v, kv_mask, version=3 if name == "flash3" else 2)
    if name == "sage":
        return sage_attention(q, k, v, kv_mask)
    if name == "splash":
        from .splash import splash_attention

        return splash_attention(q, k, v, kv_mask, **options)
    if name in ("xla", "host_sdpa"):
        return _call_jax_backend(name, q, k, v, kv_mask, options, from_torch=True)
    return kv_zeroing_attention(q, k, v, kv_mask)


def check_options(backend: str, options: dict[str, Any]) -> None:
    """TypeError for options the backend does not take (``auto``: those no backend it can pick takes)."""
    valid = (set().union(*BACKEND_OPTIONS.values()) if backend == "auto" else set(BACKEND_OPTIONS.get(backend, ())))
    unknown = sorted(set(options) - valid)
    if unknown and not valid:
        raise TypeError(f"backend {backend!r} takes no options; got {unknown}")
    if unknown:
        raise TypeError(f"backend {backend!r} takes the options {', '.join(sorted(valid))}; got {unknown}")


def _call_jax_backend(name, q, k, v, kv_mask, options, from_torch=False):
    """Run a JAX kernel on torchax tensors (zero-copy views) or, ``from_torch``, on CPU torch tensors."""
    import functools

    from torchax.interop import call_jax

    if name == "splash":
        from .splash import splash_attention_jax as kernel
    elif name == "host_sdpa":
        kernel = functools.partial(host_sdpa_attention_jax, host_kernel=sdpa_attention)
    else:
        kernel = xla_attention_jax
    fn = functools.partial(kernel, **options)
    if not from_torch:
        return call_jax(per_shard(fn), q, k, v, kv_mask)
    import jax.numpy as jnp

    def to_jax(t):  # the kernel computes in float32 (bf16 converts exactly); the result is cast back to q's dtype
        return jnp.asarray(torch_to_numpy(t.float() if t.is_floating_point() else t))

    out = fn(*(to_jax(t) for t in (q, k, v, kv_mask)))
    return numpy_to_torch(out).to(device=q.device, dtype=q.dtype)
