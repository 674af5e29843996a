"""Which frames of a clip are encoded for training: resampled to a frame rate, then a window of them (the first, or a
seeded random one), decoded without holding the rest of the clip."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..base.checks import as_number
from ..base.errors import HyvInputError
from .data_json import IMAGE_EXTENSIONS, EntryError, read_frames, unreadable_video

#: ``--frames``: which window of a clip's (resampled) frames is taken.
FRAME_WINDOWS = ("first", "random")
#: Within this many frames per second of the asked rate a clip is not resampled (MindSpeed-MM's ``auto_interval``
#: rule: a 23.976 fps clip is taken as 24 fps).
SAME_RATE = 0.1


def resample_indices(count: int, source_fps: float | None, fps: float | None) -> list[int]:
    """The source frames of a ``count``-frame clip at ``source_fps`` shown at the times ``k / fps`` (k = 0, 1, ...):
    frame ``floor(k * source_fps / fps)``, the one on screen then, while it exists (MindSpeed-MM's
    ``np.arange(0, count, source_fps / fps).astype(int)``). A 48 fps clip at 24 fps: every second frame; a 12 fps
    one: each frame twice. No resampling (every frame) when ``fps`` or ``source_fps`` is None or they differ by
    less than :data:`SAME_RATE`."""
    if fps is None or source_fps is None or abs(source_fps - fps) < SAME_RATE:
        return list(range(count))
    step = source_fps / fps
    out, k = [], 0
    while True:
        index = math.floor(k * step + 1e-9)  # 1e-9: k * step lands a hair under an integer in floating point
        if index >= count:
            return out
        out.append(index)
        k += 1


def window_start(available: int, num_frames: int, window: str = "first", seed: int = 0, clip_id: str = "") -> int:
    """Where the ``num_frames`` frames start among ``available`` (resampled) ones: 0 for ``first``; for ``random``
    the first 8 bytes of SHA-256(``f"{seed}:{clip_id}"``) (big-endian) modulo ``available - num_frames + 1``, so
    every window is possible (the last too) and a rerun, or another machine, takes the same one."""
    if window == "first" or available <= num_frames:
        return 0
    digest = hashlib.sha256(f"{seed}:{clip_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % (available - num_frames + 1)


@dataclass(frozen=True)
class FrameSampling:
    """How :func:`take_frames` takes a clip's frames: ``num_frames`` of them, after resampling to ``fps`` (None: the
    clip's own rate), from the start (``window="first"``) or a window picked by ``seed`` (``"random"``)."""

    num_frames: int
    fps: float | None = None
    window: str = "first"
    seed: int = 0

    @property
    def default(self) -> bool:
        """The first ``num_frames`` at the clip's own rate (what extract_features always did)."""
        return self.fps is None and self.window == "first"

    def metadata(self, first_at_own_rate: str) -> dict[str, Any]:
        """The features index's metadata of this sampling: ``frame_sampling`` (in words; ``first_at_own_rate`` for
        the default), ``frames`` (the window), ``fps`` (None: not resampled), and ``frame_seed`` with ``random``."""
        if self.default:
            words = first_at_own_rate
        else:
            rate = (f"resampled to {self.fps:g} fps (the source frame shown at each time k/fps; within "
                    f"{SAME_RATE:g} fps of it not resampled)" if self.fps is not None else "at the clip's own rate")
            where = ("the first" if self.window == "first" else
                     "a window picked by frame_seed and the clip's id (each clip's frame_start records it) of")
            words = f"{where} num_frames frames, {rate}; an image is 1 frame"
        return {"frame_sampling": words, "frames": self.window, "fps": self.fps,
                **({"frame_seed": self.seed} if self.window == "random" else {})}


def check_frame_sampling(num_frames: int, fps: Any = None, frames: Any = "first", frame_seed: Any = 0) -> FrameSampling:
    """``--fps`` (None, or a positive frame rate), ``--frames`` (:data:`FRAME_WINDOWS`) and ``--frame_seed`` (an
    integer >= 0) checked; a HyvInputError naming the parameter otherwise."""
    if frames not in FRAME_WINDOWS:
        raise HyvInputError("frames", f"must be one of {', '.join(FRAME_WINDOWS)}, got {frames!r}")
    fps = as_number("fps", fps, low=0, low_open=True)
    seed = as_number("frame_seed", frame_seed, int, low=0)
    return FrameSampling(num_frames=num_frames, fps=fps, window=frames, seed=0 if seed is None else seed)


@dataclass
class TakenFrames:
    """A clip's frames as :func:`take_frames` took them: uint8 ``frames`` [F, H, W, 3], the source's frame rate
    (None for an image), and ``record``: ``frame_start`` (the window's start among the resampled frames) and
    ``source_frames`` (the first and last source frame taken) for the clip's index record."""

    frames: np.ndarray
    fps: float | None
    record: dict[str, Any]


