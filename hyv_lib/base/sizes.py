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
            "--aspect_ratio", f"must be W:H with positive integers (e.g. 16:9, 9:16, 4:3, 1:1), got {aspect_ratio!r}"
        ) from None
    return w, h


#: The resolution buckets stop at 4:1 either way round (diffusers' generate_crop_size_list): a more elongated frame
#: has no bucket.
MAX_ASPECT_RATIO = 4.0


def beyond_buckets(width: int, height: int) -> bool:
    """Whether a width:height ratio is more elongated than any bucket (:data:`MAX_ASPECT_RATIO`)."""
    return max(width, height) / min(width, height) > MAX_ASPECT_RATIO


def bucket_size(preset: Preset, aspect_ratio: str = "16:9") -> tuple[int, int]:
    """(height, width) of the preset's resolution bucket closest to ``aspect_ratio``, as diffusers picks it.

    Uses diffusers' HunyuanVideo15ImageProcessor.calculate_default_height_width, whose bucket list and
    one-sided nearest-ratio match differ from the official repo for some ratios (e.g. 9:16 at 720p).
    """
    w, h = parse_aspect_ratio(aspect_ratio)
    if beyond_buckets(w, h):
        raise HyvInputError("--aspect_ratio", f"ratio must be at most {MAX_ASPECT_RATIO:g} (buckets stop at "
                                              f"{MAX_ASPECT_RATIO:g}:1), got {aspect_ratio!r}")
    return bucket_for(preset.target_size, preset.pixel_stride, w, h)


@functools.lru_cache(maxsize=None)
def bucket_for(target_size: int, stride: int, w: int, h: int) -> tuple[int, int]:
    from diffusers.pipelines.hunyuan_video1_5.image_processor import HunyuanVideo15ImageProcessor

    processor = HunyuanVideo15ImageProcessor(vae_scale_factor=stride)
    height, width = processor.calculate_default_height_width(h, w, target_size)
    return int(height), int(width)


def video_size(preset: Preset, height: Any = None, width: Any = None, video_length: Any = None,
               aspect_ratio: str = "16:9") -> tuple[int, int, int]:
    """(height, width, video_length) checked against ``preset`` (a HyvInputError naming the flag otherwise): both
    sides or neither (then the ``aspect_ratio`` bucket, which is checked either way), positive multiples of the VAE's
    spatial compression, 4n+1 frames; unset ones take the preset's. The one size check of the stages and of the
    compile-for-TPU path."""
    height, width, video_length = (as_number(name, value, int) for name, value in (
        ("--height", height), ("--width", width), ("--video_length", video_length)))
    video_length = preset.default_video_length if video_length is None else video_length
    if video_length < 1 or (video_length - 1) % preset.temporal_compression:
        raise HyvInputError("--video_length", f"must be 4n+1 (e.g. 9, 33, 61, 121), got {video_length}")
    if (height is None) != (width is None):
        raise HyvInputError("--height" if height is None else "--width",
                            "give both --height and --width, or neither (then --aspect_ratio picks a bucket)")
    stride = preset.pixel_stride  # the VAE's compression times the patch: whole latent patches
    for name, value in (("--height", height), ("--width", width)):
        if value is not None and (value <= 0 or value % stride):
            raise HyvInputError(name, f"must be a positive multiple of {stride} for preset {preset.name}, "
                                      f"got {value}")
    bucket = bucket_size(preset, aspect_ratio)  # validates aspect_ratio even when a size is given
    height, width = bucket if height is None else (height, width)
    return height, width, video_length


def default_size(preset: Preset) -> tuple[int, int]:
    """The 16:9 bucket: 480x848 for 480p, 720x1280 for 720p (diffusers' T2V default)."""
    return bucket_size(preset, "16:9")
