"""The torch attention kernels with exact key-padding masks: the fp32 reference, SDPA per sample, flash-attn varlen,
PyTorch's own varlen flash attention, SageAttention, and the inexact K/V zeroing."""

from __future__ import annotations

import inspect
import math
from typing import Callable

import torch
import torch.nn.functional as F

from .registry import register_backend

#: What a CUDA machine installs for the GPU kernels.
GPU_EXTRAS = "pip install -r requirements-gpu.txt on a CUDA machine"
HALF = (torch.float16, torch.bfloat16)


# ------------------------------------------------------------------------------------------------ kernels
@register_backend("reference", devices=("cpu", "cuda"))
def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_mask: torch.Tensor) -> torch.Tensor:
    """The oracle: plain softmax(QK^T/sqrt(D)) V in fp32 over valid keys. Materialises [B,H,S,S] (O(S^2))."""
    scores = torch.einsum("bhqd,bhkd->bhqk", q.float(), k.float()) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~kv_mask[:, None, None, :], float("-inf"))
    # A sample with no valid key has all -inf rows: zero weights instead of NaN. Only those (not nan_to_num): a NaN
    # that comes in with q, k or v must come out, or the oracle would hide a numerical blow-up.
    probs = torch.softmax(scores, dim=-1).masked_fill(~kv_mask.any(-1)[:, None, None, None], 0.0)
    out = torch.einsum("bhqk,bhkd->bhqd", probs, v.float())
    return (out * kv_mask[:, None, :, None]).to(q.dtype)


def _per_batch_valid(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_mask: torch.Tensor,
    kernel: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """Run an unmasked ``kernel`` on each batch element's valid tokens only; invalid rows stay zero.

    Valid tokens are a prefix after HunyuanVideo's valid-first reorder, so this is usually a slice
    (no copy); scattered masks fall back to a gather. Extra memory is O(S), never O(S^2).
    """
    out = torch.zeros_like(q)
    for b in range(q.shape[0]):
        valid = kv_mask[b]
        n = int(valid.sum())
        if n == 0:
            continue
        if bool(valid[:n].all()):
            idx = slice(0, n)
        else:
            idx = valid.nonzero(as_tuple=True)[0]
        out[b : b + 1, :, idx] = kernel(q[b : b + 1, :, idx], k[b : b + 1, :, idx], v[b : b + 1, :, idx]).to(q.dtype)
    return out


@register_backend("sdpa", devices=("cpu", "cuda"))
def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_mask: torch.Tensor) -> torch.Tensor:
    """torch SDPA with no mask argument on the valid tokens (lets torch pick its fused kernel)."""
    return _per_batch_valid(q, k, v, kv_mask, lambda q_, k_, v_: F.scaled_dot_product_attention(q_, k_, v_))


