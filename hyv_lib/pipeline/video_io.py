"""mp4 files: write uint8 frames with imageio-ffmpeg's ffmpeg (atomically, its exit status checked), read them back."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import tempfile
import warnings
from fractions import Fraction
from typing import Any

import numpy as np
import torch

from ..base.checks import as_number
from ..base.errors import HyvFaultError, HyvInputError
from ..base.files import atomic_path

#: Frame rates an mp4 takes, measured with imageio-ffmpeg 0.8.1's ffmpeg and libx264: 1e-4 fps and 999 fps wrote and
#: read back; at 1000 fps and above the file reads back at 0 fps, and below 1e-5 ffmpeg fails. ``fps`` is in
#: [MIN_FPS, MAX_FPS).
MIN_FPS, MAX_FPS = 0.001, 1000.0
#: What ffmpeg's log says when the operating system refused a write: turned back into that OSError.
_WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO)


def check_mp4_path(path: Any, argument: str = "path") -> None:
    """HyvInputError naming ``argument`` unless ``path`` is a str or PathLike ending in ``.mp4``: ffmpeg picks the
    container from the suffix, so ``video.avi`` would silently become an AVI file and ``video`` fail late."""
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path).lower().endswith(".mp4"):
        raise HyvInputError(argument, f"must be a path ending in .mp4, got {path!r}")


def check_fps(fps: Any, argument: str = "fps") -> float | None:
    """``fps`` as a Python float in [:data:`MIN_FPS`, :data:`MAX_FPS`) (None stays None: the preset's); a
    HyvInputError naming ``argument`` otherwise (``fps=inf`` or ``1e308`` would reach ffmpeg as no frame rate it
    can write)."""
    return as_number(argument, fps, low=MIN_FPS, high=MAX_FPS)


def _ffmpeg_failure(code: int, log: str, path: str) -> Exception:
    """The exception for an ffmpeg that exited with ``code``: the OSError its log names (disk full, read-only, I/O
    error, ...) for ``path``, else a HyvFaultError with its last log line."""
    for number in _WRITE_ERRNOS:
        if os.strerror(number) in log:
            return OSError(number, os.strerror(number), path)
    last = next((line.strip() for line in reversed(log.splitlines()) if line.strip()), "no message")
    return HyvFaultError(path, f"ffmpeg could not write the video (exit status {code}: {last})")


def write_mp4(frames: torch.Tensor | np.ndarray, path: str, fps: float) -> None:
    """Write uint8 frames [F,H,W,3] as H.264 mp4 (yuv420p, playable everywhere), atomically.

    ffmpeg runs as imageio-ffmpeg's ``write_frames`` ran it (same binary and options), but its exit status is
    checked: ``write_frames`` ignores it, so a full disk left a truncated mp4 in place. A failed write raises the
    OSError its log names (for ``path``) or a HyvFaultError, and leaves no file."""
    import imageio_ffmpeg

    check_mp4_path(path)
    fps = check_fps(fps, "fps")
    if fps is None:
        raise HyvInputError("fps", "must be a number of frames per second, got None")
    if isinstance(frames, torch.Tensor):
        frames = frames.detach().cpu().numpy()
    array = np.ascontiguousarray(frames)
    if array.dtype != np.uint8:  # a float [-1, 1] video would otherwise be cast to an all-black one
        raise HyvInputError("frames", f"must be uint8 [F, H, W, 3] (video.to_uint8_frames converts a [-1, 1] "
                                      f"[3, F, H, W] video), got dtype {array.dtype}")
    if array.ndim != 4 or array.shape[-1] != 3:
        raise HyvInputError("frames", f"must be uint8 [F, H, W, 3], got shape {array.shape}")
    _, height, width, _ = array.shape
    command = [imageio_ffmpeg.get_ffmpeg_exe(), "-y", "-f", "rawvideo", "-vcodec", "rawvideo", "-s",
               f"{width}x{height}", "-pix_fmt", "rgb24", "-r", str(Fraction(fps).limit_denominator()), "-i", "-",
               "-an", "-vcodec", "libx264", "-pix_fmt", "yuv420p"]
    padded = (-(-width // 16) * 16, -(-height // 16) * 16)  # H.264's 16-pixel macro blocks, as write_frames pads
    if padded != (width, height):
        command += ["-vf", f"scale={padded[0]}:{padded[1]}"]
    command += ["-v", "error", "-crf", "18"]
    with atomic_path(path) as tmp, tempfile.TemporaryFile() as log, warnings.catch_warnings():
        # ffmpeg is a fork+exec child; Python warns about fork() whenever JAX's threads exist.
        warnings.filterwarnings("ignore", message="os.fork", category=RuntimeWarning)
        process = subprocess.Popen([*command, tmp], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=log)
        try:
            for frame in array:
                process.stdin.write(frame.data)
        except BrokenPipeError:  # ffmpeg stopped early: its exit status and log say why
            pass
        except BaseException:  # interrupted: no file
            process.kill()
            raise
        finally:
            with contextlib.suppress(OSError):
                process.stdin.close()  # end of input: ffmpeg finishes the file
            code = process.wait()
        if code:
            log.seek(0)
            raise _ffmpeg_failure(code, log.read().decode(errors="replace"), os.fspath(path))


def read_mp4(path: str) -> tuple[np.ndarray, dict]:
    """Read an mp4 back as uint8 frames [F,H,W,3] plus ffmpeg's metadata (fps, size, ...)."""
    import imageio_ffmpeg

    with warnings.catch_warnings():  # ffmpeg is a fork+exec child, as in write_mp4
        warnings.filterwarnings("ignore", message="os.fork", category=RuntimeWarning)
        reader = imageio_ffmpeg.read_frames(path)
        meta = reader.__next__()
        width, height = meta["size"]
        frames = [np.frombuffer(buf, dtype=np.uint8).reshape(height, width, 3) for buf in reader]
    return np.stack(frames), meta
