"""Stage 3's decode: VAE latents to uint8 frames, tiled, tile-parallel over ranks, or on JAX."""

from __future__ import annotations

import contextlib
from typing import Iterator

import numpy as np
import torch

from .placement import placed
from .tile_parallel import tile_parallel_decode
from .tpu_vae import decode_on_jax


def to_uint8_frames(video: torch.Tensor | np.ndarray) -> torch.Tensor:
    """One video as the VAE sees it, [3,F,H,W] in [-1, 1], -> uint8 frames [F,H,W,3] (what stage 3 writes)."""
    video = torch.as_tensor(video)
    if video.ndim != 4 or video.shape[0] != 3:
        raise ValueError(f"video must be [3, F, H, W], got shape {tuple(video.shape)}")
    # [-1, 1] -> [0, 255], as diffusers' VideoProcessor.postprocess_video does.
    frames = ((video.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    return frames.permute(1, 2, 3, 0).contiguous().cpu()


@contextlib.contextmanager
def exact_fp32(device: torch.device, dtype: torch.dtype) -> Iterator[None]:
    """An fp32 decode on a GPU computes in fp32: TF32 convolutions and matmuls (torch's cuDNN default allows TF32
    convolutions) are off inside the block and restored after."""
    if device.type != "cuda" or dtype != torch.float32:
        yield
        return
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


@torch.no_grad()
def decode_latents(vae, latents: torch.Tensor, tiling: bool = True, tile_parallel: bool = False,
                   runtime: str = "torch", dtype: torch.dtype | None = None,
                   device: torch.device | None = None) -> torch.Tensor:
    """Decode ``latents`` [1,C,T,h,w] to uint8 frames [F,H,W,3] with diffusers' VAE.

    Tiling uses diffusers' spatial tiles (256 px, overlap 0.25 by default) and bounds peak memory at
    720p; videos smaller than one tile decode identically either way. ``tile_parallel`` spreads the
    tiles over the torch.distributed ranks (:func:`hyv_lib.runtimes.tile_parallel.tile_parallel_decode`).
    ``runtime="tpu"`` runs the decoder jitted through torchax on JAX's device (:mod:`hyv_lib.runtimes.tpu_vae`), in
    ``dtype`` (default: the VAE's); the tiling and blending stay diffusers' own. On the torch runtime the decode runs on
    ``device`` in ``dtype`` (None: where the VAE is, in its dtype): the VAE is moved for this call only and put back
    after (:func:`placed`); an fp32 decode on a GPU has TF32 off (:func:`exact_fp32`).
    """
    if runtime not in ("torch", "tpu"):
        raise ValueError(f"runtime must be 'torch' or 'tpu', got {runtime!r}")
    was_tiling = vae.use_tiling  # the caller's setting, restored below
    vae.use_tiling = bool(tiling)  # what enable_tiling()/disable_tiling() set
    try:
        if runtime == "tpu":
            param = next(vae.parameters())
            video, _ = decode_on_jax(vae, latents.to(param.device, param.dtype) / vae.config.scaling_factor, dtype)
        else:
            with placed(vae, device, dtype) as on_device:
                param = next(on_device.parameters())
                z = latents.to(param.device, param.dtype) / vae.config.scaling_factor
                with exact_fp32(param.device, param.dtype):
                    video = tile_parallel_decode(on_device, z) if tiling and tile_parallel else on_device.decode(z).sample
    finally:
        vae.use_tiling = was_tiling
    return to_uint8_frames(video[0])
