"""JAX Pallas Splash attention with exact key-padding masks via segment ids (TPU kernel; interpret mode elsewhere)."""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from ..base.errors import HyvInputError
from ..parallel.mesh import target_device_kind, target_platform
from ..parallel.transfer import numpy_to_torch, torch_to_numpy
from .registry import register_backend

# Tile sizes of the forward kernel: block_q query rows x block_kv key rows per grid step, the key block
# processed in block_kv_compute-row slices. The kernel needs multiples of 128 (TPU lane width) and
# block_kv_compute | block_kv. DEFAULT_BLOCK_SIZES is the stock-Splash configuration that the gpu-tpu-pedia project
# ran HunyuanVideo-1.5 with at 720p/121 frames (~113k tokens): 2048/2048/1024, 7.29 s/step on TPU v6e-8 (that
# project's hardware labels are partly inconsistent: some of its documents say v4-8). Not tuned here (no TPU).
# Short sequences clamp the blocks down (see resolve_block_sizes), so the defaults cost nothing on tiny inputs.
DEFAULT_BLOCK_SIZES: dict = {"block_q": 2048, "block_kv": 2048, "block_kv_compute": 1024}

# The kernel's working tiles live in the TensorCore's scoped VMEM, whose default limit differs by chip: the TPU
# compiler (libtpu 0.0.42.1, run here without a TPU; benchmarks/tpu_compile.py) rejects 2048/2048/1024 at the
# 720p/121f length on v4, v5e and v5p ("Scoped allocation with size 21.64M and limit 16.00M", bf16) and accepts
# it on v6e and TPU7x. Per chip (JAX device_kind) and compute dtype, the largest tiles that compiled there:
# - v5e, v5p: 1024/2048/1024 in bf16 and f32 (2048/2048/512 does not fit either; 2048/1024/512 fits bf16 only);
# - v4: 1024/2048/1024 in bf16, 1024/1024/512 in f32 (f32 q/k/v tiles are twice as large).
# tests/test_tpu_compile.py re-checks one chip per entry at the real length.
_BLOCKS_1024 = {"block_q": 1024, "block_kv": 2048, "block_kv_compute": 1024}
#: Splash tile sizes per (JAX device_kind, compute dtype), as the TPU compiler accepted them at 720p/121f.
CHIP_BLOCK_SIZES: dict = {
    ("TPU v4", "bfloat16"): _BLOCKS_1024,
    ("TPU v4", "float32"): {"block_q": 1024, "block_kv": 1024, "block_kv_compute": 512},
    ("TPU v5 lite", "bfloat16"): _BLOCKS_1024, ("TPU v5 lite", "float32"): _BLOCKS_1024,
    ("TPU v5", "bfloat16"): _BLOCKS_1024, ("TPU v5", "float32"): _BLOCKS_1024,
}

_LANES = 128

