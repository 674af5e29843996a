"""Stage hand-off files: names, validation on load, and atomic writes (temp name, then rename)."""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any

import torch

from ..base.cogvideox_presets import COGVIDEOX_MODEL
from ..base.errors import HyvInputError
from ..base.files import atomic_path
from ..base.lock import folder_lock
from ..base.presets import Preset

STAGE1_FILE = "stage1_embeddings.safetensors"
STAGE2_FILE = "stage2_latents.safetensors"
FRAMES_FILE = "stage3_frames.safetensors"
VIDEO_FILE = "output_video.mp4"
CONFIG_FILE = "generation_config.json"

_EMBEDS = ("prompt_embeds", "prompt_embeds_2")
_MASKS = ("prompt_embeds_mask", "prompt_embeds_mask_2")
STAGE1_NAMES = tuple(p + n for p in ("", "negative_") for n in ("prompt_embeds", "prompt_embeds_mask",
                                                                 "prompt_embeds_2", "prompt_embeds_mask_2"))
#: CogVideoX's stage-1 tensors: T5's embeddings of the prompt and of the negative prompt, [1, 226, D] each (no masks).
T5_STAGE1_NAMES = ("prompt_embeds", "negative_prompt_embeds")
#: Image-to-video adds the first frame's SigLIP tokens [1, N, D] and VAE latents [1, C, 1, h, w].
IMAGE_NAMES = ("image_embeds", "cond_latents")
_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_INTS = (torch.int64, torch.int32, torch.bool)


def save_tensors(tensors: dict[str, torch.Tensor], path: str, metadata: dict[str, str] | None = None) -> None:
    """Write a safetensors file atomically (contiguous CPU copies). The bytes are serialized in memory and written by
    Python into the temporary file :func:`hyv_lib.base.files.atomic_path` created: the file gets the umask's mode
    like the JSON and mp4 files (safetensors' own ``save_file`` made a 0600 file), and a failed write is an
    ``OSError`` naming ``path`` (disk full, I/O error), not a library's wrapped message."""
    from safetensors.torch import save

    data = save({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, metadata=metadata)
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)


