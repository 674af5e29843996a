"""Measure generated moving-shape videos: foreground color, motion direction, background; the hyv-tiny gates."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..pipeline.inference import VideoPipeline
from . import data

MIN_FOREGROUND_PIXELS = 12  # fewer than this in a frame: no shape detected there
FOREGROUND_DISTANCE = 0.25  # RGB distance (0..1 scale) from the background that counts as foreground
MIN_MOTION_PX = 2.0  # centroid travel below this is "no motion"


def _as_unit_float(video) -> np.ndarray:
    """uint8 frames [F, H, W, 3] (what stage 3 writes) -> float [F, H, W, 3] in [0, 1]."""
    video = np.asarray(video)
    if video.ndim != 4 or video.shape[-1] != 3:
        raise ValueError(f"video must be frames [F, H, W, 3], got shape {video.shape}")
    return video.astype(np.float32) / 255.0 if video.dtype == np.uint8 else video.astype(np.float32)


def _nearest(color: np.ndarray, palette: dict[str, tuple[float, float, float]]) -> str:
    names = list(palette)
    distances = [np.linalg.norm(color - np.array(palette[n])) for n in names]
    return names[int(np.argmin(distances))]


@dataclass(frozen=True)
class VideoReading:
    """What a video shows, read with simple image statistics (no learned classifier)."""

    background: str
    color: str | None  # None: no foreground found
    direction: str | None  # None: no clear motion
    travel_px: float


def _background_and_foreground(frames: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Background = median color of the border pixels; foreground = mask [F, H, W] of pixels far from it."""
    border = np.concatenate([frames[:, 0], frames[:, -1], frames[:, :, 0], frames[:, :, -1]], axis=1).reshape(-1, 3)
    background = np.median(border, axis=0)
    return background, np.linalg.norm(frames - background, axis=-1) > FOREGROUND_DISTANCE


def foreground_rgb(video) -> np.ndarray | None:
    """Mean RGB (0..1) of the foreground pixels over all frames; None when no shape is found."""
    frames = _as_unit_float(video)
    _, foreground = _background_and_foreground(frames)
    return frames[foreground].mean(axis=0) if foreground.sum() >= MIN_FOREGROUND_PIXELS else None


def _centroids(foreground: np.ndarray) -> np.ndarray:
    ys, xs = np.mgrid[0 : foreground.shape[1], 0 : foreground.shape[2]]
    return np.array([(xs[m].mean(), ys[m].mean()) if m.sum() >= MIN_FOREGROUND_PIXELS else (np.nan, np.nan)
                     for m in foreground]).reshape(-1, 2)


def centroid_track(video) -> np.ndarray:
    """The foreground's centroid in each frame, [F, 2] as (x, y) pixels (y grows downwards); NaN in a frame with
    fewer than :data:`MIN_FOREGROUND_PIXELS` foreground pixels. :func:`read_video` reads the direction from it."""
    return _centroids(_background_and_foreground(_as_unit_float(video))[1])


def read_video(video, colors: dict[str, tuple[float, float, float]] | None = None) -> VideoReading:
    """The foreground's mean color (``foreground_rgb``) is matched to the nearest of ``colors`` (default: the
    training colors), its centroid track (:func:`centroid_track`, first to last frame with a shape) gives the
    direction, and the border's median color the background."""
    frames = _as_unit_float(video)
    background, foreground = _background_and_foreground(frames)
    if foreground.sum() < MIN_FOREGROUND_PIXELS:
        return VideoReading(_nearest(background, data.BACKGROUNDS), None, None, 0.0)
    color = _nearest(frames[foreground].mean(axis=0), data.COLORS if colors is None else colors)
    track = _centroids(foreground)
    centroids = [tuple(c) for c in track if not np.isnan(c[0])]
    direction, travel = None, 0.0
    if len(centroids) >= 2:
        dx, dy = np.subtract(centroids[-1], centroids[0])
        travel = float(np.hypot(dx, dy))
        if travel >= MIN_MOTION_PX:
            direction = ("right" if dx > 0 else "left") if abs(dx) >= abs(dy) else ("down" if dy > 0 else "up")
    return VideoReading(_nearest(background, data.BACKGROUNDS), color, direction, travel)


def attribute_rates(readings: list[VideoReading], combos: list[data.Combo]) -> dict[str, float]:
    """Fraction of videos whose reading matches the caption, per attribute (color, direction, background)."""
    if len(readings) != len(combos) or not combos:
        raise ValueError("need one reading per caption, and at least one")
    return {
        attr: float(np.mean([getattr(r, attr) == getattr(c, attr) for r, c in zip(readings, combos)]))
        for attr in ("color", "direction", "background")
    }


def generate_videos(components: dict[str, Any], preset, prompts: list[str], *, seed: int = 0,
                    num_inference_steps: int | None = None, guidance_scale: float | None = None,
                    progress: bool = True, images: list | None = None) -> list[np.ndarray]:
    """One video per prompt (seeds ``seed``, ``seed + 1``, ...) at the preset's default size and length, through
    :class:`hyv_lib.pipeline.inference.VideoPipeline` on the loaded ``components``: uint8 frames [F, H, W, 3] each.
    ``images`` (one first frame per prompt, PIL images or paths): image-to-video, each at its image's bucket."""
    from tqdm.auto import tqdm

    if images is not None and len(images) != len(prompts):
        raise ValueError(f"images: one per prompt, got {len(images)} for {len(prompts)} prompts")
    pipe = VideoPipeline(preset, components)
    return [pipe.generate(prompt, seed=seed + i, num_inference_steps=num_inference_steps,
                          guidance_scale=guidance_scale, progress=False,
                          image=None if images is None else images[i]).frames
            for i, prompt in enumerate(tqdm(prompts, desc="generate", disable=not progress))]


def first_frame_psnr(video, image) -> float:
    """PSNR (dB, peak 255) of a generated video's first frame against the image it started from (both uint8,
    the image already at the video's size)."""
    return psnr(np.asarray(video)[0], np.asarray(image), peak=255.0)


def psnr(test, reference, peak: float | None = None) -> float:
    """PSNR (dB) of ``test`` against ``reference``; ``peak`` defaults to the reference's value range
    (255 suits uint8 frames; latents have no fixed range, so their spread is the natural peak)."""
    test, reference = (np.asarray(x, dtype=np.float64) for x in (test, reference))
    if test.shape != reference.shape:
        raise ValueError(f"shapes differ: {test.shape} vs {reference.shape}")
    peak = float(reference.max() - reference.min()) if peak is None else peak
    mse = float(np.mean((test - reference) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(peak**2 / mse)
