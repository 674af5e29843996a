"""MindSpeed-MM's data.json: read and check its entries, and load each clip's frames cropped to the preset's bucket."""

from __future__ import annotations

import hashlib
import json
import math
import numbers
import os
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..base.checks import as_number
from ..base.errors import HyvInputError
from ..base.presets import Preset
from ..pipeline.batch import sha256_json
from ..pipeline.image import check_image, crop_frame, load_image

#: Files read as one-frame clips (as MindSpeed-MM reads images); anything else is decoded as a video by ffmpeg.
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".webp")
#: ``--caption``: which caption of an entry whose ``cap`` is a list is encoded (:func:`caption_of`); ``first`` is the
#: default.
CAPTION_CHOICES = ("first", "random")


class EntryError(ValueError):
    """One data.json entry that cannot become features (bad field, missing or unreadable file, too few frames): it is
    reported, recorded under the index's ``failed`` and skipped; the other entries go on."""


@dataclass(frozen=True)
class ClipEntry:
    """One checked data.json entry: ``index`` (its position in the list), ``path`` (as written), ``file`` (absolute:
    a relative path is relative to the data.json's folder), ``caption`` (the one encoded, :func:`caption_of`), the
    entry as written (``raw``) and ``id``: 16 hex digits of the SHA-256 of the entry with ``file`` for ``path``, so a
    rerun knows an entry it has done, and an edited one (another caption, another file) is a new clip."""

    index: int
    path: str
    file: str
    caption: str
    raw: dict[str, Any] = field(repr=False)
    id: str = ""


def read_data_json(path: Any, argument: str = "data_json") -> list[Any]:
    """The list a data.json holds; a HyvInputError naming ``argument`` when the file is missing, not UTF-8 JSON, or
    not a list (MindSpeed-MM's format: ``[{"path", "cap", "num_frames", "fps", "resolution": {"height", "width"}},
    ...]``)."""
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise HyvInputError(argument, f"must be the path of a data.json file, got {path!r}")
    path = os.path.expanduser(path)
    if not os.path.isfile(path):
        raise HyvInputError(argument, f"{str(path)!r} does not exist or is not a file")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (UnicodeDecodeError, ValueError) as err:
        raise HyvInputError(argument, f"{str(path)!r} is not a JSON file ({err})") from None
    except OSError as err:
        raise HyvInputError(argument, f"cannot read {str(path)!r}: {err.strerror or err}") from None
    if not isinstance(data, list):
        raise HyvInputError(argument, f"{str(path)!r} must hold a JSON list of clips ({{\"path\", \"cap\", "
                                      f"\"num_frames\", \"fps\", \"resolution\"}}), got a JSON {type(data).__name__}")
    return data


def check_caption_choice(caption: Any, caption_seed: Any = 0) -> tuple[str, int]:
    """``--caption`` (one of :data:`CAPTION_CHOICES`) and ``--caption_seed`` (an integer >= 0) checked; a
    HyvInputError naming the parameter otherwise."""
    if caption not in CAPTION_CHOICES:
        raise HyvInputError("caption", f"must be one of {', '.join(CAPTION_CHOICES)}, got {caption!r}")
    seed = as_number("caption_seed", caption_seed, int, low=0)
    return caption, 0 if seed is None else seed


def check_prior_captions(captions: Any) -> tuple[str, ...]:
    """``prior_captions``: a list of non-empty caption strings (no duplicates), or the path of a text file of them,
    one per line (blank lines skipped); a HyvInputError naming ``prior_captions`` otherwise."""
    if isinstance(captions, (str, os.PathLike)):
        path = os.path.expanduser(os.fspath(captions))
        try:
            with open(path, encoding="utf-8") as f:
                captions = [line.strip() for line in f if line.strip()]
        except (OSError, UnicodeDecodeError) as err:
            raise HyvInputError("prior_captions", f"cannot read {path!r} ({err}); give a UTF-8 text file of "
                                                  "captions, one per line") from None
        if not captions:
            raise HyvInputError("prior_captions", f"{path!r} holds no caption; give one per line")
    if not isinstance(captions, (list, tuple)) or not all(isinstance(c, str) and c.strip() for c in captions):
        raise HyvInputError("prior_captions", "must be a list of non-empty caption strings or a text file of them")
    duplicates = sorted({c for c in captions if captions.count(c) > 1})
    if duplicates:
        raise HyvInputError("prior_captions", f"lists {duplicates[0]!r} more than once")
    return tuple(captions)


