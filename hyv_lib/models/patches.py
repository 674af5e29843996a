"""Every patch of diffusers' HunyuanVideo-1.5 classes in one place, each a context manager that restores what it changed."""

from __future__ import annotations

import contextlib
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