#: Zero-pad a head dim that is not a multiple of 128 (CogVideoX's 64) before the kernel, unless ``pad_head_dim=False``.
#: What the TPU compiler says (libtpu 0.0.42.1 without a TPU; CogVideoX1.5-5B at 768x1360x81, 45,106 tokens, 12 heads
#: per device as on data=2 x tensor=4): Mosaic compiles the kernel at head dim 64 as is on v6e and v5e; the kernel's
#: scoped VMEM is the same either way (7.00 MiB at 2048/2048/1024, 10.88 MiB at gpu-tpu-pedia's 3328/2816/256: a
#: 64-wide tile occupies 128 lanes), q, k, v and the output sit in HBM lane-padded to 128 either way (the kernel's
#: operand layout is (8, 128) tiles over [S, D]), and the whole step (2 real-width blocks) has the same per-device
#: arguments, temporaries and outputs (1.86 GB; the code differs by 21 KB) and XLA FLOPs; XLA's cost model prices
#: neither kernel. Nothing the compiler reports separates them and no TPU here can time them, so the library keeps
#: one path for every head dim (16, 32, 64, 128), the one the interpret-mode tests check; a TPU user can time
#: ``pad_head_dim=False``.
PAD_HEAD_DIM = True


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def _check_block(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0 or value % _LANES:
        raise HyvInputError(name, f"must be a positive multiple of {_LANES}, got {value!r}")
    return int(value)


def default_block_sizes(compute_dtype="float32", device_kind: str | None = None) -> dict:
    """The default tile sizes for q, k, v fed to the kernel in ``compute_dtype`` on a chip of ``device_kind``
    (JAX's ``device.device_kind``; None: the chip the program targets, see
    :func:`hyv_lib.parallel.mesh.target_device_kind`). Chips not in :data:`CHIP_BLOCK_SIZES` (v6e, TPU7x, and the CPU
    of interpret mode) get :data:`DEFAULT_BLOCK_SIZES`."""
    import jax.numpy as jnp

    if device_kind is None:
        device_kind = target_device_kind()
    return dict(CHIP_BLOCK_SIZES.get((device_kind, jnp.dtype(compute_dtype).name), DEFAULT_BLOCK_SIZES))


def resolve_block_sizes(seq_len: int, block_q, block_kv, block_kv_compute,
                         compute_dtype="float32") -> tuple[int, int, int]:
    """Validate the requested block sizes (None = the dtype's default), then clamp them to the sequence.

    A block longer than the sequence rounded up to 128 would only add padding, so block_q and block_kv are
    capped at that length; block_kv_compute then becomes the largest multiple of 128 that is <= its requested
    value and divides the (possibly capped) block_kv.
    """
    defaults = default_block_sizes(compute_dtype)
    bq = _check_block("block_q", defaults["block_q"] if block_q is None else block_q)
    bkv = _check_block("block_kv", defaults["block_kv"] if block_kv is None else block_kv)
    if block_kv_compute is None:
        bkvc = min(defaults["block_kv_compute"], bkv)
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
    if kv_mask.dtype != np.bool_:
        raise HyvInputError("kv_mask", f"must be a bool array (True = valid token), got dtype {kv_mask.dtype}")


def splash_attention_jax(q, k, v, kv_mask, *, block_q=None, block_kv=None, block_kv_compute=None, interpret=None,
                         compute_dtype=None, pad_head_dim=None):
    """Masked attention with the Pallas Splash kernel. q, k, v: [B, H, S, D]; kv_mask: bool [B, S], True = valid.

    Query i of batch b attends to the keys j with ``kv_mask[b, j]`` (softmax over valid keys only, scale
    1/sqrt(D)); rows with ``kv_mask[b, i]`` False are exactly zero, also when a batch element has no valid token.
    Returns [B, H, S, D] in q's dtype. Jittable: block sizes and ``interpret`` are static Python values, the mask
    is data. ``interpret=None`` compiles the kernel natively when the program targets a TPU (JAX's default
    backend, or the active mesh's devices: see :func:`hyv_lib.parallel.mesh.target_platform`) and runs it in Pallas
    interpret mode anywhere else.

    ``compute_dtype`` (what q, k, v are fed to the kernel in; logits, softmax and P.V accumulate in f32 either
    way): ``"bfloat16"`` halves the kernel's HBM reads and keeps the MXU at its bf16 rate, at the price of folding
    the 1/sqrt(D) scale into q in bf16 (exact only when D is a power of 4; one extra 2**-9 relative rounding of q
    for D = 128). ``"float32"`` loses nothing before the output's final rounding. ``None`` picks bf16 when q is
    bf16 and the kernel compiles for a TPU (the fast path a TPU VM runs), else f32 (the exactness tests on CPU).

    ``pad_head_dim``: a head dim that is not a multiple of 128 (the TPU lane width; tiny presets use 16 or 32,
    CogVideoX 64) is zero-padded to one (True, the default), as maxdiffusion does: zero columns add nothing to q.k
    and give zero output columns, which are cut off. False feeds the kernel the head dim as is; Mosaic compiles that
    too (the kernel's blocks span the whole head dim); :data:`PAD_HEAD_DIM` says why padding is the default.

    Exactness comes from segment ids, not from the kernel's static mask (a FullMask): valid tokens get id 1,
    invalid tokens and the block padding id 0, and a query only sees keys with its own id. A valid query thus
    never sees padding; an invalid one sees only padding (itself at least, so its softmax is finite) and is
    zeroed afterwards. Queries and keys are padded separately, to multiples of block_q and block_kv.
    """
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as _sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as _sm

    q, k, v, kv_mask = (jnp.asarray(x) for x in (q, k, v, kv_mask))
    _check_inputs(q, k, v, kv_mask)
    if compute_dtype not in (None, "float32", "bfloat16"):
        raise HyvInputError("compute_dtype", f"must be None, 'float32' or 'bfloat16', got {compute_dtype!r}")
    batch, heads, seq, head_dim = q.shape
    if interpret is None:
        interpret = target_platform() != "tpu"
    if compute_dtype is None:
        compute_dtype = "bfloat16" if q.dtype == jnp.bfloat16 and not interpret else "float32"
    compute_dtype = jnp.bfloat16 if compute_dtype == "bfloat16" else jnp.float32
    bq, bkv, bkvc = resolve_block_sizes(seq, block_q, block_kv, block_kv_compute, compute_dtype)
    out_dtype = q.dtype
    # The kernel has no softmax scale of its own: fold 1/sqrt(D) into q, in f32 before any rounding.
    q = (q.astype(jnp.float32) * (1.0 / math.sqrt(head_dim))).astype(compute_dtype)
    k, v = k.astype(compute_dtype), v.astype(compute_dtype)

    len_q, len_kv = _round_up(max(seq, 1), bq), _round_up(max(seq, 1), bkv)
    if pad_head_dim not in (None, True, False):
        raise HyvInputError("pad_head_dim", f"must be None, True or False, got {pad_head_dim!r}")
    pad = PAD_HEAD_DIM if pad_head_dim is None else pad_head_dim
    pad_d = _round_up(head_dim, _LANES) - head_dim if pad else 0
    seg = kv_mask.astype(jnp.int32)
    seg_q = jnp.pad(seg, ((0, 0), (0, len_q - seq)))
    seg_kv = jnp.pad(seg, ((0, 0), (0, len_kv - seq)))
    q = jnp.pad(q, ((0, 0), (0, 0), (0, len_q - seq), (0, pad_d)))
    k = jnp.pad(k, ((0, 0), (0, 0), (0, len_kv - seq), (0, pad_d)))
    v = jnp.pad(v, ((0, 0), (0, 0), (0, len_kv - seq), (0, pad_d)))

    mask = _sm.MultiHeadMask([_sm.FullMask((len_q, len_kv))] * heads)
    kernel = _sk.make_splash_mha(
        mask,
        # the backward kernels (dK/dV and dQ, used by a train step's jax.grad) tile like the forward
        block_sizes=_sk.BlockSizes(block_q=bq, block_kv=bkv, block_kv_compute=bkvc, block_q_dkv=bq, block_kv_dkv=bkv,
                                   block_kv_dkv_compute=bkvc, block_q_dq=bq, block_kv_dq=bkv),
        head_shards=1,
        q_seq_shards=1,
        interpret=bool(interpret),
    )

    def one(q1, k1, v1, sq, skv):  # one batch element: [H, S, D] with [S] segment ids
        return kernel(q1, k1, v1, segment_ids=_sk.SegmentIds(q=sq, kv=skv))

    out = jax.vmap(one)(q, k, v, seg_q, seg_kv)[:, :, :seq, :head_dim]
    out = jnp.where(kv_mask[:, None, :, None], out, jnp.zeros((), out.dtype))
    return out.astype(out_dtype)


#: The options Splash takes: its tile sizes, interpret mode, compute dtype and head-dim padding.
OPTIONS = ("block_q", "block_kv", "block_kv_compute", "interpret", "compute_dtype", "pad_head_dim")


@functools.lru_cache(maxsize=None)
def _jitted(options: tuple):
    import jax

    return jax.jit(functools.partial(splash_attention_jax, **dict(options)))


@register_backend("splash", devices=("cpu", "cuda", "jax"), packages=("jax",), options=OPTIONS,
                  install="pip install -r requirements.txt; on a TPU VM also requirements-tpu.txt",
                  jax_kernel=splash_attention_jax)
def splash_attention(q, k, v, kv_mask=None, **options) -> torch.Tensor:
    """torch in/out wrapper of :func:`splash_attention_jax` (same semantics; ``kv_mask=None`` = all valid).

    Tensors go through numpy on the host (bf16 bit-exactly); the result comes back in q's dtype on q's device.
    ``options``: block_q, block_kv, block_kv_compute, interpret, compute_dtype. Calls are jitted once per option
    set and shape.
    """
    unknown = set(options) - set(OPTIONS)
    if unknown:
        raise HyvInputError(sorted(unknown)[0], f"unknown option; valid: {', '.join(OPTIONS)}")
    if q.dim() != 4:
        raise HyvInputError("q", f"must be [B, H, S, D], got shape {tuple(q.shape)}")
    if kv_mask is None:
        kv_mask = torch.ones(q.shape[0], q.shape[2], dtype=torch.bool)
    fn = _jitted(tuple(sorted(options.items())))
    out = fn(*(torch_to_numpy(t) for t in (q, k, v, kv_mask)))
    return numpy_to_torch(out).to(device=q.device, dtype=q.dtype)