def caption_index(count: int, caption: str = "first", caption_seed: int = 0, index: int = 0) -> int:
    """Which of ``count`` captions entry ``index`` encodes: 0 with ``caption="first"``; with ``"random"`` the first 8
    bytes of SHA-256(``f"{caption_seed}:{index}"``) (big-endian) modulo ``count``. A pure function of the seed and the
    entry's position, so a rerun (or another machine) picks the same caption."""
    if caption == "first" or count <= 1:
        return 0
    digest = hashlib.sha256(f"{caption_seed}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % count


def caption_of(cap: Any, caption: str = "first", caption_seed: int = 0, index: int = 0) -> str:
    """The caption of an entry's ``cap``: a string, or one of a list of strings: the first (``caption="first"``, the
    default), or with ``"random"`` the one :func:`caption_index` picks for entry ``index`` and ``caption_seed``.
    (MindSpeed-MM picks one of a list at random each time it reads the clip; features are encoded once, so one
    caption per clip is kept: put the caption to train on first, or give each caption its own entry.)"""
    if isinstance(cap, str):
        return cap
    if isinstance(cap, list) and cap and all(isinstance(c, str) for c in cap):
        return cap[caption_index(len(cap), caption, caption_seed, index)]
    raise EntryError(f'"cap" must be a string or a non-empty list of strings, got {json.dumps(cap)[:80]}')


def _check_fields(entry: dict[str, Any]) -> None:
    """The optional fields, where given: ``num_frames`` a positive integer, ``fps`` a positive number,
    ``resolution`` {"height", "width"} of positive integers (informative: the frames read decide the size)."""
    def positive(name: str, value: Any, integer: bool) -> None:
        ok = isinstance(value, numbers.Integral if integer else numbers.Real) and not isinstance(value, bool)
        if not ok or not math.isfinite(value) or value <= 0:
            raise EntryError(f'"{name}" must be a positive {"integer" if integer else "number"}, got '
                             f"{json.dumps(value)[:40]}")

    if entry.get("num_frames") is not None:
        positive("num_frames", entry["num_frames"], True)
    if entry.get("fps") is not None:
        positive("fps", entry["fps"], False)
    resolution = entry.get("resolution")
    if resolution is not None:
        if not isinstance(resolution, dict):
            raise EntryError(f'"resolution" must be {{"height": H, "width": W}}, got {json.dumps(resolution)[:60]}')
        for side in ("height", "width"):
            if side in resolution:
                positive(f"resolution.{side}", resolution[side], True)


def check_entry(entry: Any, index: int, base_dir: str, caption: str = "first", caption_seed: int = 0) -> ClipEntry:
    """A data.json entry checked (an :class:`EntryError` saying what is wrong otherwise): a JSON object with a
    non-empty string ``path`` and a ``cap`` (:func:`caption_of`, with ``caption`` and ``caption_seed``); the optional
    fields of :func:`_check_fields`."""
    if not isinstance(entry, dict):
        raise EntryError(f"must be a JSON object with \"path\" and \"cap\", got {json.dumps(entry)[:60]}")
    path = entry.get("path")
    if not isinstance(path, str) or not path:
        raise EntryError(f'"path" must be a non-empty string, got {json.dumps(path)[:60]}')
    if "cap" not in entry or entry["cap"] is None:
        raise EntryError('has no "cap" (its caption)')
    caption = caption_of(entry["cap"], caption, caption_seed, index)
    _check_fields(entry)
    file = os.path.abspath(os.path.join(base_dir, os.path.expanduser(path)))
    digest = sha256_json({**entry, "path": file})[:16]
    return ClipEntry(index=index, path=path, file=file, caption=caption, raw=entry, id=digest)


def check_num_frames(preset: Preset, num_frames: Any, argument: str = "num_frames") -> int:
    """``num_frames`` (None: the preset's video length) as a positive ``4n+1`` integer (the VAE's temporal
    compression); a HyvInputError naming ``argument`` otherwise."""
    value = as_number(argument, num_frames, int, low=1)
    value = preset.default_video_length if value is None else value
    if (value - 1) % preset.temporal_compression:
        raise HyvInputError(argument, f"must be {preset.temporal_compression}n+1 (e.g. 9, 33, 121), got {value}")
    return value


def check_max_side(preset: Preset, value: Any, argument: str) -> int | None:
    """``--max_height`` / ``--max_width``: None, or a positive multiple of the VAE's spatial compression."""
    value = as_number(argument, value, int, low=1)
    if value is not None and value % preset.spatial_compression:
        raise HyvInputError(argument, f"must be a positive multiple of {preset.spatial_compression}, got {value}")
    return value


def unreadable_video(file: str, err: BaseException) -> EntryError:
    """The EntryError for a video ffmpeg could not read: the file and the last line of ffmpeg's message (its
    ``[component]`` prefix dropped, at most 200 characters)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    last = re.sub(r"^\[[^]]*\]\s*", "", lines[-1])[-200:] if lines else type(err).__name__
    return EntryError(f"{file!r} is not a readable video ({last})")


def read_frames(file: str, max_frames: int) -> tuple[np.ndarray, float | None]:
    """The first ``max_frames`` frames of a video (uint8 [F, H, W, 3], decoded by imageio-ffmpeg's ffmpeg) and its
    frame rate; an image is one frame (and no frame rate). An :class:`EntryError` for a missing or unreadable file."""
    if not os.path.isfile(file):
        raise EntryError(f"{file!r} does not exist or is not a file")
    if file.lower().endswith(IMAGE_EXTENSIONS):
        try:
            image = load_image(file, "path")
        except HyvInputError as err:
            raise EntryError(err.message) from None
        return np.asarray(image)[None], None
    import imageio_ffmpeg

    reader = None
    try:
        reader = imageio_ffmpeg.read_frames(file, output_params=["-frames:v", str(max_frames)])
        meta = next(reader)
        width, height = meta["size"]
        frames = []
        for buffer in reader:
            frames.append(np.frombuffer(buffer, dtype=np.uint8).reshape(height, width, 3))
            if len(frames) == max_frames:
                break
    except (OSError, RuntimeError, StopIteration, KeyError, ValueError) as err:
        raise unreadable_video(file, err) from None
    finally:
        if reader is not None:
            reader.close()  # stops ffmpeg after the frames we need
    if not frames:
        raise EntryError(f"{file!r} holds no video frames")
    fps = meta.get("fps")
    return np.stack(frames), (float(fps) if fps else None)


def crop_frames(preset: Preset, frames: np.ndarray, max_height: int | None = None,
                max_width: int | None = None) -> np.ndarray:
    """uint8 frames [F, H, W, 3] resized to cover the preset's bucket for their aspect ratio and centre-cropped to it
    (:func:`hyv_lib.pipeline.image.crop_frame`, frame by frame: what image-to-video does to a first frame), then
    centre-cropped to at most ``max_height`` x ``max_width``. An :class:`EntryError` for frames no bucket takes (a
    side under 16 pixels, a ratio beyond 4:1)."""
    from PIL import Image

    out = []
    for frame in frames:
        try:
            image = crop_frame(preset, check_image(Image.fromarray(frame), "path"))
        except HyvInputError as err:
            raise EntryError(err.message) from None
        width, height = image.size
        new_height, new_width = min(height, max_height or height), min(width, max_width or width)
        if (new_height, new_width) != (height, width):
            top, left = (height - new_height) // 2, (width - new_width) // 2
            image = image.crop((left, top, left + new_width, top + new_height))
        out.append(np.asarray(image))
    return np.stack(out)
