"""Torch's fused CPU attention called from jitted JAX code (``jax.pure_callback``): the CPU kernel under jit."""

from __future__ import annotations

import functools
import warnings

import numpy as np
import torch


def _on_host(host_kernel, q, k, v, kv_mask) -> np.ndarray:
    with warnings.catch_warnings():  # np.asarray views XLA's CPU buffers (read-only); torch only reads them
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        tensors = [torch.from_numpy(np.asarray(x)) for x in (q, k, v, kv_mask)]
    with torch.no_grad():
        return host_kernel(*tensors).numpy()


def host_sdpa_attention_jax(q, k, v, kv_mask, *, host_kernel):
    """q, k, v: [B, H, S, D] jax arrays on the CPU backend; kv_mask: bool [B, S]. Same semantics as
    hyv_lib.kernels.dispatch. ``host_kernel`` is the torch kernel to call (hyv_lib.kernels.dispatch passes its
    ``sdpa_attention``; taking it as an argument keeps this module free of an import cycle).

    XLA:CPU has no fused attention: our best blockwise JAX formulation (``xla_attention_jax``) runs at
    1.1-1.7x the time of torch's flash kernel on a 2-core CPU, and attention is 25-45% of a DiT step. Here
    the jitted step hands q, k, v to that kernel (``sdpa_attention``: each batch element's valid tokens,
    no mask tensor) and takes the output back; on the CPU backend both sides share host memory. For
    inference only (a callback has no gradient) and only where JAX runs on the CPU: on a TPU or GPU the
    operands would cross to the host and back, so ``resolve_backend`` refuses it there.
    """
    import jax
    import jax.numpy as jnp

    if q.dtype != jnp.float32:  # numpy and torch.from_numpy know no bfloat16: hand over fp32, cast back
        return host_sdpa_attention_jax(*(x.astype(jnp.float32) for x in (q, k, v)), kv_mask,
                                       host_kernel=host_kernel).astype(q.dtype)
    result = jax.ShapeDtypeStruct(q.shape, q.dtype)
    return jax.pure_callback(functools.partial(_on_host, host_kernel), result, q, k, v, kv_mask)
