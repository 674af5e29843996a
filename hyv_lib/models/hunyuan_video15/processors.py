"""diffusers attention processors for HunyuanVideo-1.5 that call hyv_lib's masked attention with the 1-D key mask (or
SSTA, the sparse attention of the 720p sparse checkpoints, with the video's token grid)."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from ...kernels.custom_op import CompilableAttention
from ...kernels.dispatch import check_options, resolve_backend
from ...kernels.registry import BACKENDS
from ...kernels.ssta import SstaConfig
from ...parallel.sharding import keep_heads_split, stream_layout
from ..attention_qkv import context_qkv, video_qkv


# ---------------------------------------------------------------------------------- diffusers processors
class TokenGrid:
    """The token grid (t, h, w) of the video the model is running on, for SSTA's tiles: a pre-hook on the model's RoPE
    module (which every runtime calls with the latents' shape, in diffusers' forward and in the adapter's pieces alike)
    records it before the blocks run."""

    def __init__(self, model):
        config = model.config
        self.patch = (config.patch_size_t, config.patch_size, config.patch_size)
        self.grid: tuple[int, int, int] | None = None
        model.rope.register_forward_pre_hook(self._record)

    def _record(self, module, args) -> None:
        self.record_shape(args[0].shape)

    def record_shape(self, latent_shape) -> None:
        """Record the grid of latents of ``latent_shape`` [..., T, H, W] (the runtimes that cache their RoPE tables
        call this through the adapter's ``note_latent_shape``)."""
        t, h, w = latent_shape[-3:]
        self.grid = (t // self.patch[0], h // self.patch[1], w // self.patch[2])

    def current(self, video_tokens: int) -> tuple[int, int, int]:
        """The recorded grid, checked against the video tokens an attention call sees (a stale or missing grid is an
        error, never a silently wrong tiling)."""
        if self.grid is None or math.prod(self.grid) != video_tokens:
            raise RuntimeError(f"SSTA needs the video's token grid: recorded {self.grid}, but the attention sees "
                               f"{video_tokens} video tokens (run the model through its forward or a hyv_lib runtime, "
                               "which record the latents' shape)")
        return self.grid

    @classmethod
    def of(cls, model) -> "TokenGrid":
        """The model's grid recorder (installed once)."""
        if getattr(model, "hyv_token_grid", None) is None:
            model.hyv_token_grid = cls(model)
        return model.hyv_token_grid


class _Processor:
    def __init__(self, backend: str = "auto", grid: TokenGrid | None = None, **options: Any):
        self.backend = backend
        self.options = options
        self.grid = grid  # SSTA only: where the video's token grid is read at each call
        # the attention call, one opaque op inside torch.compile (hyv_lib.runtimes.compiled): no graph break
        self.attend = CompilableAttention(backend, **options)

    def _attend(self, q, k, v, kv_mask, video_tokens: int = 0):  # q, k, v: [B, S, H, D] as diffusers lays them out
        grid = None if self.grid is None else self.grid.current(video_tokens)
        out = self.attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), kv_mask, grid)
        return _heads_split(out.transpose(1, 2).flatten(2, 3))


def _heads_split(hidden: torch.Tensor) -> torch.Tensor:
    """Inside a sharded jitted step, keep [B, S, H*D] in the attention kernel's layout (see
    :func:`hyv_lib.parallel.sharding.keep_heads_split`); anything else passes through."""
    if hidden.device.type != "jax":
        return hidden

    return keep_heads_split(hidden)


class JointAttnProcessor(_Processor):
    """Replaces HunyuanVideo15AttnProcessor2_0 in the dual-stream blocks.

    Same projections, QK-norm and RoPE as diffusers; the [B, L_ctx] context mask is extended with True
    for the video tokens to a [B, S] key-padding mask instead of a dense [B, 1, S, S] one.
    """

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None,
                 image_rotary_emb=None):
        query, key, value = video_qkv(attn, hidden_states, image_rotary_emb)
        if encoder_hidden_states is not None:
            enc_q, enc_k, enc_v = context_qkv(attn, encoder_hidden_states)
            query, key, value = (torch.cat(pair, dim=1) for pair in ((query, enc_q), (key, enc_k), (value, enc_v)))
        batch, seq_len = query.shape[:2]
        if attention_mask is None:
            kv_mask = None
        else:
            kv_mask = F.pad(attention_mask.bool(), (seq_len - attention_mask.shape[1], 0), value=True)
        out = self._attend(query, key, value, kv_mask, hidden_states.shape[1]).to(query.dtype)
        if encoder_hidden_states is None:
            return out, None
        video, context = out[:, : -encoder_hidden_states.shape[1]], out[:, -encoder_hidden_states.shape[1] :]
        if out.device.type == "jax":
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

    ``backend="ssta"`` (or its fp32 oracle ``ssta_reference``; option ``ssta``: a :class:`hyv_lib.SstaConfig`, by
    default the official ``attn_param``) runs the dual-stream blocks' joint attention sparse on the video's token
    grid (read from the latents' shape at each forward); the blocks its ``dense_every`` names and the token refiner
    run the dense exact ``auto`` backend.
    """
    from diffusers.models.attention_processor import Attention, AttnProcessor2_0
    from diffusers.models.transformers.transformer_hunyuan_video15 import HunyuanVideo15AttnProcessor2_0

    if backend != "auto":
        resolve_backend(backend, next(model.parameters()).device)
    check_options(backend, options)  # now, not at the first traced call
    sparse = backend in BACKENDS and "grid" in BACKENDS[backend].options  # ssta, ssta_reference: a tile grid
    if sparse:
        options = {"ssta": options.get("ssta") or SstaConfig()}
        if not isinstance(options["ssta"], SstaConfig):
            raise TypeError(f"ssta= must be a hyv_lib.SstaConfig, got {type(options['ssta']).__name__}")
        grid, config = TokenGrid.of(model), options["ssta"]
    joint = [m for m in model.modules() if isinstance(m, Attention)
             and isinstance(m.processor, (HunyuanVideo15AttnProcessor2_0, JointAttnProcessor))]
    installed = 0
    for name, module in model.named_modules():
        if not isinstance(module, Attention):
            continue
        processor = module.processor
        if isinstance(processor, (HunyuanVideo15AttnProcessor2_0, JointAttnProcessor)):
            if sparse and config.is_dense(joint.index(module), len(joint)):
                module.set_processor(JointAttnProcessor("auto"))
            elif sparse:
                module.set_processor(JointAttnProcessor(backend, grid, **options))
            else:
                module.set_processor(JointAttnProcessor(backend, **options))
        elif isinstance(processor, (AttnProcessor2_0, SelfAttnProcessor)):
            unsupported = [a for a in ("group_norm", "spatial_norm", "norm_cross") if getattr(module, a, None)]
            if unsupported or module.residual_connection:
                raise NotImplementedError(f"{name}: SelfAttnProcessor does not support {unsupported or 'residual'}")
            module.set_processor(SelfAttnProcessor("auto") if sparse else SelfAttnProcessor(backend, **options))
        else:
            raise NotImplementedError(f"{name}: unexpected attention processor {type(processor).__name__}")
        installed += 1
    if installed == 0:
        raise ValueError("use_attention found no diffusers Attention module in the model")
    return installed
