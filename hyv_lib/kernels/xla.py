"""Masked attention in plain JAX (XLA): blockwise online softmax, the non-TPU path under jit."""

from __future__ import annotations

DEFAULT_BLOCK_KV = 512  # fastest of 256/512/1024/2048 on a 2-core CPU at S ~ 4k, head dim 128


def kv_block_layout(seq_len: int, block_kv: int) -> tuple[int, int]:
    """(number of key blocks, keys per block) for a target ``block_kv``: round(S / block_kv) equal blocks,
    each a multiple of 8 long. A fixed 512 would pad S = 2096 to 2560 keys (22% wasted work, measured 1.27x
    slower on a 2-core CPU than 4 blocks of 524); this pads fewer than 8 keys per block."""
    n_blocks = max(1, round(seq_len / block_kv))
    block = -(-seq_len // n_blocks)
    block += -block % 8
    return -(-seq_len // block), block


def xla_attention_jax(q, k, v, kv_mask, *, block_kv: int | None = DEFAULT_BLOCK_KV):
    """q, k, v: [B, H, S, D] jax arrays; kv_mask: bool [B, S]. Same semantics as hyv_lib.kernels.dispatch.

    About ``block_kv`` keys at a time (see :func:`kv_block_layout`) with an online softmax (running max, sum
    and output, the FlashAttention recurrence) under ``lax.scan``: memory O(S * block_kv) per head instead
    of the [B, H, S, S] logits, and on a CPU about 1.7x faster than ``jax.nn.dot_product_attention`` at
    S ~ 4k. ``block_kv=None`` uses ``jax.nn.dot_product_attention`` (dense logits) instead. Rows without
    valid keys are zero.
    """
    import jax
    import jax.numpy as jnp

    if block_kv is None:
        out = jax.nn.dot_product_attention(
            q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3),
            mask=kv_mask[:, None, None, :], implementation="xla",
        ).transpose(0, 2, 1, 3)
        return jnp.where(kv_mask[:, None, :, None], out, jnp.zeros((), out.dtype))
    if block_kv <= 0:
        raise ValueError(f"block_kv must be a positive integer or None, got {block_kv}")
    b, h, s, d = q.shape
    out_dtype = q.dtype
    n_blocks, block_kv = kv_block_layout(s, block_kv)
    pad = n_blocks * block_kv - s

    def blocks(x):  # [B, H, S, D] -> [n_blocks, B, H, block_kv, D]
        x = jnp.pad(x.astype(jnp.float32), ((0, 0), (0, 0), (0, pad), (0, 0)))
        return x.reshape(b, h, n_blocks, block_kv, d).transpose(2, 0, 1, 3, 4)

    mask_blocks = jnp.pad(kv_mask, ((0, 0), (0, pad))).reshape(b, n_blocks, block_kv).transpose(1, 0, 2)
    scaled_q = q.astype(jnp.float32) * (d**-0.5)

    def step(carry, block):
        running_max, running_sum, acc = carry
        k_blk, v_blk, m_blk = block
        logits = jnp.einsum("bhqd,bhkd->bhqk", scaled_q, k_blk)
        logits = jnp.where(m_blk[:, None, None, :], logits, -jnp.inf)
        new_max = jnp.maximum(running_max, logits.max(axis=-1))
        safe_max = jnp.where(jnp.isfinite(new_max), new_max, 0.0)  # no valid key yet: keep exp() finite
        probs = jnp.exp(logits - safe_max[..., None])
        rescale = jnp.exp(running_max - safe_max)  # exp(-inf) = 0 on the first valid block
        running_sum = running_sum * rescale + probs.sum(axis=-1)
        acc = acc * rescale[..., None] + jnp.einsum("bhqk,bhkd->bhqd", probs, v_blk)
        return (new_max, running_sum, acc), None

    init = (jnp.full((b, h, s), -jnp.inf), jnp.zeros((b, h, s)), jnp.zeros((b, h, s, d)))
    (_, total, acc), _ = jax.lax.scan(step, init, (blocks(k), blocks(v), mask_blocks))
    out = acc / jnp.where(total > 0, total, 1.0)[..., None]
    return jnp.where(kv_mask[:, None, :, None], out, 0.0).astype(out_dtype)
