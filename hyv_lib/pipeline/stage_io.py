"""Stage hand-off files: names, validation on load, and atomic writes (temp name, then rename)."""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any

import torch

from ..base.errors import HyvInputError
from ..base.files import atomic_path
from ..base.lock import folder_lock
from ..base.presets import Preset
from ..models.families import DEFAULT_PRESET, family_for, get_preset
from ..models.stage_tensors import FLOATS, require_finite

STAGE1_FILE = "stage1_embeddings.safetensors"
STAGE2_FILE = "stage2_latents.safetensors"
FRAMES_FILE = "stage3_frames.safetensors"
VIDEO_FILE = "output_video.mp4"
CONFIG_FILE = "generation_config.json"


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


def _require_input_dir(input_dir: str) -> None:
    if not os.path.isdir(input_dir):
        raise HyvInputError("input_dir", f"folder {input_dir!r} does not exist")


def load_stage1(input_dir: str, preset: Preset | None = None) -> dict[str, torch.Tensor]:
    """Load and validate stage1_embeddings.safetensors as the stage 1 of ``preset``'s family writes it
    (:meth:`hyv_lib.models.family.ModelFamily.check_stage1`; None: the default preset's): HunyuanVideo-1.5's 8 text
    tensors (and both image tensors for image-to-video, :func:`hyv_lib.models.hunyuan_video15.stage1.check_stage1`),
    CogVideoX's two T5 embeddings (:func:`hyv_lib.models.cogvideox.recipe.check_t5_stage1`); every value finite."""
    _require_input_dir(input_dir)
    path = os.path.join(input_dir, STAGE1_FILE)
    tensors = _load_tensors(path, "input_dir")
    preset = preset or get_preset(DEFAULT_PRESET)
    family_for(preset).check_stage1(tensors, preset, path)
    return tensors


def load_stage2(input_dir: str) -> torch.Tensor:
    """Load and validate stage2_latents.safetensors: one float tensor ``latents`` [1, C, T, H, W], every value
    finite."""
    _require_input_dir(input_dir)
    path = os.path.join(input_dir, STAGE2_FILE)
    tensors = _load_tensors(path, "input_dir")
    if set(tensors) != {"latents"}:
        raise HyvInputError("input_dir", f"{STAGE2_FILE} must hold exactly one tensor 'latents', "
                                         f"got {sorted(tensors)}")
    latents = tensors["latents"]
    if latents.ndim != 5 or latents.shape[0] != 1 or latents.dtype not in FLOATS:
        raise HyvInputError("input_dir", f"{STAGE2_FILE}: latents must be a float tensor [1, C, T, H, W], "
                                         f"got {latents.dtype} {list(latents.shape)}")
    require_finite(path, "latents", latents, "stage 3 would write them as a black or garbled video: rerun stage2")
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
        raise HyvInputError("input_dir", f"{path!r} is not valid JSON ({err})") from None
    if not isinstance(data, dict):
        raise HyvInputError("input_dir", f"{path!r} must hold a JSON object")
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