def count_frames(file: str) -> int:
    """The number of frames ffmpeg decodes from a video (a whole pass over it, holding one frame at a time)."""
    import imageio_ffmpeg

    try:
        count, _ = imageio_ffmpeg.count_frames_and_secs(file)
    except (OSError, RuntimeError, ValueError) as err:
        raise unreadable_video(file, err) from None
    return int(count)


def read_indices(file: str, indices: list[int]) -> tuple[np.ndarray, float | None]:
    """The frames ``indices`` (increasing, repeats allowed) of a video, decoded from its start and kept only where
    asked, and its frame rate."""
    import imageio_ffmpeg

    wanted = sorted(set(indices))
    reader, kept, position, targets = None, {}, 0, set(wanted)
    try:
        reader = imageio_ffmpeg.read_frames(file, output_params=["-frames:v", str(wanted[-1] + 1)])
        meta = next(reader)
        width, height = meta["size"]
        for buffer in reader:
            if position in targets:
                kept[position] = np.frombuffer(buffer, dtype=np.uint8).reshape(height, width, 3)
            position += 1
            if position > wanted[-1]:
                break
    except (OSError, RuntimeError, StopIteration, KeyError, ValueError) as err:
        raise unreadable_video(file, err) from None
    finally:
        if reader is not None:
            reader.close()
    missing = [i for i in wanted if i not in kept]
    if missing:
        raise EntryError(f"{file!r} ended after {position} frames; frame {missing[0]} was asked for")
    fps = meta.get("fps")
    return np.stack([kept[i] for i in indices]), (float(fps) if fps else None)


def source_rate(file: str) -> float | None:
    """A video's frame rate as ffmpeg reports it (None when it reports none), without decoding a frame."""
    import imageio_ffmpeg

    reader = None
    try:
        reader = imageio_ffmpeg.read_frames(file, output_params=["-frames:v", "1"])
        fps = next(reader).get("fps")
    except (OSError, RuntimeError, StopIteration, KeyError, ValueError) as err:
        raise unreadable_video(file, err) from None
    finally:
        if reader is not None:
            reader.close()
    return float(fps) if fps else None


def take_frames(file: str, sampling: FrameSampling, clip_id: str = "",
                declared_fps: float | None = None) -> TakenFrames:
    """A clip's frames as ``sampling`` says (an image: its one frame). The source rate is ffmpeg's, else the entry's
    ``fps`` (``declared_fps``); resampling without either is an :class:`EntryError`, as is a clip with fewer than
    ``num_frames`` frames after resampling. The default sampling decodes only the first ``num_frames`` frames; a
    resampled one decodes up to the last frame it takes; ``random`` first counts the clip's frames (a pass over
    it)."""
    n = sampling.num_frames
    if file.lower().endswith(IMAGE_EXTENSIONS) or sampling.default:
        frames, fps = read_frames(file, n)
        if len(frames) < n and not file.lower().endswith(IMAGE_EXTENSIONS):
            raise EntryError(f"has {len(frames)} frame(s); {n} are asked for (num_frames): give a smaller "
                             "`num_frames` (4n+1) or a longer clip")
        return TakenFrames(frames, fps, {"frame_start": 0, "source_frames": [0, len(frames) - 1]})
    fps = source_rate(file) or declared_fps
    if sampling.fps is not None and fps is None:
        raise EntryError(f"{file!r} has no frame rate (ffmpeg reports none and the entry gives no \"fps\"): it cannot "
                         f"be resampled to {sampling.fps:g} fps")
    step = 1.0 if sampling.fps is None or abs(fps - sampling.fps) < SAME_RATE else fps / sampling.fps
    if sampling.window == "random":
        indices = resample_indices(count_frames(file), fps, sampling.fps)
    else:  # enough source frames for the first n resampled ones, whatever the clip's length
        indices = resample_indices(math.floor((n - 1) * step + 1e-9) + 1, fps, sampling.fps)
    start = window_start(len(indices), n, sampling.window, sampling.seed, clip_id)
    chosen = indices[start:start + n]
    if len(chosen) < n:
        rate = f" at {sampling.fps:g} fps" if sampling.fps is not None else ""
        raise EntryError(f"has {len(indices)} frame(s){rate}; {n} are asked for (num_frames): give a smaller "
                         "`num_frames` (4n+1) or a longer clip")
    try:
        frames, _ = read_indices(file, chosen)
    except EntryError as err:
        if "ended after" not in str(err):
            raise
        rate = f" at {sampling.fps:g} fps" if sampling.fps is not None else ""
        raise EntryError(f"is too short for {n} frames{rate} (num_frames): {err}") from None
    return TakenFrames(frames, fps, {"frame_start": start, "source_frames": [chosen[0], chosen[-1]]})
