"""A model's components by name, through its family: build the tiny ones in code, load real ones from a
diffusers-format folder, save a tiny pipeline folder; cut a copy of a transformer to its first blocks."""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
import re
from typing import Any, Iterable

import torch
from safetensors import SafetensorError, safe_open

from ..base.errors import HyvInputError
from ..base.presets import Preset
from .dtypes import torch_dtype
from .families import family_for, get_preset
from .folder import LAYOUT_NOTE

logger = logging.getLogger(__name__)


def text_components(preset: Preset) -> tuple[str, ...]:
    """What stage 1 loads for ``preset``: its family's text encoders and tokenizers."""
    return family_for(preset).text_components


def pipeline_components(preset: Preset) -> tuple[str, ...]:
    """What stages 1-3 load for ``preset`` (:meth:`hyv_lib.models.family.ModelFamily.pipeline_components`: text
    encoders, the DiT and its scheduler, the VAE; the first frame's encoders for a preset that takes an image)."""
    return family_for(preset).pipeline_components(preset)


@contextlib.contextmanager
def quiet_loading():
    """Silence diffusers' and transformers' weight-loading progress bars, and restore both settings after."""
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    modules = (diffusers_logging, transformers_logging)
    were_enabled = [module.is_progress_bar_enabled() for module in modules]
    for module in modules:
        module.disable_progress_bar()
    try:
        yield
    finally:
        for module, enabled in zip(modules, were_enabled):
            if enabled:
                module.enable_progress_bar()


def build_tiny_components(preset: Preset, seed: int = 0, names: Iterable[str] | None = None) -> dict[str, Any]:
    """Build the requested tiny components of ``preset`` (None: every one of its model's pipeline folder) with seeded
    random weights (fp32, eval mode), by its family (:meth:`hyv_lib.models.family.ModelFamily.build_tiny`)."""
    if not preset.is_tiny:
        raise HyvInputError("preset", f"{preset.name} is a real preset: its weights load from `model_path`")
    return family_for(preset).build_tiny(preset, seed, None if names is None else list(names))


def check_weight_files(model_path: str, names: Iterable[str]) -> None:
    """HyvInputError naming ``model_path`` and the file when a safetensors file of a component subfolder is truncated
    or corrupt (its header unreadable, or its tensors not covering the file exactly): safetensors' own check, reading
    each header only. ``names``: every component subfolder the model has, not only the ones loaded now, so a cut-off
    transformer is found before stage 1 writes its files, not after."""
    for name in names:
        folder = os.path.join(model_path, name)
        if not os.path.isdir(folder):
            continue
        for file in sorted(f for f in os.listdir(folder) if f.endswith(".safetensors")):
            path = os.path.join(folder, file)
            try:
                with safe_open(path, "pt"):
                    pass
            except Exception as err:  # SafetensorError (a truncated or garbled file) or an OSError reading it
                raise HyvInputError("model_path", f"{path!r} is not a complete safetensors file ({err}); "
                                                  "copy or download it again") from None


def check_model_path(model_path: str, names: Iterable[str], preset: Preset) -> None:
    """Fail early, naming ``model_path``, when a local folder lacks a component subfolder ``preset``'s model needs
    (``names``) or holds a truncated or corrupt weight file (:func:`check_weight_files`).

    A string that is not an existing path is treated as a hub id and left to ``from_pretrained``.
    """
    if not os.path.exists(model_path):
        if re.fullmatch(r"[\w.-]+/[\w.-]+", model_path):
            return  # a hub id (owner/name): from_pretrained resolves it
        raise HyvInputError("model_path", f"{model_path!r} does not exist and is not a hub id (owner/name)")
    if not os.path.isdir(model_path):
        raise HyvInputError("model_path", f"{model_path!r} is not a folder")
    family = family_for(preset)
    missing = [n for n in names if not os.path.isdir(os.path.join(model_path, n))]
    if missing:
        raise HyvInputError(
            "model_path",
            f"{model_path!r} is not a diffusers-format {family.title} folder: missing {', '.join(missing)} "
            "(expected model_index.json plus one subfolder per component)",
        )
    check_weight_files(model_path, (*family.components, *family.first_frame_components))