def _load_tensors(path: str, argument: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    if not os.path.isfile(path):
        raise HyvInputError(argument, f"{os.path.basename(path)} not found in {os.path.dirname(path) or '.'!r}; "
                                      "run the previous stage first")
    try:
        return load_file(path)
    except Exception as err:  # safetensors raises its own SafetensorError for truncated/garbled files
        raise HyvInputError(argument, f"{path!r} is not a readable safetensors file ({err})") from None


def _require_finite(path: str, name: str, tensor: torch.Tensor, remedy: str) -> None:
    """HyvInputError naming the file unless every value of the float ``tensor`` is finite (one reduction)."""
    if tensor.dtype in _FLOATS and not bool(torch.isfinite(tensor).all()):
        bad = int((~torch.isfinite(tensor)).sum())
        raise HyvInputError("--input_dir", f"{path!r}: {name} holds {bad} NaN or infinite value(s) of "
                                           f"{tensor.numel()}; {remedy}")


def _require_input_dir(input_dir: str) -> None:
    if not os.path.isdir(input_dir):
        raise HyvInputError("--input_dir", f"folder {input_dir!r} does not exist")


def _check_t5_embeddings(tensors: dict[str, torch.Tensor], preset: Preset, path: str) -> None:
    """CogVideoX's stage-1 file: exactly :data:`T5_STAGE1_NAMES`, each a float [1, text_len, D], both one shape."""
    if set(tensors) != set(T5_STAGE1_NAMES):
        raise HyvInputError("--input_dir", f"{STAGE1_FILE} of {preset.name} must hold exactly "
                                           f"{', '.join(T5_STAGE1_NAMES)}; got {', '.join(sorted(tensors))}")
    for name, value in tensors.items():
        if value.ndim != 3 or value.shape[:2] != (1, preset.text_len) or value.dtype not in _FLOATS:
            raise HyvInputError("--input_dir", f"{path!r}: {name} must be a float tensor [1, {preset.text_len}, D], "
                                               f"got {value.dtype} {list(value.shape)}")
    if tensors["prompt_embeds"].shape != tensors["negative_prompt_embeds"].shape:
        raise HyvInputError("--input_dir", f"{path!r}: negative_prompt_embeds and prompt_embeds differ in shape")


def load_stage1(input_dir: str, preset: Preset | None = None) -> dict[str, torch.Tensor]:
    """Load and validate stage1_embeddings.safetensors: exactly the 8 text names (plus both image names for
    image-to-video), ranks 3/2, float embeds, integer/bool masks, batch 1, masks as long as their embeddings, and no
    NaN or infinite value. For a CogVideoX ``preset``: exactly T5's ``prompt_embeds`` and ``negative_prompt_embeds``
    [1, text_len, D] (:data:`T5_STAGE1_NAMES`), finite."""
    _require_input_dir(input_dir)
    path = os.path.join(input_dir, STAGE1_FILE)
    tensors = _load_tensors(path, "--input_dir")
    if preset is not None and preset.model == COGVIDEOX_MODEL:
        _check_t5_embeddings(tensors, preset, path)
        for name, value in tensors.items():
            _require_finite(path, name, value, "rerun stage1")
        return tensors
    expected = set(STAGE1_NAMES) | (set(IMAGE_NAMES) if set(IMAGE_NAMES) & set(tensors) else set())
    if set(tensors) != expected:
        missing = sorted(expected - set(tensors))
        extra = sorted(set(tensors) - expected)
        raise HyvInputError("--input_dir", f"{STAGE1_FILE} must hold exactly {', '.join(STAGE1_NAMES)} (and "
                                           f"{' and '.join(IMAGE_NAMES)} for image-to-video); missing "
                                           f"{missing or 'none'}, unexpected {extra or 'none'}")
    for name, rank, layout in (("image_embeds", 3, "[1, N, D]"), ("cond_latents", 5, "[1, C, 1, h, w]")):
        value = tensors.get(name)
        if value is not None and (value.ndim != rank or value.shape[0] != 1 or value.dtype not in _FLOATS
                                  or (rank == 5 and value.shape[2] != 1)):
            raise HyvInputError("--input_dir", f"{STAGE1_FILE}: {name} must be a float tensor {layout}, got "
                                               f"{value.dtype} {list(value.shape)}")
    for prefix in ("", "negative_"):
        for embeds_name, mask_name in zip(_EMBEDS, _MASKS):
            embeds, mask = tensors[prefix + embeds_name], tensors[prefix + mask_name]
            if embeds.ndim != 3 or embeds.dtype not in _FLOATS:
                raise HyvInputError("--input_dir", f"{STAGE1_FILE}: {prefix + embeds_name} must be a float tensor "
                                                   f"[1, L, D], got {embeds.dtype} {list(embeds.shape)}")
            if mask.ndim != 2 or mask.dtype not in _INTS:
                raise HyvInputError("--input_dir", f"{STAGE1_FILE}: {prefix + mask_name} must be an integer or bool "
                                                   f"tensor [1, L], got {mask.dtype} {list(mask.shape)}")
            if embeds.shape[0] != 1 or mask.shape != embeds.shape[:2]:
                raise HyvInputError("--input_dir", f"{STAGE1_FILE}: {prefix + mask_name} {list(mask.shape)} does not "
                                                   f"match {prefix + embeds_name} {list(embeds.shape)} (batch must be 1)")
    for name in STAGE1_NAMES[4:]:  # the negative_* tensors must match their positive counterparts
        if tensors[name].shape != tensors[name.removeprefix("negative_")].shape:
            raise HyvInputError("--input_dir", f"{STAGE1_FILE}: {name} and its positive counterpart differ in shape")
    for name, value in tensors.items():
        _require_finite(path, name, value, "rerun stage1")
    return tensors


def load_stage2(input_dir: str) -> torch.Tensor:
    """Load and validate stage2_latents.safetensors: one float tensor ``latents`` [1, C, T, H, W], every value
    finite."""
    _require_input_dir(input_dir)
    path = os.path.join(input_dir, STAGE2_FILE)
    tensors = _load_tensors(path, "--input_dir")
    if set(tensors) != {"latents"}:
        raise HyvInputError("--input_dir", f"{STAGE2_FILE} must hold exactly one tensor 'latents', "
                                           f"got {sorted(tensors)}")
    latents = tensors["latents"]
    if latents.ndim != 5 or latents.shape[0] != 1 or latents.dtype not in _FLOATS:
        raise HyvInputError("--input_dir", f"{STAGE2_FILE}: latents must be a float tensor [1, C, T, H, W], "
                                           f"got {latents.dtype} {list(latents.shape)}")
    _require_finite(path, "latents", latents, "stage 3 would write them as a black or garbled video: rerun stage2")
    return latents


def read_config(directory: str) -> dict[str, Any]:
    """generation_config.json of a stage folder ({} if absent); a corrupt file names --input_dir."""
    path = os.path.join(directory, CONFIG_FILE)
    if not os.path.isfile(path):
        return {}
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as err:
        raise HyvInputError("--input_dir", f"{path!r} is not valid JSON ({err})") from None
    if not isinstance(data, dict):
        raise HyvInputError("--input_dir", f"{path!r} must hold a JSON object")
    return data


#: generation_config.json fields that hold a local path: recorded absolute, so that a later stage run from another
#: working directory finds them (``model_path`` only when it is a local folder: a hub id stays as it is).
PATH_FIELDS = ("model_path", "image_path", "lora", "cache_calibration", "output_video", "frames_file")


def absolute_paths(fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` with the paths of :data:`PATH_FIELDS` absolute (``~`` expanded), relative to this process's
    working directory: call it where the paths were given."""
    out = dict(fields)
    for name in PATH_FIELDS:
        value = out.get(name)
        if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
            continue
        path = os.path.abspath(os.path.expanduser(os.fspath(value)))
        if name != "model_path" or os.path.isdir(path):
            out[name] = path
    return out


def update_config(directory: str, base: dict[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
    """Merge ``fields`` into ``base`` (default: the folder's current config) and write it atomically. The read and
    the write hold the config's lock, so an update from another process (or thread) waits and is not lost. The
    paths among ``fields`` are recorded absolute (:func:`absolute_paths`); ``base``'s are kept as they are."""
    fields = absolute_paths(fields)
    path = os.path.join(directory, CONFIG_FILE)
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(folder_lock(directory, name=f".{CONFIG_FILE}.lock", wait=True))
        except OSError as err:  # a read-only or full folder: name the file this call writes
            raise OSError(err.errno, err.strerror, path) from None
        data = dict(read_config(directory) if base is None else base)
        data.update(fields)
        with atomic_path(path) as tmp:
            with open(tmp, "w") as f:
                json.dump(data, f, indent=2, sort_keys=True)
                f.write("\n")
    return data
