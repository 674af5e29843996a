"""Masked attention over [B, H, S, D] with a [B, S] key-padding mask: which registered backends run here, and the one
call that picks one."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch

from ..base.errors import HyvInputError
from ..parallel.mesh import target_platform
from ..parallel.sharding import per_shard
from . import jax_kernels, splash, ssta_torch, torch_kernels  # noqa: F401 - importing them registers the built-in backends
from .registry import BACKENDS


def available_backends() -> dict[str, str | None]:
    """Backend name -> None if it can run here, else the reason it cannot (and how to get it): from the registry."""
    return {name: backend.unavailable() for name, backend in BACKENDS.items()}


def jax_backends() -> tuple[str, ...]:
    """The backends a jitted torchax step can call (they take device ``jax`` tensors)."""
    return tuple(name for name, backend in BACKENDS.items() if backend.jax_kernel is not None)


@dataclass(frozen=True)
class GpuOrder:
    """``auto``'s order of the exact CUDA backends on GPUs of at least ``min_capability``, and the measurement
    behind it (the first that runs here and takes the tensors is used)."""

    min_capability: tuple[int, int]
    backends: tuple[str, ...]
    reason: str


#: ``auto`` on CUDA, newest GPU generation first: the first entry whose ``min_capability`` the GPU has decides.
GPU_ORDERS = (
    GpuOrder((9, 0), ("sdpa", "flash3", "flash", "torch_varlen"),
             "Hopper and newer: torch's SDPA runs cuDNN's fused attention, measured fastest on one H200 (torch 2.11, "
             "the real 720p/121f joint attention: SDPA 366.5 ms, 557.7 TFLOP/s, against torch_varlen's FlashAttention-2 "
             "586.2 ms, 348.7 TFLOP/s; benchmarks/results/gpu_check_2026-11-26_H200_run2.json; a probe outside the "
             "repository timed torch's FlashAttention-2 path at 281 ms against SDPA's 178 ms for one 720p sample). "
             "FlashAttention-3 has not been measured here, so it comes after SDPA: force it with --attention flash3"),
    GpuOrder((0, 0), ("flash", "sdpa", "torch_varlen"),
             "before Hopper (Ampere, Ada): not measured by this project. SDPA has no cuDNN kernel to pick there and "
             "runs FlashAttention-2 itself, so flash-attn's varlen call (one launch for the batch) comes first when "
             "installed, then SDPA per sample"),
)


def gpu_order(device: torch.device) -> GpuOrder:
    """The :data:`GPU_ORDERS` entry for the CUDA GPU ``device`` (by its compute capability)."""
    capability = torch.cuda.get_device_capability(device)
    return next(entry for entry in GPU_ORDERS if capability >= entry.min_capability)


def sdpa_kernel(device: torch.device, dtype: torch.dtype, head_dim: int, heads: int = 1) -> str:
    """Which kernel torch's ``scaled_dot_product_attention`` picks for an unmasked [1, heads, 256, head_dim] query of
    ``dtype`` on ``device``, as the ``sdpa`` backend calls it: ``cudnn``, ``flash``, ``efficient``, ``math`` or
    ``overrideable`` (torch's own choice function, the one SDPA calls)."""
    q = torch.zeros(1, heads, 256, head_dim, device=device, dtype=dtype)
    choice = torch.nn.attention.SDPBackend(torch._fused_sdp_choice(q, q, q))
    return {"CUDNN_ATTENTION": "cudnn", "FLASH_ATTENTION": "flash", "EFFICIENT_ATTENTION": "efficient",
            "MATH": "math", "OVERRIDEABLE": "overrideable"}.get(choice.name, choice.name.lower())


def kernel_record(backend: str, device: torch.device, dtype: torch.dtype, head_dim: int | None = None) -> dict[str, Any]:
    """What attention ``backend`` runs as for a model on ``device`` in ``dtype`` (generation_config.json's
    ``attention_kernel``): the resolved backend, SDPA's own kernel choice when it is ``sdpa`` (``head_dim`` given),
    and on CUDA with ``auto`` the reason for the order it picked by."""
    name = "diffusers" if backend == "diffusers" else resolve_backend(backend, device, dtype)
    record: dict[str, Any] = {"backend": name}
    if name == "sdpa" and head_dim:
        record["sdpa_kernel"] = sdpa_kernel(device, dtype, head_dim)
    if backend == "auto" and device.type == "cuda":
        record["auto_order"] = list(gpu_order(device).backends)
    return record


def resolve_backend(backend: str, device: torch.device, dtype: torch.dtype | None = None) -> str:
    """``auto`` -> the best backend for tensors on ``device`` (of ``dtype``); any other name is checked and
    returned: it must run on this machine and take tensors of this device and dtype."""
    available = available_backends()
    if backend == "auto":
        if device.type == "jax":
            return "splash" if target_platform() == "tpu" else "xla"
        order = gpu_order(device).backends if device.type == "cuda" else ("sdpa",)
        chosen = next((name for name in order if available[name] is None and BACKENDS[name].takes(device, dtype) is None),
                      None)
        if chosen is None:
            reasons = "; ".join(f"{name}: {available[name] or BACKENDS[name].takes(device, dtype)}" for name in order)
            raise RuntimeError(f"no exact attention backend for {str(dtype).removeprefix('torch.')} tensors on "
                               f"{device.type} runs here ({reasons})")
        return chosen
    if backend not in available:
        raise ValueError(f"backend must be 'auto' or one of {', '.join(BACKENDS)}; got {backend!r}")
    if available[backend] is not None:
        raise RuntimeError(f"attention backend {backend!r} cannot run here: {available[backend]}")
    mismatch = BACKENDS[backend].takes(device, dtype)
    if mismatch is not None:
        raise ValueError(f"attention backend {backend!r} {mismatch}")
    return backend


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_mask: torch.Tensor | None = None, *,
    backend: str = "auto", **options: Any,
) -> torch.Tensor:
    """Masked attention over [B, H, S, D] tensors with a [B, S] key-padding mask (True = valid).

    ``backend``: ``auto`` (on CUDA by GPU generation, :data:`GPU_ORDERS`: sdpa > flash3 > flash > torch_varlen on
    Hopper and newer, flash > sdpa > torch_varlen before; sdpa on CPU), ``reference`` (the fp32
    oracle, O(S^2) memory), ``sdpa``, ``flash``/``flash3`` (varlen via cu_seqlens), ``torch_varlen`` (PyTorch's
    varlen flash attention, torch >= 2.10), ``sage`` (lossy),
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
    chosen = BACKENDS[name]
    if q.device.type == "jax":  # inside a jitted torchax step: the JAX kernel on zero-copy views, per shard
        from torchax.interop import call_jax

        return call_jax(per_shard(functools.partial(chosen.jax_kernel, **options)), q, k, v, kv_mask)
    return chosen.kernel(q, k, v, kv_mask, **options)


def check_options(backend: str, options: dict[str, Any]) -> None:
    """TypeError for options the backend does not take (``auto``: those no backend it can pick takes)."""
    valid = set().union(*(b.options for b in BACKENDS.values())) if backend == "auto" else set(BACKENDS[backend].options)
    unknown = sorted(set(options) - valid)
    if unknown and not valid:
        raise TypeError(f"backend {backend!r} takes no options; got {unknown}")
    if unknown:
        raise TypeError(f"backend {backend!r} takes the options {', '.join(sorted(valid))}; got {unknown}")