def varlen_inputs(kv_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """flash-attn varlen inputs from a [B, S] mask: flat indices of valid tokens (into B*S, row-major),
    cumulative sequence lengths ``cu_seqlens`` (int32, [B+1], starting at 0) and the longest length."""
    lengths = kv_mask.sum(dim=1, dtype=torch.int32)
    cu_seqlens = F.pad(torch.cumsum(lengths, dim=0, dtype=torch.int32), (1, 0))
    indices = kv_mask.flatten().nonzero(as_tuple=True)[0]
    return indices, cu_seqlens, int(lengths.max()) if lengths.numel() else 0


def unpad(x: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """[B, H, S, D] -> [total_valid, H, D], the packed layout of flash-attn's varlen functions."""
    b, h, s, d = x.shape
    return x.transpose(1, 2).reshape(b * s, h, d).index_select(0, indices)


def pad(packed: torch.Tensor, indices: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Inverse of :func:`unpad`: scatter [total_valid, H, D] into zeros of [B, H, S, D]."""
    b, h, s, d = shape
    out = packed.new_zeros(b * s, h, d)
    out[indices] = packed
    return out.view(b, s, h, d).transpose(1, 2)


def flash_attention(q, k, v, kv_mask, *, version: int = 2) -> torch.Tensor:
    """flash-attn varlen (FlashAttention-2, or 3 via flash_attn_interface) on the packed valid tokens."""
    if version == 3:
        from flash_attn_interface import flash_attn_varlen_func
    else:
        from flash_attn import flash_attn_varlen_func
    indices, cu_seqlens, max_len = varlen_inputs(kv_mask)
    if max_len == 0:
        return torch.zeros_like(q)
    qp, kp, vp = (unpad(x, indices) for x in (q, k, v))
    out = flash_attn_varlen_func(qp, kp, vp, cu_seqlens, cu_seqlens, max_len, max_len,
                                 softmax_scale=q.shape[-1] ** -0.5)
    out = out[0] if isinstance(out, tuple) else out  # FA3 returns (out, lse)
    return pad(out, indices, q.shape)


@register_backend("flash", devices=("cuda",), dtypes=HALF, packages=("flash_attn",), install=GPU_EXTRAS,
                  min_cuda_capability=(8, 0))
def flash2_attention(q, k, v, kv_mask) -> torch.Tensor:
    """FlashAttention-2 (flash-attn's varlen kernel) on the packed valid tokens: Ampere or newer."""
    return flash_attention(q, k, v, kv_mask, version=2)


@register_backend("flash3", devices=("cuda",), dtypes=HALF, packages=("flash_attn_interface",),
                  install="build FlashAttention-3 from the flash-attention repo's hopper/ folder on an H100/H800",
                  min_cuda_capability=(9, 0))
def flash3_attention(q, k, v, kv_mask) -> torch.Tensor:
    """FlashAttention-3 (flash_attn_interface's varlen kernel) on the packed valid tokens: Hopper."""
    return flash_attention(q, k, v, kv_mask, version=3)


def torch_varlen_kernel() -> Callable:
    """``torch.nn.attention.varlen.varlen_attn`` (torch >= 2.10: FlashAttention-2 inside torch, CUDA only)."""
    from torch.nn.attention.varlen import varlen_attn

    return varlen_attn


def valid_prefix(kv_mask: torch.Tensor) -> bool:
    """True if every sample's valid keys are a prefix (hyv_lib's valid-first layout): then no packing is needed."""
    lengths = kv_mask.sum(dim=1, keepdim=True)
    return bool((kv_mask == (torch.arange(kv_mask.shape[1], device=kv_mask.device)[None] < lengths)).all())


def torch_varlen_attention(q, k, v, kv_mask, *, kernel: Callable | None = None) -> torch.Tensor:
    """PyTorch's varlen attention on [B, H, S, D] with a [B, S] key mask, exact like the others.

    On the valid-first layout with a kernel that takes ``seqused_k`` (torch >= 2.12), nothing is packed: each sample
    keeps its S slots (``cu_seq_k`` steps by S) and reads only its first ``seqused_k[b]`` keys. Otherwise (torch 2.10
    and 2.11, or a scattered mask) the valid tokens are packed with ``cu_seqlens`` like flash-attn's varlen call.
    Padded query rows are zero, as in the fp32 reference. ``kernel``: a stand-in with varlen_attn's signature (the
    CPU tests' way to check the layout logic; the real kernel runs on CUDA only)."""
    kernel = kernel or torch_varlen_kernel()
    b, h, s, d = q.shape
    if b == 0 or s == 0:
        return torch.zeros_like(q)
    if "seqused_k" in inspect.signature(kernel).parameters and valid_prefix(kv_mask):
        lengths = kv_mask.sum(dim=1, dtype=torch.int32)
        cu = torch.arange(0, (b + 1) * s, s, dtype=torch.int32, device=q.device)
        flat = [x.transpose(1, 2).reshape(b * s, h, d) for x in (q, k, v)]
        out = kernel(*flat, cu, cu, s, s, seqused_k=lengths).view(b, s, h, d).transpose(1, 2)
        # A sample with no valid key has nothing to attend to: zero, as in the reference (the kernel's 0/0 rows).
        return out.masked_fill(~kv_mask[:, None, :, None], 0.0)
    indices, cu_seqlens, max_len = varlen_inputs(kv_mask)
    if max_len == 0:
        return torch.zeros_like(q)
    qp, kp, vp = (unpad(x, indices) for x in (q, k, v))
    return pad(kernel(qp, kp, vp, cu_seqlens, cu_seqlens, max_len, max_len), indices, q.shape)


@register_backend("torch_varlen", devices=("cuda",), dtypes=HALF, min_torch=(2, 10), min_cuda_capability=(8, 0))
def torch_varlen_backend(q, k, v, kv_mask) -> torch.Tensor:
    """PyTorch's own varlen flash attention (torch >= 2.10, Ampere or newer): no extra package to build."""
    return torch_varlen_attention(q, k, v, kv_mask)


@register_backend("sage", devices=("cuda",), dtypes=HALF, packages=("sageattention",), install=GPU_EXTRAS,
                  min_cuda_capability=(8, 0), exact=False)
def sage_attention(q, k, v, kv_mask) -> torch.Tensor:
    """SageAttention (8-bit QK^T: LOSSY, not exact) on each batch element's valid tokens."""
    from sageattention import sageattn

    # SageAttention smooths K (k - mean over tokens); a build that does it in place (k -= km) would change the
    # caller's k through this view: it gets a copy.
    return _per_batch_valid(q, k, v, kv_mask,
                            lambda q_, k_, v_: sageattn(q_, k_.clone(), v_, tensor_layout="HND", is_causal=False))


@register_backend("kv_zeroing", devices=("cpu", "cuda"), exact=False)
def kv_zeroing_attention(q, k, v, kv_mask) -> torch.Tensor:
    """TEACHING ONLY, inexact: gpu-tpu-pedia's TPU scheme. Padded K and V are zeroed and attention runs
    with no mask, so each padded key still adds exp(0 - max) to every softmax denominator."""
    keep = kv_mask[:, None, :, None].to(k.dtype)
    return F.scaled_dot_product_attention(q, k * keep, v * keep)
