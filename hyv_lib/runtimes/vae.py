"""Stage 3's decode: VAE latents to uint8 frames, tiled, tile-parallel over ranks, or on JAX."""

from __future__ import annotations

import contextlib
from typing import Iterator

import numpy as np
import torch

from ..models.devices import placed
from ..models.patches import frame_causal_vae_attention
from .jax_vae import decode_on_jax
from .names import VAE_RUNTIMES, runtime_choices, runtime_name
from .tile_parallel import tile_parallel_decode


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


def latent_tile(vae) -> tuple[int, int]:
    """The (height, width) in latents of one spatial tile of diffusers' tiled decode: the VAE class's latent-side
    minimums where it keeps them (HunyuanVideo-1.5's, CogVideoX's), else its sample-side sizes over the spatial
    compression (HunyuanVideo's VAE computes them so in ``_decode``)."""
    if hasattr(vae, "tile_latent_min_height"):
        return vae.tile_latent_min_height, vae.tile_latent_min_width
    ratio = vae.config.spatial_compression_ratio
    return vae.tile_sample_min_height // ratio, vae.tile_sample_min_width // ratio


@torch.no_grad()
def decode_latents(vae, latents: torch.Tensor, tiling: bool = True, tile_parallel: bool = False,
                   runtime: str = "torch", dtype: torch.dtype | None = None,
                   device: torch.device | None = None, tile_px: int | None = None) -> torch.Tensor:
    """Decode ``latents`` [1,C,T,h,w] to uint8 frames [F,H,W,3] with diffusers' VAE.

    Tiling uses diffusers' spatial tiles (256 px, overlap 0.25 by default; ``tile_px``: square tiles of that many
    pixels for this call, e.g. :func:`hyv_lib.runtimes.vae_memory.tile_for_budget`'s) and bounds peak memory at
    720p; videos smaller than one tile decode identically either way. A tile spans all the video's frames. ``tile_parallel`` spreads the
    tiles over the torch.distributed ranks (:func:`hyv_lib.runtimes.tile_parallel.tile_parallel_decode`).
    ``runtime="jax"`` runs the decoder jitted through torchax on JAX's device (:mod:`hyv_lib.runtimes.jax_vae`), in
    ``dtype`` (default: the VAE's); the tiling and blending stay diffusers' own. On the torch runtime the decode runs on
    ``device`` in ``dtype`` (None: where the VAE is, in its dtype): the VAE is moved for this call only and put back
    after (:func:`placed`); an fp32 decode on a GPU has TF32 off (:func:`exact_fp32`); the mid-block attention runs
    frame by frame with no [S, S] mask (:func:`hyv_lib.models.patches.frame_causal_attention`).
    """
    runtime = runtime_name(runtime)
    if runtime not in VAE_RUNTIMES:
        raise ValueError(f"runtime must be {runtime_choices(VAE_RUNTIMES)}, got {runtime!r}")
    # the tile sizes the VAE class has (some keep latent-side minimums, some sample-side strides instead)
    tile_fields = [name for name in ("use_tiling", "tile_sample_min_height", "tile_sample_min_width",
                                     "tile_latent_min_height", "tile_latent_min_width", "tile_sample_stride_height",
                                     "tile_sample_stride_width") if hasattr(vae, name)]
    saved = {name: getattr(vae, name) for name in tile_fields}  # the caller's settings, restored below
    vae.use_tiling = bool(tiling)  # what enable_tiling()/disable_tiling() set
    if tile_px is not None:
        ratio = vae.config.spatial_compression_ratio
        if tile_px % ratio or tile_px <= 0:
            raise ValueError(f"tile_px must be a positive multiple of {ratio}, got {tile_px}")
        vae.tile_sample_min_height = vae.tile_sample_min_width = tile_px
        if "tile_latent_min_height" in saved:
            vae.tile_latent_min_height = vae.tile_latent_min_width = tile_px // ratio
        for side in ("height", "width"):  # strides keep the VAE's own overlap fraction
            if f"tile_sample_stride_{side}" in saved:
                stride = tile_px * saved[f"tile_sample_stride_{side}"] // saved[f"tile_sample_min_{side}"]
                setattr(vae, f"tile_sample_stride_{side}", max(ratio, stride // ratio * ratio))
    try:
        if runtime == "jax":
            param = next(vae.parameters())
            video, _ = decode_on_jax(vae, latents.to(param.device, param.dtype) / vae.config.scaling_factor, dtype)
        else:
            with placed(vae, device, dtype) as on_device:
                param = next(on_device.parameters())
                z = latents.to(param.device, param.dtype) / vae.config.scaling_factor
                with exact_fp32(param.device, param.dtype), frame_causal_vae_attention(on_device):
                    video = tile_parallel_decode(on_device, z) if tiling and tile_parallel else on_device.decode(z).sample
    finally:
        for name, value in saved.items():
            setattr(vae, name, value)
    return to_uint8_frames(video[0])
