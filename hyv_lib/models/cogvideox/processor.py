"""CogVideoX's joint [text ; video] attention in hyv_lib: a processor calling its attention, and a dual-stream view."""

from __future__ import annotations

from typing import Any

import torch

from ...kernels.custom_op import CompilableAttention
from ...kernels.dispatch import check_options, resolve_backend
from ...parallel.sharding import keep_heads_split, stream_layout
from ..attention_qkv import video_qkv


class CogVideoXJointAttnProcessor:
    """Replaces CogVideoXAttnProcessor2_0: the same projections, LayerNorm QK-norm and RoPE (video tokens only) as
    diffusers, with :func:`hyv_lib.kernels.dispatch.attention` over the joint sequence and no mask (every token of
    CogVideoX is valid: its T5 prompt is always 226 tokens, padding included, and the model attends to all of them).

    Text and video share the projections. Inside a sharded jitted step the output is pinned in the kernel's
    heads-split layout, then each stream in its output projection's layout (as HunyuanVideo-1.5's processor does),
    and ``to_out`` runs per stream: a per-token map, so the same numbers as diffusers' projection of the joint.
    """

    def __init__(self, backend: str = "auto", **options: Any):
        self.backend = backend
        self.options = options
        self.attend = CompilableAttention(backend, **options)  # one opaque op inside torch.compile

    def __call__(self, attn, hidden_states, encoder_hidden_states, attention_mask=None, image_rotary_emb=None):
        if attention_mask is not None:
            raise ValueError("CogVideoX attends to every token: hyv_lib's processor takes no attention_mask")
        text = encoder_hidden_states.shape[1]
        video_q, video_k, video_v = video_qkv(attn, hidden_states, image_rotary_emb)
        text_q, text_k, text_v = video_qkv(attn, encoder_hidden_states)  # the same projections, no RoPE
        q, k, v = (torch.cat(pair, dim=1).transpose(1, 2) for pair in ((text_q, video_q), (text_k, video_k),
                                                                        (text_v, video_v)))  # [B, H, S, D]
        out = self.attend(q, k, v, None)
        out = out.transpose(1, 2).flatten(2, 3).to(video_q.dtype)  # [B, S, H*D]
        if out.device.type == "jax":
            out = keep_heads_split(out)
        context, video = out[:, :text], out[:, text:]
        if out.device.type == "jax":
            video, context = stream_layout(video, video=True), stream_layout(context)
        video = attn.to_out[1](attn.to_out[0](video))
        context = attn.to_out[1](attn.to_out[0](context))
        return video, context


class SharedProjectionsView:
    """A CogVideoX attention module as a dual-stream processor (Ulysses', :mod:`hyv_lib.runtimes.ulysses`) expects
    one: the context's projections, QK-norms and output projection are the shared ``to_q/to_k/to_v``, ``norm_q/norm_k``
    and ``to_out``; everything else is the module's. Setting a processor on the view installs it on the module, called
    with the view, so the dual-stream code runs unchanged on CogVideoX's joint attention (attention is over the set of
    tokens, so its [video ; text] order is no matter; outputs are per token)."""

    def __init__(self, attn):
        self.attn = attn

    def __getattr__(self, name: str):  # only for names not defined here
        return getattr(self.attn, name)

    add_q_proj = property(lambda self: self.attn.to_q)
    add_k_proj = property(lambda self: self.attn.to_k)
    add_v_proj = property(lambda self: self.attn.to_v)
    norm_added_q = property(lambda self: self.attn.norm_q)
    norm_added_k = property(lambda self: self.attn.norm_k)

    def to_add_out(self, context: torch.Tensor) -> torch.Tensor:
        return self.attn.to_out[1](self.attn.to_out[0](context))

    def set_processor(self, processor) -> None:
        self.attn.set_processor(_ViewedProcessor(processor, self))


class _ViewedProcessor:
    """Calls a dual-stream ``processor`` with a :class:`SharedProjectionsView` in place of the attention module."""

    def __init__(self, processor, view: SharedProjectionsView):
        self.processor, self.view = processor, view

    def __call__(self, attn, hidden_states, encoder_hidden_states, attention_mask=None, image_rotary_emb=None):
        return self.processor(self.view, hidden_states, encoder_hidden_states, attention_mask, image_rotary_emb)


def use_attention(model: torch.nn.Module, backend: str = "auto", **options: Any) -> int:
    """Install :class:`CogVideoXJointAttnProcessor` on every attention of a CogVideoXTransformer3DModel (one per
    block); returns how many. The backend and its options are checked now, not at the first call."""
    from diffusers.models.attention_processor import Attention, CogVideoXAttnProcessor2_0

    if backend != "auto":
        resolve_backend(backend, next(model.parameters()).device)
    check_options(backend, options)
    installed = 0
    for name, module in model.named_modules():
        if not isinstance(module, Attention):
            continue
        if not isinstance(module.processor, (CogVideoXAttnProcessor2_0, CogVideoXJointAttnProcessor,
                                             _ViewedProcessor)):
            raise NotImplementedError(f"{name}: unexpected attention processor {type(module.processor).__name__} "
                                      "(hyv_lib replaces CogVideoXAttnProcessor2_0; fused QKV is not supported)")
        module.set_processor(CogVideoXJointAttnProcessor(backend, **options))
        installed += 1
    if installed == 0:
        raise ValueError("use_attention found no diffusers Attention module in the model")
    return installed
