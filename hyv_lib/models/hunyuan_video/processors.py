"""HunyuanVideo's attention in hyv_lib: one processor for its dual- and single-stream blocks, a key mask, not S x S."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ...kernels.custom_op import CompilableAttention
from ...kernels.dispatch import check_options, resolve_backend
from ...parallel.sharding import keep_heads_split, stream_layout
from ..attention_qkv import context_qkv, video_qkv
from ..cogvideox.processor import SharedProjectionsView
from ..hunyuan_video15.processors import SelfAttnProcessor


def key_mask(attention_mask: torch.Tensor | None, batch: int, video_tokens: int) -> torch.Tensor | None:
    """The [B, S] key-padding mask of the joint [video ; text] sequence from what a block gets: diffusers' forward
    passes [B, 1, 1, S] (its own 1-D mask, broadcast); the adapter's pieces pass the [B, L] text mask, the video
    tokens in front of it always valid."""
    if attention_mask is None:
        return None
    if attention_mask.ndim == 4:
        return attention_mask.reshape(batch, -1).bool()
    return F.pad(attention_mask.bool(), (video_tokens, 0), value=True)


class HunyuanVideoJointProcessor:
    """Replaces HunyuanVideoAttnProcessor2_0 in both kinds of blocks: the same projections, RMS QK-norm and RoPE (on
    the video tokens only) as diffusers, with :func:`hyv_lib.kernels.dispatch.attention` over [video ; text] and a
    1-D key mask. Dual-stream blocks project the text with ``add_*_proj`` and output it through ``to_add_out``;
    single-stream blocks project both with ``to_q/to_k/to_v`` and have no output projection (``pre_only``: the
    block's ``proj_out`` follows). Inside a sharded jitted step the outputs are pinned as HunyuanVideo-1.5's are."""

    def __init__(self, backend: str = "auto", **options: Any):
        self.backend = backend
        self.options = options
        self.attend = CompilableAttention(backend, **options)  # one opaque op inside torch.compile

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, image_rotary_emb=None):
        video_q, video_k, video_v = video_qkv(attn, hidden_states, image_rotary_emb)
        if encoder_hidden_states is None:
            text_q = text_k = text_v = video_q[:, :0]
        elif attn.add_q_proj is not None:  # dual-stream: the text's own projections
            text_q, text_k, text_v = context_qkv(attn, encoder_hidden_states)
        else:  # single-stream: the same projections and QK-norm, no RoPE
            text_q, text_k, text_v = video_qkv(attn, encoder_hidden_states)
        q, k, v = (torch.cat(pair, dim=1).transpose(1, 2) for pair in ((video_q, text_q), (video_k, text_k),
                                                                        (video_v, text_v)))  # [B, H, S, D]
        video_tokens = hidden_states.shape[1]
        kv_mask = key_mask(attention_mask, q.shape[0], video_tokens)
        out = self.attend(q, k, v, kv_mask).transpose(1, 2).flatten(2, 3).to(video_q.dtype)  # [B, S, H*D]
        if out.device.type == "jax":
            out = keep_heads_split(out)
        video, text = out[:, :video_tokens], out[:, video_tokens:]
        if out.device.type == "jax":
            video, text = stream_layout(video, video=True), stream_layout(text)
        if getattr(attn, "to_out", None) is not None:
            video = attn.to_out[1](attn.to_out[0](video))
        if encoder_hidden_states is None:
            return video, None
        if getattr(attn, "to_add_out", None) is not None:
            text = attn.to_add_out(text)
        return video, text


class SingleStreamView(SharedProjectionsView):
    """A single-stream block's attention as a dual-stream processor (Ulysses') expects one: the text's projections
    and QK-norms are the shared ``to_q/to_k/to_v`` and ``norm_q/norm_k`` (:class:`SharedProjectionsView`), and the
    output projections of both streams are identities (the block's ``proj_out`` follows its attention)."""

    to_out = (torch.nn.Identity(), torch.nn.Identity())

    def to_add_out(self, context: torch.Tensor) -> torch.Tensor:
        return context


def use_attention(model: torch.nn.Module, backend: str = "auto", **options: Any) -> int:
    """Install :class:`HunyuanVideoJointProcessor` on every block's attention of a HunyuanVideoTransformer3DModel and
    HunyuanVideo-1.5's ``SelfAttnProcessor`` (the diagonal of diffusers' [B, 1, L, L] mask) on its token refiner's;
    returns how many. Found by position (the blocks' ``attn``, the refiner blocks' ``attn``), so a processor hyv_lib
    installed before (Ulysses' wrapped one included) is replaced too; the backend and its options are checked now,
    not at the first call."""
    from diffusers.models.attention_processor import AttnProcessor2_0
    from diffusers.models.transformers.transformer_hunyuan_video import HunyuanVideoAttnProcessor2_0

    if backend != "auto":
        resolve_backend(backend, next(model.parameters()).device)
    check_options(backend, options)
    blocks = [*model.transformer_blocks, *model.single_transformer_blocks]
    refiner = list(model.context_embedder.token_refiner.refiner_blocks)
    for kind, modules, stock in (("block", blocks, HunyuanVideoAttnProcessor2_0),
                                 ("token refiner", refiner, AttnProcessor2_0)):
        for index, module in enumerate(modules):
            processor = module.attn.processor
            if type(processor).__module__.startswith("diffusers") and not isinstance(processor, stock):
                raise NotImplementedError(f"{kind} {index}: unexpected attention processor "
                                          f"{type(processor).__name__} (hyv_lib replaces {stock.__name__})")
    for module in blocks:
        module.attn.set_processor(HunyuanVideoJointProcessor(backend, **options))
    for module in refiner:
        module.attn.set_processor(SelfAttnProcessor(backend, **options))
    if not blocks:
        raise ValueError("use_attention found no transformer block in the model")
    return len(blocks) + len(refiner)
