"""The attention backends: their names, the options each takes, and which of them can run on this machine (and why not)."""

from __future__ import annotations

import importlib.util

import torch

from ..parallel.jax_env import default_backend

#: Exact backends, the lossy one (sage), and the teaching approximation (kv_zeroing).
BACKENDS = ("reference", "sdpa", "flash", "flash3", "sage", "splash", "xla", "host_sdpa", "kv_zeroing")
#: Backends that accept torchax tensors (device "jax") inside a jitted step.
JAX_BACKENDS = ("splash", "xla", "host_sdpa")
#: The options each backend takes (the others take none).
BACKEND_OPTIONS = {"splash": ("block_q", "block_kv", "block_kv_compute", "interpret", "compute_dtype"),
                   "xla": ("block_kv",)}


# ------------------------------------------------------------------------------------------ availability
def _missing(package: str, how: str) -> str | None:
    return None if importlib.util.find_spec(package) else f"package {package!r} is not installed ({how})"


def _needs_cuda(package: str, how: str) -> str | None:
    reason = _missing(package, how)
    if reason is None and not torch.cuda.is_available():
        reason = "needs an NVIDIA GPU (torch.cuda.is_available() is False)"
    return reason


def _needs_cpu_jax() -> str | None:
    """host_sdpa's extra condition, checked only once JAX is imported (importing it costs torch-only users)."""
    import sys

    if "jax" not in sys.modules:
        return None

    backend = default_backend()
    return None if backend == "cpu" else f"calls torch from jitted code: needs JAX on the CPU, not {backend!r}"


def available_backends() -> dict[str, str | None]:
    """Backend name -> None if it can run here, else the reason it cannot (and how to get it)."""
    gpu_extras = "pip install -r requirements-gpu.txt on a CUDA machine"
    return {
        "reference": None,
        "sdpa": None,
        "flash": _needs_cuda("flash_attn", gpu_extras),
        "flash3": _needs_cuda("flash_attn_interface", "build FlashAttention-3 from the flash-attention repo's hopper/ "
                                                      "folder on an H100/H800"),
        "sage": _needs_cuda("sageattention", gpu_extras),
        "splash": _missing("jax", "pip install -r requirements.txt; on a TPU VM also requirements-tpu.txt"),
        "xla": _missing("jax", "pip install -r requirements.txt"),
        "host_sdpa": _missing("jax", "pip install -r requirements.txt") or _needs_cpu_jax(),
        "kv_zeroing": None,
    }


#: What the CUDA kernels take: flash-attn and SageAttention run on fp16 / bf16 CUDA tensors only.
CUDA_HALF_BACKENDS = ("flash", "flash3", "sage")
