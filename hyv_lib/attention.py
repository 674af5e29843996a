"""Attention with exact key-padding masks on every backend, and a diffusers processor that uses it.

Semantics shared by every backend: q, k, v are [B, H, S, D]; ``kv_mask`` is bool [B, S] (True = valid).
Query i of batch b attends to the keys j with kv_mask[b, j]; outputs where kv_mask[b, i] is False are
exactly zero; no NaN, even when a batch element has no valid token. No backend except ``reference``
builds an S x S tensor.

diffusers' own dispatcher (``attention_dispatch``) was considered: its flash/Sage backends reject masks
since v0.37 and its native path needs a dense [B,1,S,S] mask, so the varlen/gather logic lives here.
"""

from __future__ import annotations

import importlib.util
import math
from typing import Any, Callable

import torch
import torch.nn.functional as F

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
    from .libtpu import default_backend

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


def resolve_backend(backend: str, device: torch.device, dtype: torch.dtype | None = None) -> str:
    """``auto`` -> the best backend for tensors on ``device`` (of ``dtype``); any other name is checked and
    returned: it must run on this machine and take tensors of this device and dtype."""
    available = available_backends()
    if backend == "auto":
        if device.type == "jax":
            from .sharding import target_platform

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


# ------------------------------------------------------------------------------------------------ kernels
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


def sage_attention(q, k, v, kv_mask) -> torch.Tensor:
    """SageAttention (8-bit QK^T: LOSSY, not exact) on each batch element's valid tokens."""
    from sageattention import sageattn

    return _per_batch_valid(q, k, v, kv_mask,
                            lambda q_, k_, v_: sageattn(q_, k_, v_, tensor_layout="HND", is_causal=False))


def kv_zeroing_attention(q, k, v, kv_mask) -> torch.Tensor:
    """TEACHING ONLY, inexact: gpu-tpu-pedia's TPU scheme. Padded K and V are zeroed and attention runs
    with no mask, so each padded key still adds exp(0 - max) to every softmax denominator."""
    keep = kv_mask[:, None, :, None].to(k.dtype)
    return F.scaled_dot_product_attention(q, k * keep, v * keep)


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
        from .errors import HyvInputError

        raise HyvInputError("kv_mask", f"must be a bool [B, S] key-padding mask (True = valid token), got dtype "
                                       f"{kv_mask.dtype}; from an additive 0/-inf mask use `mask == 0`, from 0/1 "
                                       f"integers `mask.bool()`")
    kv_mask = kv_mask.to(device=q.device)
    name = resolve_backend(backend, q.device, q.dtype)
    _check_options(name, options)
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


def _check_options(backend: str, options: dict[str, Any]) -> None:
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
        from .host_attention import host_sdpa_attention_jax

        kernel = functools.partial(host_sdpa_attention_jax, host_kernel=sdpa_attention)
    else:
        from .xla_attention import xla_attention_jax as kernel
    fn = functools.partial(kernel, **options)
    if not from_torch:
        from .sharding import per_shard

        return call_jax(per_shard(fn), q, k, v, kv_mask)
    import jax.numpy as jnp
    import numpy as np

    def to_jax(t):  # float32 round trip keeps bf16 exact; the result is cast back to q's dtype
        return jnp.asarray(t.detach().cpu().float().numpy() if t.is_floating_point() else t.cpu().numpy())

    out = fn(*(to_jax(t) for t in (q, k, v, kv_mask)))
    return torch.tensor(np.asarray(out, dtype=np.float32)).to(device=q.device, dtype=q.dtype)


# ---------------------------------------------------------------------------------- diffusers processors
class _Processor:
    def __init__(self, backend: str = "auto", **options: Any):
        self.backend = backend
        self.options = options

    def _attend(self, q, k, v, kv_mask):  # q, k, v: [B, S, H, D] as diffusers lays them out
        out = attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), kv_mask,
                        backend=self.backend, **self.options)
        return _heads_split(out.transpose(1, 2).flatten(2, 3))


def _heads_split(hidden: torch.Tensor) -> torch.Tensor:
    """Inside a sharded jitted step, keep [B, S, H*D] in the attention kernel's layout (see
    :func:`hyv_lib.sharding.keep_heads_split`); anything else passes through."""
    if hidden.device.type != "jax":
        return hidden
    from .sharding import keep_heads_split

    return keep_heads_split(hidden)


def context_qkv(attn, encoder_hidden_states: torch.Tensor):
    """The context stream's q, k, v of a dual-stream block as [B, L, H, D], QK-normalised like diffusers."""
    q, k, v = (proj(encoder_hidden_states).unflatten(2, (attn.heads, -1))
               for proj in (attn.add_q_proj, attn.add_k_proj, attn.add_v_proj))
    if attn.norm_added_q is not None:
        q = attn.norm_added_q(q)
    if attn.norm_added_k is not None:
        k = attn.norm_added_k(k)
    return q, k, v


