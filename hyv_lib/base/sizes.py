"""Video sizes: the aspect-ratio buckets and the one check of height, width and frames against a preset."""

from __future__ import annotations

import functools
from typing import Any

from .checks import as_number
from .errors import HyvInputError

#: A :class:`hyv_lib.base.presets.Preset` (not imported: presets imports this module).
Preset = Any


def parse_aspect_ratio(aspect_ratio: str) -> tuple[int, int]:
    """'16:9' -> (16, 9) as (width, height), the official CLI's W:H convention."""
    try:
        w, h = (int(x) for x in aspect_ratio.split(":"))
        if w <= 0 or h <= 0:
            raise ValueError
    except ValueError:
        raise HyvInputError(
            "aspect_ratio", f"must be W:H with positive integers (e.g. 16:9, 9:16, 4:3, 1:1), got {aspect_ratio!r}"
        ) from None
    return w, h


#: The resolution buckets stop at 4:1 either way round (diffusers' generate_crop_size_list): a more elongated frame
#: has no bucket.
MAX_ASPECT_RATIO = 4.0


def beyond_buckets(width: int, height: int) -> bool:
    """Whether a width:height ratio is more elongated than any bucket (:data:`MAX_ASPECT_RATIO`)."""
    return max(width, height) / min(width, height) > MAX_ASPECT_RATIO


def bucket_size(preset: Preset, aspect_ratio: str = "16:9") -> tuple[int, int]:
    """(height, width) of the preset's resolution bucket closest to ``aspect_ratio`` (:func:`bucket_for`)."""
    w, h = parse_aspect_ratio(aspect_ratio)
    if beyond_buckets(w, h):
        raise HyvInputError("aspect_ratio", f"ratio must be at most {MAX_ASPECT_RATIO:g} (buckets stop at "
                                            f"{MAX_ASPECT_RATIO:g}:1), got {aspect_ratio!r}")
    return bucket_for(preset.target_size, preset.pixel_stride, w, h)


@functools.lru_cache(maxsize=None)
def buckets(target_size: int, stride: int) -> tuple[tuple[int, int], ...]:
    """The resolution buckets of ``target_size`` (about ``target_size**2`` pixels) in whole ``stride`` tiles, as
    (height, width), at most :data:`MAX_ASPECT_RATIO` either way round.

    With ``n = round((target_size / stride)**2)`` tiles, the sides in tiles are the pairs (a, b) on the staircase
    under the hyperbola a * b = n: for each a from n down to 1, every b from ``n // (a + 1)`` (at least 1) up to
    ``n // a``. The order is the one HunyuanVideo-1.5's data tools list them in (ties go to the earlier bucket), so
    the pick matches diffusers' ``calculate_default_height_width`` (tests compare the two over many ratios).
    """
    n = round((target_size / stride) ** 2)
    sizes = []
    for a in range(n, 0, -1):
        for b in range(max(1, n // (a + 1)), n // a + 1):
            if max(a, b) <= MAX_ASPECT_RATIO * min(a, b):
                sizes.append((a * stride, b * stride))
    return tuple(sizes)


@functools.lru_cache(maxsize=None)
def bucket_for(target_size: int, stride: int, w: int, h: int) -> tuple[int, int]:
    """(height, width) of the bucket (:func:`buckets`) whose height:width ratio (to 5 decimals) is nearest to
    ``h / w`` without crossing it towards square: a portrait frame gets a bucket at most as tall for its width, a
    landscape one at least as tall. That one-sided match differs from the official repo's for some ratios (e.g.
    9:16 at 720p)."""
    ratio = h / w
    sizes = buckets(target_size, stride)
    ratios = [round(bh / bw, 5) for bh, bw in sizes]
    fits = [i for i, r in enumerate(ratios) if (r <= ratio if ratio >= 1 else r >= ratio)]
    if not fits:
        raise HyvInputError("aspect_ratio", f"no bucket of size {target_size} fits a {w}:{h} frame "
                                            f"(buckets stop at {MAX_ASPECT_RATIO:g}:1)")
    best = min(fits, key=lambda i: (abs(ratios[i] - ratio), i))
    return sizes[best]


def video_size(preset: Preset, height: Any = None, width: Any = None, video_length: Any = None,
               aspect_ratio: str = "16:9") -> tuple[int, int, int]:
    """(height, width, video_length) checked against ``preset`` (a HyvInputError naming the parameter otherwise): both
    sides or neither (then the ``aspect_ratio`` bucket, which is checked either way), positive multiples of the VAE's
    spatial compression, 4n+1 frames; unset ones take the preset's. The one size check of the stages and of the
    compile-for-TPU path."""
    height, width, video_length = (as_number(name, value, int) for name, value in (
        ("height", height), ("width", width), ("video_length", video_length)))
    video_length = preset.default_video_length if video_length is None else video_length
    if video_length < 1 or (video_length - 1) % preset.temporal_compression:
        raise HyvInputError("video_length", f"must be 4n+1 (e.g. 9, 33, 61, 121), got {video_length}")
    if (height is None) != (width is None):
        raise HyvInputError("height" if height is None else "width",
                            "give both `height` and `width`, or neither (then `aspect_ratio` picks a bucket)")
    stride = preset.pixel_stride  # the VAE's compression times the patch: whole latent patches
    for name, value in (("height", height), ("width", width)):
        if value is not None and (value <= 0 or value % stride):
            raise HyvInputError(name, f"must be a positive multiple of {stride} for preset {preset.name}, "
                                      f"got {value}")
    bucket = bucket_size(preset, aspect_ratio)  # validates aspect_ratio even when a size is given
    height, width = bucket if height is None else (height, width)
    return height, width, video_length


def default_size(preset: Preset) -> tuple[int, int]:
    """The 16:9 bucket: 480x848 for 480p, 720x1280 for 720p (diffusers' T2V default)."""
    return bucket_size(preset, "16:9")
