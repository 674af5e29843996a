"""Image-to-video conditioning: read and check the first frame, its bucket, and the family's crop and encoding of it."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import torch

from ..base.errors import HyvInputError
from ..base.presets import MAX_ASPECT_RATIO, Preset, beyond_buckets
from ..models.families import PRESETS, family_for
from .settings import Stage2Settings

#: PIL modes taken as they are converted to RGB (as diffusers' processors do); 16-bit, float and CMYK images are
#: refused rather than silently clipped or colour-converted.
IMAGE_MODES = ("RGB", "RGBA", "L", "LA", "P")


def load_image(path: Any, argument: str = "image_path"):
    """The RGB PIL image at ``path``; a HyvInputError naming ``argument`` when it is missing, unreadable, in a mode
    outside :data:`IMAGE_MODES`, or of a size no bucket takes (a side under 16 px or a ratio beyond 4:1)."""
    from PIL import Image, UnidentifiedImageError

    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise HyvInputError(argument, f"must be the path of a PNG or JPEG image, got {path!r}")
    path = os.path.expanduser(path)  # "~/frame.png" from Python as from a shell
    if not os.path.isfile(path):
        raise HyvInputError(argument, f"{str(path)!r} does not exist or is not a file")
    try:
        with Image.open(path) as opened:
            opened.load()
            image = opened.copy()
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as err:
        raise HyvInputError(argument, f"{str(path)!r} is not a readable image ({err})") from None
    return check_image(image, argument)


def check_image(image, argument: str = "image"):
    """A PIL image checked and converted to RGB (see :func:`load_image`)."""
    from PIL import Image

    if not isinstance(image, Image.Image):
        raise HyvInputError(argument, f"must be a PIL image, got {type(image).__name__}")
    if image.mode not in IMAGE_MODES:
        raise HyvInputError(argument, f"image mode {image.mode!r} is not supported; save it as 8-bit RGB, RGBA, "
                                      f"grayscale or palette PNG/JPEG (modes {', '.join(IMAGE_MODES)})")
    width, height = image.size
    if min(width, height) < 16:
        raise HyvInputError(argument, f"image is {width}x{height}; each side must be at least 16 pixels")
    if beyond_buckets(width, height):
        raise HyvInputError(argument, f"image is {width}x{height}, a ratio beyond {MAX_ASPECT_RATIO:g}:1 that no "
                                      "bucket takes; crop it first")
    return image.convert("RGB")


def image_bucket(preset: Preset, image) -> tuple[int, int]:
    """(height, width) of the preset's bucket for the image's aspect ratio, as diffusers' I2V pipeline picks it."""
    return preset.image_bucket(*image.size)


def crop_to_bucket(preset: Preset, image):
    """The image resized to cover its bucket and centre-cropped to it, as the preset's image-to-video pipeline does
    (:meth:`hyv_lib.models.family.ModelFamily.crop_image`; HunyuanVideo-1.5:
    :func:`hyv_lib.models.hunyuan_video15.image.crop_to_bucket`)."""
    return family_for(preset).crop_image(preset, image)


def crop_frame(preset: Preset, image):
    """A training clip's frame cropped to its bucket as the preset's family crops frames, text-to-video models too
    (:meth:`hyv_lib.models.family.ModelFamily.crop_frame`)."""
    return family_for(preset).crop_frame(preset, image)


def encode_image(components: dict[str, Any], preset: Preset, image, device: torch.device | None = None,
                 release: bool = False) -> dict[str, torch.Tensor]:
    """The stage-1 tensors of a first frame (already :func:`crop_to_bucket`-ed), on the host CPU, by the preset's
    family (:meth:`hyv_lib.models.family.ModelFamily.encode_image`; HunyuanVideo-1.5:
    :func:`hyv_lib.models.hunyuan_video15.image.encode_image`)."""
    return family_for(preset).encode_image(components, preset, image, device=device, release=release)


# ------------------------------------------------------------------------------------------------- stage 1
def check_task(preset: Preset, has_image: bool, argument: str = "image_path") -> str:
    """"i2v" with a first frame, else "t2v"; a HyvInputError naming ``argument`` when the preset's checkpoint was not
    trained for that task (an image for a text-to-video checkpoint, or none for an image-to-video one)."""
    task = "i2v" if has_image else "t2v"
    if task not in preset.tasks:
        if not has_image:
            raise HyvInputError(argument, f"preset {preset.name} is an image-to-video checkpoint: give the first "
                                          "frame (a PNG or JPEG image)")
        others = ", ".join(n for n, p in PRESETS.items() if task in p.tasks and not p.is_tiny)
        raise HyvInputError(argument, f"preset {preset.name} is a text-to-video checkpoint; image-to-video presets: "
                                      f"{others} (or the tiny ones)")
    return task


def image_size_settings(settings: Stage2Settings, size: tuple[int, int]) -> Stage2Settings:
    """Image-to-video: the first frame's bucket (height, width) is the video's size; a different --height/--width is
    a HyvInputError (the condition latents could not be placed)."""
    for name, given, fixed in (("height", settings.height, size[0]), ("width", settings.width, size[1])):
        if given is not None and given != fixed:
            raise HyvInputError(name, f"is {given}, but the first frame was bucketed to {size[0]}x{size[1]} in stage "
                                      "1 and decides the video's size; leave `height` and `width` unset")
    return dataclasses.replace(settings, height=size[0], width=size[1])


def first_frame(preset, image, settings: Stage2Settings, argument: str = "image_path") -> tuple[Stage2Settings, Any]:
    """Image-to-video's first frame: ``image`` (a path, or a PIL image) loaded and checked (HyvInputError naming
    ``argument``), ``settings`` with the size of its bucket (:func:`image_size_settings`), and the frame cropped to
    that bucket (what stage 1 encodes)."""
    image = load_image(image, argument) if isinstance(image, (str, os.PathLike)) else check_image(image, argument)
    return image_size_settings(settings, image_bucket(preset, image)), crop_to_bucket(preset, image)