class JointAttnProcessor(_Processor):
    """Replaces HunyuanVideo15AttnProcessor2_0 in the dual-stream blocks.

    Same projections, QK-norm and RoPE as diffusers; the [B, L_ctx] context mask is extended with True
    for the video tokens to a [B, S] key-padding mask instead of a dense [B, 1, S, S] one.
    """

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None,
                 image_rotary_emb=None):
        from diffusers.models.embeddings import apply_rotary_emb

        def heads(x):
            return x.unflatten(2, (attn.heads, -1))

        query = attn.norm_q(heads(attn.to_q(hidden_states)))
        key = attn.norm_k(heads(attn.to_k(hidden_states)))
        value = heads(attn.to_v(hidden_states))
        if image_rotary_emb is not None:
            query = apply_rotary_emb(query, image_rotary_emb, sequence_dim=1)
            key = apply_rotary_emb(key, image_rotary_emb, sequence_dim=1)
        if encoder_hidden_states is not None:
            enc_q, enc_k, enc_v = context_qkv(attn, encoder_hidden_states)
            query, key, value = (torch.cat(pair, dim=1) for pair in ((query, enc_q), (key, enc_k), (value, enc_v)))
        batch, seq_len = query.shape[:2]
        if attention_mask is None:
            kv_mask = None
        else:
            kv_mask = F.pad(attention_mask.bool(), (seq_len - attention_mask.shape[1], 0), value=True)
        out = self._attend(query, key, value, kv_mask).to(query.dtype)
        if encoder_hidden_states is None:
            return out, None
        video, context = out[:, : -encoder_hidden_states.shape[1]], out[:, -encoder_hidden_states.shape[1] :]
        if out.device.type == "jax":
            from .sharding import stream_layout

            video, context = stream_layout(_heads_split(video), video=True), stream_layout(_heads_split(context))
        video = attn.to_out[1](attn.to_out[0](video))
        if getattr(attn, "to_add_out", None) is not None:
            context = attn.to_add_out(context)
        return video, context


class SelfAttnProcessor(_Processor):
    """Replaces AttnProcessor2_0 in the token refiner's self-attention.

    diffusers' refiner passes a dense [B, 1, L, L] mask built as m_i & m_j (L = 1000 text tokens, built
    outside the processor); its diagonal is the 1-D mask m, which is all this processor uses.
    """

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, temb=None):
        batch = hidden_states.shape[0]

        def heads(x):
            return x.view(batch, -1, attn.heads, x.shape[-1] // attn.heads)

        query, key, value = (heads(proj(hidden_states)) for proj in (attn.to_q, attn.to_k, attn.to_v))
        if attn.norm_q is not None:
            query = attn.norm_q(query)
        if attn.norm_k is not None:
            key = attn.norm_k(key)
        kv_mask = None
        if attention_mask is not None:
            kv_mask = attention_mask.reshape(batch, -1, *attention_mask.shape[-2:])[:, 0].diagonal(dim1=-2, dim2=-1)
        out = self._attend(query, key, value, kv_mask).to(query.dtype)
        return attn.to_out[1](attn.to_out[0](out)) / attn.rescale_output_factor


def use_attention(model: torch.nn.Module, backend: str = "auto", **options: Any) -> int:
    """Install hyv_lib's masked attention on every attention of a HunyuanVideo15Transformer3DModel
    (dual-stream blocks and token refiner). Returns how many processors were installed.

    The backend and its options are checked now, so a missing package or a misspelt option fails here rather than
    mid-forward. The model is changed in place: its attention modules get these processors.
    """
    from diffusers.models.attention_processor import Attention, AttnProcessor2_0
    from diffusers.models.transformers.transformer_hunyuan_video15 import HunyuanVideo15AttnProcessor2_0

    if backend != "auto":
        resolve_backend(backend, next(model.parameters()).device)
    _check_options(backend, options)  # now, not at the first traced call
    installed = 0
    for name, module in model.named_modules():
        if not isinstance(module, Attention):
            continue
        processor = module.processor
        if isinstance(processor, (HunyuanVideo15AttnProcessor2_0, JointAttnProcessor)):
            module.set_processor(JointAttnProcessor(backend, **options))
        elif isinstance(processor, (AttnProcessor2_0, SelfAttnProcessor)):
            unsupported = [a for a in ("group_norm", "spatial_norm", "norm_cross") if getattr(module, a, None)]
            if unsupported or module.residual_connection:
                raise NotImplementedError(f"{name}: SelfAttnProcessor does not support {unsupported or 'residual'}")
            module.set_processor(SelfAttnProcessor(backend, **options))
        else:
            raise NotImplementedError(f"{name}: unexpected attention processor {type(processor).__name__}")
        installed += 1
    if installed == 0:
        raise ValueError("use_attention found no diffusers Attention module in the model")
    return installed
