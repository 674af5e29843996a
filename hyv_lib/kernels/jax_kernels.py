"""XLA's blockwise softmax and torch's CPU kernel called from jit as registered backends (Splash registers itself in
its module), and running a JAX kernel on torch tensors through the host."""

from __future__ import annotations

import functools
import sys
from typing import Callable

from ..parallel.jax_env import default_backend
from ..parallel.transfer import numpy_to_torch, torch_to_numpy
from .host import host_sdpa_attention_jax
from .registry import register_backend
from .torch_kernels import sdpa_attention
from .xla import xla_attention_jax


def on_torch_tensors(jax_kernel: Callable) -> Callable:
    """A JAX kernel called on torch tensors (CPU or CUDA): each goes to JAX through the host in float32 (bf16 converts
    exactly), the result comes back in q's dtype on q's device."""

    def kernel(q, k, v, kv_mask, **options):
        import jax.numpy as jnp

        def to_jax(t):
            return jnp.asarray(torch_to_numpy(t.float() if t.is_floating_point() else t))

        out = jax_kernel(*(to_jax(t) for t in (q, k, v, kv_mask)), **options)
        return numpy_to_torch(out).to(device=q.device, dtype=q.dtype)

    return kernel


register_backend("xla", devices=("cpu", "cuda", "jax"), packages=("jax",), options=("block_kv",),
                 install="pip install -r requirements.txt", jax_kernel=xla_attention_jax)(
    on_torch_tensors(xla_attention_jax))


def _cpu_jax() -> str | None:
    """host_sdpa calls torch from jitted code: JAX must run on the CPU (checked only once JAX is imported: importing it
    costs torch-only users seconds)."""
    if "jax" not in sys.modules:
        return None
    backend = default_backend()
    return None if backend == "cpu" else f"calls torch from jitted code: needs JAX on the CPU, not {backend!r}"


_host_sdpa = functools.partial(host_sdpa_attention_jax, host_kernel=sdpa_attention)
register_backend("host_sdpa", devices=("cpu", "cuda", "jax"), packages=("jax",),
                 install="pip install -r requirements.txt", jax_kernel=_host_sdpa, check=_cpu_jax)(
    on_torch_tensors(_host_sdpa))
