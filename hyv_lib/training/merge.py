"""A LoRA merged into a model once, for good: a new diffusers-format model folder whose transformer holds the merge.

``python -m hyv_lib merge_lora`` writes it; ``generate --model_path OUT`` then runs the merged model with no ``--lora``
(the same weights ``generate --lora`` merges on every load: :func:`hyv_lib.models.lora.merge_lora`)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from safetensors import safe_open

from ..base.checks import as_number
from ..base.errors import HyvInputError
from ..base.files import atomic_path, fsync_dir, new_folder, umask_modes
from ..base.presets import Preset
from ..models.components import load_components, note_layout, save_tiny_pipeline
from ..models.folder import choose_preset
from ..models.lora import check_lora_file, merge_lora

#: The record of the merge written beside model_index.json: the LoRA (path, SHA-256, scale, rank, targets) and the
#: model it was merged into.
MERGE_RECORD = "merged_lora.json"
#: Files of the copied components that are hardlinked (when the file system allows: same device) rather than copied:
#: the weights. Configs, tokenizer files and model_index.json are always copied (the merge rewrites model_index.json).
WEIGHT_EXTENSIONS = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".model")
#: safetensors' dtype names -> ``load_components``' dtype names.
STORED_DTYPES = {"F32": "fp32", "BF16": "bf16", "F16": "fp16"}


@dataclass
class MergedModel:
    """What :func:`write_merged_model` wrote: the folder, the preset it holds, where the other components came from
    (a folder; None when the preset's tiny weights were built), the record of :data:`MERGE_RECORD`, and how many of
    the copied component files were hardlinked or copied."""

    output_dir: str
    preset: str
    source: str | None
    record: dict[str, Any] = field(default_factory=dict)
    linked: int = 0
    copied: int = 0


def check_output_dir(output_dir: Any, argument: str = "output_dir") -> str:
    """``output_dir`` as an absolute path that is free: absent, or an empty folder; a HyvInputError otherwise."""
    if not isinstance(output_dir, (str, os.PathLike)) or not str(output_dir):
        raise HyvInputError(argument, f"must be a folder path, got {output_dir!r}")
    path = os.path.abspath(os.path.expanduser(os.fspath(output_dir)))
    if os.path.exists(path) and (not os.path.isdir(path) or os.listdir(path)):
        what = "is a file" if not os.path.isdir(path) else "is not empty"
        raise HyvInputError(argument, f"{path!r} {what}: give a new or empty folder (a merge never writes over one)")
    return path


def _source(preset: Preset, model_path: str | None) -> tuple[str | None, dict[str, str]]:
    """Where the model's components are (a local folder, or the preset's bundled weights; None: the tiny preset's
    weights built in code) and each component's subfolder there (by model_index.json), checked."""
    if model_path is not None:
        folder = os.path.abspath(os.path.expanduser(os.fspath(model_path)))
        if not os.path.isdir(folder):
            raise HyvInputError("model_path", f"{model_path!r} is not a local folder: merge_lora copies the model's "
                                              "other components, so download it first (huggingface-cli download "
                                              "ID --local-dir DIR) and give DIR")
        rename = {}
    elif preset.bundled_weights is not None:
        folder, rename = preset.bundled_path, dict(preset.bundled_subfolders)
    elif preset.is_tiny:
        return None, {}
    else:
        load_components(preset, None, [])  # the "needs --model_path" error
        raise AssertionError("unreachable")
    try:
        with open(os.path.join(folder, "model_index.json")) as f:
            index = json.load(f)
    except (OSError, ValueError) as err:
        raise HyvInputError("model_path", f"{folder!r} is not a diffusers-format model folder: its "
                                          f"model_index.json cannot be read ({err})") from None
    names = [k for k, v in index.items() if not k.startswith("_") and isinstance(v, list) and v and v[0]]
    subfolders = {name: rename.get(name, name) for name in names}
    missing = [sub for sub in subfolders.values() if not os.path.isdir(os.path.join(folder, sub))]
    if "transformer" not in subfolders or missing:
        raise HyvInputError("model_path", f"{folder!r} lacks {', '.join(missing) or 'a transformer'}: not a whole "
                                          "diffusers-format model folder")
    return folder, subfolders


def stored_dtype(folder: str) -> str:
    """The dtype (``fp32``/``bf16``/``fp16``) most tensors of a component folder's first safetensors file are stored
    in: the merged transformer is written in it (fp32 when the folder has no safetensors file)."""
    files = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
    if not files:
        return "fp32"
    with safe_open(os.path.join(folder, files[0]), "pt") as f:
        counts = Counter(f.get_slice(key).get_dtype() for key in f.keys())
    return STORED_DTYPES.get(counts.most_common(1)[0][0], "fp32") if counts else "fp32"


