"""Stage-3 helpers: VAE output to uint8 frames and mp4 read/write through imageio-ffmpeg."""

from __future__ import annotations

import os
import warnings
from typing import Any

import numpy as np
import torch

from .errors import HyvInputError
from .stage_io import atomic_path


def to_uint8_frames(video: torch.Tensor | np.ndarray) -> torch.Tensor:
    """One video as the VAE sees it, [3,F,H,W] in [-1, 1], -> uint8 frames [F,H,W,3] (what stage 3 writes)."""
    video = torch.as_tensor(video)
    if video.ndim != 4 or video.shape[0] != 3:
        raise ValueError(f"video must be [3, F, H, W], got shape {tuple(video.shape)}")
    # [-1, 1] -> [0, 255], as diffusers' VideoProcessor.postprocess_video does.
    frames = ((video.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    return frames.permute(1, 2, 3, 0).contiguous().cpu()


@torch.no_grad()
def decode_latents(vae, latents: torch.Tensor, tiling: bool = True, tile_parallel: bool = False,
                   runtime: str = "torch", dtype: torch.dtype | None = None) -> torch.Tensor:
    """Decode ``latents`` [1,C,T,h,w] to uint8 frames [F,H,W,3] with diffusers' VAE.

    Tiling uses diffusers' spatial tiles (256 px, overlap 0.25 by default) and bounds peak memory at
    720p; videos smaller than one tile decode identically either way. ``tile_parallel`` spreads the
    tiles over the torch.distributed ranks (:func:`hyv_lib.tile_parallel.tile_parallel_decode`).
    ``runtime="tpu"`` runs the decoder jitted through torchax on JAX's device (:mod:`hyv_lib.tpu_vae`), in
    ``dtype`` (default: the VAE's); the tiling and blending stay diffusers' own.
    """
    if runtime not in ("torch", "tpu"):
        raise ValueError(f"runtime must be 'torch' or 'tpu', got {runtime!r}")
    was_tiling = vae.use_tiling  # the caller's setting, restored below
    vae.use_tiling = bool(tiling)  # what enable_tiling()/disable_tiling() set
    try:
        param = next(vae.parameters())
        z = latents.to(param.device, param.dtype) / vae.config.scaling_factor
        if runtime == "tpu":
            from .tpu_vae import decode_on_jax

            video, _ = decode_on_jax(vae, z, dtype)
        elif tiling and tile_parallel:
            from .tile_parallel import tile_parallel_decode

            video = tile_parallel_decode(vae, z)
        else:
            video = vae.decode(z).sample
    finally:
        vae.use_tiling = was_tiling
    return to_uint8_frames(video[0])


def check_mp4_path(path: Any, argument: str = "path") -> None:
    """HyvInputError naming ``argument`` unless ``path`` is a str or PathLike ending in ``.mp4``: ffmpeg picks the
    container from the suffix, so ``video.avi`` would silently become an AVI file and ``video`` fail late."""
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path).lower().endswith(".mp4"):
        raise HyvInputError(argument, f"must be a path ending in .mp4, got {path!r}")


def write_mp4(frames: torch.Tensor | np.ndarray, path: str, fps: float) -> None:
    """Write uint8 frames [F,H,W,3] as H.264 mp4 (yuv420p, playable everywhere), atomically."""
    import imageio_ffmpeg

    check_mp4_path(path)
    if isinstance(frames, torch.Tensor):
        frames = frames.detach().cpu().numpy()
    array = np.ascontiguousarray(frames)
    if array.dtype != np.uint8:  # a float [-1, 1] video would otherwise be cast to an all-black one
        raise HyvInputError("frames", f"must be uint8 [F, H, W, 3] (video.to_uint8_frames converts a [-1, 1] "
                                      f"[3, F, H, W] video), got dtype {array.dtype}")
    if array.ndim != 4 or array.shape[-1] != 3:
        raise HyvInputError("frames", f"must be uint8 [F, H, W, 3], got shape {array.shape}")
    num_frames, height, width, _ = array.shape
    with atomic_path(path) as tmp, warnings.catch_warnings():
        # ffmpeg is a fork+exec child; Python warns about fork() whenever JAX's threads exist.
        warnings.filterwarnings("ignore", message="os.fork", category=RuntimeWarning)
        writer = imageio_ffmpeg.write_frames(
            tmp, (width, height), fps=fps, codec="libx264", pix_fmt_out="yuv420p",
            macro_block_size=16, ffmpeg_log_level="error", output_params=["-crf", "18"],
        )
        writer.send(None)
        for frame in array:
            writer.send(frame)
        writer.close()


def read_mp4(path: str) -> tuple[np.ndarray, dict]:
    """Read an mp4 back as uint8 frames [F,H,W,3] plus ffmpeg's metadata (fps, size, ...)."""
    import imageio_ffmpeg

    reader = imageio_ffmpeg.read_frames(path)
    meta = reader.__next__()
    width, height = meta["size"]
    frames = [np.frombuffer(buf, dtype=np.uint8).reshape(height, width, 3) for buf in reader]
    return np.stack(frames), meta
