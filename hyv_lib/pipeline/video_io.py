"""mp4 files: write uint8 frames with imageio-ffmpeg (atomically), read them back."""

from __future__ import annotations

import os
import warnings
from typing import Any

import numpy as np
import torch

from ..base.checks import as_number
from ..base.errors import HyvInputError
from ..base.files import atomic_path


def check_mp4_path(path: Any, argument: str = "path") -> None:
    """HyvInputError naming ``argument`` unless ``path`` is a str or PathLike ending in ``.mp4``: ffmpeg picks the
    container from the suffix, so ``video.avi`` would silently become an AVI file and ``video`` fail late."""
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path).lower().endswith(".mp4"):
        raise HyvInputError(argument, f"must be a path ending in .mp4, got {path!r}")


def write_mp4(frames: torch.Tensor | np.ndarray, path: str, fps: float) -> None:
    """Write uint8 frames [F,H,W,3] as H.264 mp4 (yuv420p, playable everywhere), atomically."""
    import imageio_ffmpeg

    check_mp4_path(path)
    fps = as_number("fps", fps, low=0, low_open=True)
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