def link_or_copy_tree(source: str, target: str) -> tuple[int, int]:
    """Every file under ``source`` (symlinks followed: a hub cache's snapshot) at the same place under ``target``:
    weight files (:data:`WEIGHT_EXTENSIONS`) hardlinked where the file system allows, the rest copied. Returns
    (hardlinked, copied). A hardlink is the same file: replacing it is safe, editing it in place edits both."""
    linked = copied = 0
    for root, _, names in os.walk(source, followlinks=True):
        folder = os.path.join(target, os.path.relpath(root, source))
        os.makedirs(folder, exist_ok=True)
        for name in names:
            real, dest = os.path.realpath(os.path.join(root, name)), os.path.join(folder, name)
            if name.endswith(WEIGHT_EXTENSIONS):
                with contextlib.suppress(OSError):  # another device, or a file system without hardlinks
                    os.link(real, dest)
                    linked += 1
                    continue
            shutil.copyfile(real, dest)
            copied += 1
    return linked, copied


def write_merged_model(lora: str, output_dir: str, *, preset: str | Preset | None = None,
                       model_path: str | None = None, lora_scale: float = 1.0) -> MergedModel:
    """Merge the LoRA ``lora`` (a file, or the folder holding ``pytorch_lora_weights.safetensors``) at ``lora_scale``
    into the model's transformer and write a whole diffusers-format model folder ``output_dir``: ``transformer/`` the
    merged one (``save_pretrained``, in the dtype the source stores it in), every other component of the source's
    model_index.json as it is (weights hardlinked where the file system allows, else copied; configs copied),
    model_index.json (noting the preset, so the folder runs as it), and :data:`MERGE_RECORD`. Then
    ``generate --model_path OUTPUT_DIR`` (or ``from_pretrained(OUTPUT_DIR, subfolder="transformer")``) runs what
    ``generate --lora LORA --lora_scale S`` runs, without merging on every load.

    The model: the local folder ``model_path``, else the preset's bundled weights, else (tiny presets) the weights
    it builds in code, saved whole (:func:`hyv_lib.models.components.save_tiny_pipeline`). ``preset``: the
    folder's (default: read from its configs, :func:`hyv_lib.models.folder.choose_preset`). Refused before any work:
    an ``output_dir`` that exists and is not empty, a LoRA that is corrupt or made for another model or other shapes
    (:func:`hyv_lib.models.lora.check_lora_file`), a bad scale, a hub id or a folder that is not a whole model.
    Written atomically: a hidden temporary folder beside ``output_dir`` renamed into place at the end (a failed or
    killed merge leaves no ``output_dir``)."""
    scale = as_number("lora_scale", lora_scale)
    out = check_output_dir(output_dir)
    preset = choose_preset(preset, model_path).preset
    source, subfolders = _source(preset, model_path)
    weights = check_lora_file(lora, preset.model, preset.transformer, model_path)
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    tmp = new_folder(parent, f".{os.path.basename(out)}.merge-")
    result = MergedModel(output_dir=out, preset=preset.name, source=source)
    try:
        if source is None:  # a tiny preset's built weights: saved whole, then the transformer replaced
            save_tiny_pipeline(tmp, preset=preset)
            shutil.rmtree(os.path.join(tmp, "transformer"))
            transformer = load_components(preset, None, ["transformer"], "fp32")["transformer"]
        else:
            for name, sub in subfolders.items():
                if name != "transformer":
                    linked, copied = link_or_copy_tree(os.path.join(source, sub), os.path.join(tmp, name))
                    result.linked, result.copied = result.linked + linked, result.copied + copied
            shutil.copyfile(os.path.join(source, "model_index.json"), os.path.join(tmp, "model_index.json"))
            dtype = stored_dtype(os.path.join(source, subfolders["transformer"]))
            transformer = load_components(preset, model_path, ["transformer"], dtype)["transformer"]
        merge_lora(transformer, weights, scale)
        transformer.save_pretrained(os.path.join(tmp, "transformer"), safe_serialization=True)
        # safetensors writes 0600 files: the umask's modes, on what this merge wrote only (never on the hardlinks)
        umask_modes(tmp if source is None else os.path.join(tmp, "transformer"))
        note_layout(tmp, preset.name)
        result.record = {"format": "hyv_lib.merged_lora/1", "preset": preset.name, "model": source or "built",
                         **weights.record(scale), "targets": weights.metadata.get("targets"),
                         "lora_alpha": weights.metadata.get("alpha")}
        with atomic_path(os.path.join(tmp, MERGE_RECORD)) as path:
            with open(path, "w") as f:
                json.dump(result.record, f, indent=1)
                f.write("\n")
        check_output_dir(out)  # taken while this merge ran: refused, nothing replaced
        try:
            os.replace(tmp, out)  # onto nothing or an empty folder: atomic
        except OSError as err:
            raise HyvInputError("output_dir", f"cannot move the merged model into {out!r}: {err.strerror}") from None
        fsync_dir(parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return result