def load_components(
    preset: Preset, model_path: str | None, names: Iterable[str], dtype: str = "fp32", seed: int = 0
) -> dict[str, Any]:
    """Load components by name: ``from_pretrained(model_path, subfolder=name)`` when a path is given
    (real weights, or a saved tiny folder), else the preset's bundled weights (each component from
    ``preset.bundled_subfolder(name)``), else build the tiny ones in code.

    Neural networks are cast to ``dtype``, except the VAE, which stays fp32 on CPU for exact decoding.
    """
    names = list(names)
    family = family_for(preset)
    if isinstance(model_path, str):
        model_path = os.path.expanduser(model_path)  # "~/weights" from Python, as a shell would expand it
    subfolders = {name: name for name in names}
    if model_path is None and preset.bundled_weights is not None:
        model_path = preset.bundled_path
        subfolders = {name: preset.bundled_subfolder(name) for name in names}
        missing = [n for n in names if n not in family.first_frame_components
                   and not os.path.isdir(os.path.join(model_path, subfolders[n]))]
        if not os.path.isdir(model_path) or missing:
            raise HyvInputError("preset", f"{preset.name}'s bundled weights are missing at {model_path!r}"
                                            + (f" ({', '.join(subfolders[n] for n in missing)})" if missing else "")
                                            + "; reinstall hyv_lib or run tools/train_hyv_tiny.py")
    if model_path is None:
        if not preset.is_tiny:
            raise HyvInputError(
                "model_path",
                f"preset {preset.name} needs real weights: pass a diffusers-format folder or hub id "
                f"(e.g. {preset.hub_id})",
            )
        components = build_tiny_components(preset, seed=seed, names=names)
    else:
        components = {}
        if preset.is_tiny and os.path.isdir(model_path):
            # A tiny folder saved before image-to-video existed (hyv-tiny's) has no first-frame encoder: build it in
            # code, seeded, as the tiny presets always do when there are no weights to load.
            built = [n for n in names
                     if n in family.first_frame_components and not os.path.isdir(os.path.join(model_path, subfolders[n]))]
            components.update(build_tiny_components(preset, seed=seed, names=built))
            names = [n for n in names if n not in built]
        check_model_path(model_path, [subfolders[n] for n in names], preset)
        for name in names:
            cls = family.component_class(name, model_path)
            kwargs = {"subfolder": subfolders[name]}
            if name in ("text_encoder", "text_encoder_2", "transformer", "image_encoder"):
                kwargs["torch_dtype"] = torch_dtype(dtype)
            logger.info("loading %s from %s", name, model_path)
            try:
                components[name] = cls.from_pretrained(model_path, **kwargs)
            except (OSError, ValueError, SafetensorError) as err:  # missing files, no network, corrupt weights
                first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
                raise HyvInputError("model_path", f"cannot load {name} from {model_path!r}: {first_line}") from err
    for name, module in components.items():
        if isinstance(module, torch.nn.Module):
            module.eval().requires_grad_(False)
            wanted = torch.float32 if name == "vae" else torch_dtype(dtype)  # the VAE decodes in fp32
            if module.dtype != wanted:
                module.to(wanted)
    return components


def save_tiny_pipeline(path: str, seed: int = 0, preset: Preset | str = "tiny") -> None:
    """Save tiny components of ``preset``'s model as a diffusers-format folder
    (:meth:`hyv_lib.models.family.ModelFamily.save_tiny_pipeline`): a tiny preset's own, or for a real preset its
    layout at tiny widths, loadable with ``--preset NAME --model_path`` like real weights; the folder notes which
    preset it was saved as (:func:`note_layout`)."""
    preset = get_preset(preset)
    family_for(preset).save_tiny_pipeline(path, preset, seed)
    note_layout(path, preset.name)


def note_layout(path: str, preset_name: str) -> None:
    """Write into the folder's model_index.json which preset's layout it holds (:data:`hyv_lib.models.folder.LAYOUT_NOTE`;
    diffusers ignores the key): where the configs fit two presets (a sparse checkpoint and its dense twin, a tiny twin
    and its real model), the folder then still runs as the one it was saved as."""
    index = os.path.join(path, "model_index.json")
    with open(index) as f:
        data = json.load(f)
    data[LAYOUT_NOTE] = preset_name
    with open(index, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")


def first_blocks_copy(transformer, blocks: int | None = None, dtype: torch.dtype = torch.float32):
    """A copy of a transformer (any with ``transformer_blocks``) in ``dtype`` with only its first ``blocks`` blocks
    (None: all): embedders, token refiner, those blocks and the output head. An fp32 oracle of the real model at the
    cost of a few blocks (two real blocks and the rest: 1.8 GiB, against 31 GiB for a whole fp32 copy). The given model
    is not changed and its other blocks are never copied."""
    every_block = transformer.transformer_blocks
    transformer.transformer_blocks = torch.nn.ModuleList(list(every_block)[:blocks])
    try:
        return copy.deepcopy(transformer).to(dtype)
    finally:
        transformer.transformer_blocks = every_block
