"""Every patch of diffusers' HunyuanVideo-1.5 classes in one place, each a context manager that restores what it changed."""

from __future__ import annotations

import contextlib
import functools
from typing import Iterator

import torch


@contextlib.contextmanager
def batched_vae_attention() -> Iterator[None]:
    """Let AutoencoderKLHunyuanVideo15 run batches > 1 (diffusers 0.42.1 fails in the mid-block attention).

    Its causal mask is [B, S, S] against queries [B, 1, S, C], so SDPA broadcasts the batch into the head
    axis ("output with shape [B, 1, S, S] doesn't match the broadcast shape [B, B, S, S]"). Inference
    (batch 1) is unaffected; training needs batches, so the mask gets its head axis for the duration.
    """
    from diffusers.models.autoencoders.autoencoder_kl_hunyuanvideo15 import HunyuanVideo15AttnBlock

    original = HunyuanVideo15AttnBlock.prepare_causal_attention_mask
    if getattr(original, "hyv_batched", False):  # already inside: nesting must not add a second axis
        yield
        return

    def with_head_axis(n_frame, n_hw, dtype, device, batch_size=None):
        mask = original(n_frame, n_hw, dtype, device, batch_size=batch_size)
        return mask.unsqueeze(1) if batch_size is not None else mask

    with_head_axis.hyv_batched = True
    HunyuanVideo15AttnBlock.prepare_causal_attention_mask = staticmethod(with_head_axis)
    try:
        yield
    finally:
        HunyuanVideo15AttnBlock.prepare_causal_attention_mask = staticmethod(original)


@contextlib.contextmanager
def rms_norm_floor(floor: float) -> Iterator[None]:
    """Train-time floor on the VAE's RMS norms: ``x / max(norm(x), floor)`` instead of diffusers' 1e-12.

    diffusers normalises each pixel's channel vector with F.normalize, whose gradient grows as 1/norm(x), and we
    saw pixels with norm ~0.1 at the 8-channel first level. The floor bounds that amplification. It is a safety
    measure, not the cure: the 10-100x gradient spikes of our runs persisted with it. Above the floor the output
    is exactly diffusers' own, so the weights load in the unmodified class; ``evaluate_vae`` measures them
    outside this context.
    """
    from diffusers.models.autoencoders.autoencoder_kl_hunyuanvideo15 import HunyuanVideo15RMS_norm

    original = HunyuanVideo15RMS_norm.forward

    def floored(self, x):
        dim = 1 if self.channel_first else -1
        return torch.nn.functional.normalize(x, dim=dim, eps=floor) * self.scale * self.gamma + self.bias

    HunyuanVideo15RMS_norm.forward = floored
    try:
        yield
    finally:
        HunyuanVideo15RMS_norm.forward = original


def block_causal_mask(n_frame: int, n_hw: int, dtype: torch.dtype, device, batch_size: int | None = None):
    """The additive mask of the VAE's mid-block attention (a token sees every token of its own and earlier frames),
    built with one comparison instead of diffusers' Python loop over all ``n_frame * n_hw`` tokens.

    Traced under jit, that loop becomes one slice update per token: 7,936 for a 720p/121-frame decode tile, whose
    TPU compile grew past 17 GB of host memory here and aborted. Same values, same signature as
    ``HunyuanVideo15AttnBlock.prepare_causal_attention_mask`` (diffusers 0.42).
    """
    frame = torch.arange(n_frame * n_hw, device=device) // n_hw
    zero = torch.zeros((), dtype=dtype, device=device)
    minus_inf = torch.full((), float("-inf"), dtype=dtype, device=device)
    mask = torch.where(frame[None, :] <= frame[:, None], zero, minus_inf)
    return mask if batch_size is None else mask.unsqueeze(0).expand(batch_size, -1, -1)


@contextlib.contextmanager
def loop_free_causal_masks(decoder: torch.nn.Module) -> Iterator[None]:
    """While inside, the VAE attention blocks of ``decoder`` build their mask with :func:`block_causal_mask`
    (an attribute on each block instance, removed on exit: the caller's model is left as found)."""
    from diffusers.models.autoencoders.autoencoder_kl_hunyuanvideo15 import HunyuanVideo15AttnBlock

    blocks = [m for m in decoder.modules() if isinstance(m, HunyuanVideo15AttnBlock)]
    for block in blocks:
        block.prepare_causal_attention_mask = block_causal_mask
    try:
        yield
    finally:
        for block in blocks:
            del block.prepare_causal_attention_mask


def frame_causal_attention(block, x: torch.Tensor) -> torch.Tensor:
    """``HunyuanVideo15AttnBlock.forward`` (diffusers 0.42) without its [S, S] mask: the queries of frame i attend the
    keys of frames 0..i, one SDPA call per frame, so no S x S tensor exists (at 720p/121f undecoded in one piece,
    S = 31 x 45 x 80 = 111,600 tokens: diffusers' fp32 mask alone is 46 GiB, built in a Python loop over S rows).
    Same values up to the order of floating-point sums."""
    identity = x
    x = block.norm(x)
    query, key, value = block.to_q(x), block.to_k(x), block.to_v(x)
    batch, channels, frames, height, width = query.shape
    n_hw = height * width

    def tokens(t: torch.Tensor) -> torch.Tensor:  # [B, C, F, H, W] -> [B, 1, F*H*W, C], as diffusers lays them out
        return t.reshape(batch, channels, frames * n_hw).permute(0, 2, 1).unsqueeze(1).contiguous()

    query, key, value = tokens(query), tokens(key), tokens(value)
    out = torch.empty_like(query)
    for frame in range(frames):
        rows, seen = slice(frame * n_hw, (frame + 1) * n_hw), (frame + 1) * n_hw
        out[:, :, rows] = torch.nn.functional.scaled_dot_product_attention(
            query[:, :, rows], key[:, :, :seen], value[:, :, :seen])
    x = out.squeeze(1).reshape(batch, frames, height, width, channels).permute(0, 4, 1, 2, 3)
    return block.proj_out(x) + identity


@contextlib.contextmanager
def frame_causal_vae_attention(module: torch.nn.Module) -> Iterator[None]:
    """While inside, the VAE attention blocks of ``module`` (a VAE or its decoder) run :func:`frame_causal_attention`
    (a ``forward`` attribute on each block instance, removed on exit: the caller's model is left as found)."""
    from diffusers.models.autoencoders.autoencoder_kl_hunyuanvideo15 import HunyuanVideo15AttnBlock

    blocks = [m for m in module.modules() if isinstance(m, HunyuanVideo15AttnBlock)]
    for block in blocks:
        block.forward = functools.partial(frame_causal_attention, block)
    try:
        yield
    finally:
        for block in blocks:
            del block.forward
