"""JAX Pallas Splash attention with exact key-padding masks via segment ids (TPU kernel; interpret mode elsewhere)."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as _sk
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as _sm

from .errors import HyvInputError

# Tile sizes of the forward kernel: block_q query rows x block_kv key rows per grid step, the key block
# processed in block_kv_compute-row slices. The kernel needs multiples of 128 (TPU lane width) and
# block_kv_compute | block_kv. Defaults are the stock-Splash configuration that the gpu-tpu-pedia project ran
# HunyuanVideo-1.5 with at 720p/121 frames (~113k tokens): 2048/2048/1024, 7.29 s/step on TPU v6e-8 (that
# project's hardware labels are partly inconsistent: some of its documents say v4-8). Its later 3072/2048/1024
# was only measured together with a custom exp2 kernel, so the gain of the bigger block_q is not separable.
# Not tuned here (no TPU); the [block_q, block_kv_compute] f32 logits tile is 8 MiB at these sizes.
# Short sequences clamp the blocks down (see _resolve_block_sizes), so the defaults cost nothing on tiny inputs.
DEFAULT_BLOCK_SIZES: dict = {"block_q": 2048, "block_kv": 2048, "block_kv_compute": 1024}

_LANES = 128


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def _check_block(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0 or value % _LANES:
        raise HyvInputError(name, f"must be a positive multiple of {_LANES}, got {value!r}")
    return int(value)


def _resolve_block_sizes(seq_len: int, block_q, block_kv, block_kv_compute) -> tuple[int, int, int]:
    """Validate the requested block sizes (None = default), then clamp them to the sequence.

    A block longer than the sequence rounded up to 128 would only add padding, so block_q and block_kv are
    capped at that length; block_kv_compute then becomes the largest multiple of 128 that is <= its requested
    value and divides the (possibly capped) block_kv.
    """
    bq = _check_block("block_q", DEFAULT_BLOCK_SIZES["block_q"] if block_q is None else block_q)
    bkv = _check_block("block_kv", DEFAULT_BLOCK_SIZES["block_kv"] if block_kv is None else block_kv)
    if block_kv_compute is None:
        bkvc = min(DEFAULT_BLOCK_SIZES["block_kv_compute"], bkv)
        while bkv % bkvc:
            bkvc -= _LANES
    else:
        bkvc = _check_block("block_kv_compute", block_kv_compute)
        if bkvc > bkv or bkv % bkvc:
            raise HyvInputError("block_kv_compute", f"must divide block_kv={bkv}, got {bkvc}")
    cap = _round_up(max(seq_len, 1), _LANES)
    bq, bkv = min(bq, cap), min(bkv, cap)
    bkvc = min(bkvc, bkv)
    while bkv % bkvc:
        bkvc -= _LANES
    return bq, bkv, bkvc


def _check_inputs(q, k, v, kv_mask) -> None:
    if q.ndim != 4:
        raise HyvInputError("q", f"must be [B, H, S, D], got shape {tuple(q.shape)}")
    for name, t in (("k", k), ("v", v)):
        if tuple(t.shape) != tuple(q.shape):
            raise HyvInputError(name, f"must have q's shape {tuple(q.shape)}, got {tuple(t.shape)}")
    b, _, s, _ = q.shape
    if tuple(kv_mask.shape) != (b, s):
        raise HyvInputError("kv_mask", f"must be [B, S] = {(b, s)}, got shape {tuple(kv_mask.shape)}")
    if kv_mask.dtype != jnp.bool_:
        raise HyvInputError("kv_mask", f"must be a bool array (True = valid token), got dtype {kv_mask.dtype}")


def splash_attention_jax(q, k, v, kv_mask, *, block_q=None, block_kv=None, block_kv_compute=None, interpret=None,
                         compute_dtype=None):
    """Masked attention with the Pallas Splash kernel. q, k, v: [B, H, S, D]; kv_mask: bool [B, S], True = valid.

    Query i of batch b attends to the keys j with ``kv_mask[b, j]`` (softmax over valid keys only, scale
    1/sqrt(D)); rows with ``kv_mask[b, i]`` False are exactly zero, also when a batch element has no valid token.
    Returns [B, H, S, D] in q's dtype. Jittable: block sizes and ``interpret`` are static Python values, the mask
    is data. ``interpret=None`` runs the kernel natively on TPU and in Pallas interpret mode anywhere else.

    ``compute_dtype``: None or "float32" (default) feeds the kernel f32 q/k/v, so bf16 inputs lose nothing
    before the final rounding of the output; "bfloat16" feeds bf16 inputs through unchanged (the kernel still
    forms logits, softmax and P.V in f32), which halves the kernel's HBM reads and keeps the MXU in bf16, but
    the 1/sqrt(D) scale must be folded into q in bf16 -- exact only when D is a power of 4 (16, 64, 256), an
    extra 2**-9 relative error on every logit otherwise (D = 128 in HunyuanVideo-1.5).

    Exactness comes from segment ids, not from the kernel's static mask (a FullMask): valid tokens get id 1,
    invalid tokens and the block padding id 0, and a query only sees keys with its own id. A valid query thus
    never sees padding; an invalid one sees only padding (itself at least, so its softmax is finite) and is
    zeroed afterwards. Queries and keys are padded separately, to multiples of block_q and block_kv.
    """
    q, k, v, kv_mask = (jnp.asarray(x) for x in (q, k, v, kv_mask))
    _check_inputs(q, k, v, kv_mask)
    batch, heads, seq, head_dim = q.shape
    bq, bkv, bkvc = _resolve_block_sizes(seq, block_q, block_kv, block_kv_compute)
    if interpret is None:
        interpret = jax.default_backend() != "tpu"
    if compute_dtype not in (None, "float32", "bfloat16"):
        raise HyvInputError("compute_dtype", f"must be None, 'float32' or 'bfloat16', got {compute_dtype!r}")
    out_dtype = q.dtype
    # The kernel has no softmax scale of its own: fold 1/sqrt(D) into q, in f32 before any rounding.
    compute_dtype = jnp.bfloat16 if compute_dtype == "bfloat16" else jnp.float32
    q = (q.astype(jnp.float32) * (1.0 / math.sqrt(head_dim))).astype(compute_dtype)
    k, v = k.astype(compute_dtype), v.astype(compute_dtype)

    len_q, len_kv = _round_up(max(seq, 1), bq), _round_up(max(seq, 1), bkv)
    seg = kv_mask.astype(jnp.int32)
    seg_q = jnp.pad(seg, ((0, 0), (0, len_q - seq)))
    seg_kv = jnp.pad(seg, ((0, 0), (0, len_kv - seq)))
    q = jnp.pad(q, ((0, 0), (0, 0), (0, len_q - seq), (0, 0)))
    k = jnp.pad(k, ((0, 0), (0, 0), (0, len_kv - seq), (0, 0)))
    v = jnp.pad(v, ((0, 0), (0, 0), (0, len_kv - seq), (0, 0)))

    mask = _sm.MultiHeadMask([_sm.FullMask((len_q, len_kv))] * heads)
    kernel = _sk.make_splash_mha(
        mask,
        block_sizes=_sk.BlockSizes(block_q=bq, block_kv=bkv, block_kv_compute=bkvc),
        head_shards=1,
        q_seq_shards=1,
        interpret=bool(interpret),
    )

    def one(q1, k1, v1, sq, skv):  # one batch element: [H, S, D] with [S] segment ids
        return kernel(q1, k1, v1, segment_ids=_sk.SegmentIds(q=sq, kv=skv))

    out = jax.vmap(one)(q, k, v, seg_q, seg_kv)[:, :, :seq]
    out = jnp.where(kv_mask[:, None, :, None], out, jnp.zeros((), out.dtype))
    return out.astype(out_dtype)


_OPTIONS = ("block_q", "block_kv", "block_kv_compute", "interpret", "compute_dtype")


@functools.lru_cache(maxsize=None)
def _jitted(options: tuple):
    return jax.jit(functools.partial(splash_attention_jax, **dict(options)))


def _torch_to_numpy(t):
    import torch

    t = t.detach().to("cpu").contiguous()
    if t.dtype == torch.bfloat16:  # numpy has no bf16: reinterpret the bits as ml_dtypes.bfloat16
        return t.view(torch.int16).numpy().view(jnp.bfloat16)
    return t.numpy()


def splash_attention(q, k, v, kv_mask=None, **options) -> "torch.Tensor":  # noqa: F821
    """torch in/out wrapper of :func:`splash_attention_jax` (same semantics; ``kv_mask=None`` = all valid).

    Tensors go through numpy on the host (bf16 bit-exactly); the result comes back in q's dtype on q's device.
    ``options``: block_q, block_kv, block_kv_compute, interpret, compute_dtype. Calls are jitted once per option
    set and shape.
    """
    import torch

    unknown = set(options) - set(_OPTIONS)
    if unknown:
        raise HyvInputError(sorted(unknown)[0], f"unknown option; valid: {', '.join(_OPTIONS)}")
    if q.dim() != 4:
        raise HyvInputError("q", f"must be [B, H, S, D], got shape {tuple(q.shape)}")
    if kv_mask is None:
        kv_mask = torch.ones(q.shape[0], q.shape[2], dtype=torch.bool)
    fn = _jitted(tuple(sorted(options.items())))
    out = np.array(fn(*(_torch_to_numpy(t) for t in (q, k, v, kv_mask))))
    if out.dtype == jnp.bfloat16:
        result = torch.from_numpy(out.view(np.int16)).view(torch.bfloat16)
    else:
        result = torch.from_numpy(out)
    return result.to(device=q.device, dtype=q.dtype)
