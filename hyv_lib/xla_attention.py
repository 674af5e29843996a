"""Masked attention in plain JAX (jax.nn.dot_product_attention, XLA): the non-TPU path under jit."""

from __future__ import annotations

import jax.numpy as jnp


def xla_attention_jax(q, k, v, kv_mask):
    """q, k, v: [B, H, S, D] jax arrays; kv_mask: bool [B, S]. Same semantics as hyv_lib.attention.

    XLA forms the [B, H, S, S] logits (O(S^2) memory per head, fine for CPU-sized inputs; the TPU path
    is Splash). A key-padding mask broadcast as [B, 1, 1, S] never materialises an S x S mask input.
    jax masks with a large finite negative, so a row without valid keys is finite; invalid rows are zeroed.
    """
    import jax

    out = jax.nn.dot_product_attention(
        q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3),
        mask=kv_mask[:, None, None, :], implementation="xla",
    ).transpose(0, 2, 1, 3)
    return jnp.where(kv_mask[:, None, :, None], out, jnp.zeros((), out.dtype))
