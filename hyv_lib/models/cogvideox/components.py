"""CogVideoX1.5's components: the tiny ones built in code, the class that loads each real one, a pipeline folder."""

from __future__ import annotations

import json
import os
from typing import Any, Iterable

from ...base.errors import HyvInputError
from ...base.presets import Preset
from ..tiny_weights import save_pipeline_folder, seeded
from .presets import COGVIDEOX_SCHEDULER

#: Component names of a diffusers ``CogVideoXPipeline`` folder (model_index.json), in the order stages use them.
COGVIDEOX_COMPONENTS = ("tokenizer", "text_encoder", "transformer", "vae", "scheduler")
#: Stage 1's components: T5 and its tokenizer.
COGVIDEOX_TEXT_COMPONENTS = ("tokenizer", "text_encoder")
#: The schedulers CogVideoXPipeline runs (its checkpoints ship the DDIM one; the DPM one is the alternative).
SCHEDULER_CLASSES = ("CogVideoXDDIMScheduler", "CogVideoXDPMScheduler")


def build_tiny_cogvideox(preset: Preset, seed: int = 0, names: Iterable[str] = COGVIDEOX_COMPONENTS) -> dict[str, Any]:
    """The requested tiny CogVideoX components with seeded random weights (fp32, eval mode): a ByT5Tokenizer (its
    384-token byte vocabulary needs no files) with a T5 encoder of ``preset.text_encoder``, the transformer and VAE
    of the preset's configs, and CogVideoXDDIMScheduler with the 5B models' config. Each network's weights depend on
    ``seed`` only; the caller's global RNG is left as found."""
    from diffusers import AutoencoderKLCogVideoX, CogVideoXDDIMScheduler, CogVideoXTransformer3DModel
    from transformers import ByT5Tokenizer, T5Config, T5EncoderModel

    names = set(names)
    out: dict[str, Any] = {}
    if "tokenizer" in names:
        out["tokenizer"] = ByT5Tokenizer()
    if "text_encoder" in names:
        out["text_encoder"] = seeded(seed + 1, lambda: T5EncoderModel(T5Config(**preset.text_encoder)))
    if "transformer" in names:
        out["transformer"] = seeded(seed + 3, lambda: CogVideoXTransformer3DModel(**preset.transformer))
    if "vae" in names:
        out["vae"] = seeded(seed + 4, lambda: AutoencoderKLCogVideoX(**preset.vae))
    if "scheduler" in names:
        out["scheduler"] = CogVideoXDDIMScheduler(**COGVIDEOX_SCHEDULER)
    return out


def scheduler_class(model_path: str):
    """The scheduler class of a CogVideoX folder: its scheduler_config.json's ``_class_name``, one of
    :data:`SCHEDULER_CLASSES` (a HyvInputError naming ``model_path`` for another); a hub id or an unreadable config
    gets CogVideoXDDIMScheduler (what the CogVideoX1.5 checkpoints ship)."""
    import diffusers

    name = SCHEDULER_CLASSES[0]
    path = os.path.join(model_path, "scheduler", "scheduler_config.json")
    if os.path.isfile(path):
        try:
            with open(path) as f:
                name = json.load(f).get("_class_name", name)
        except (OSError, ValueError):
            pass  # from_pretrained names the broken file
    if name not in SCHEDULER_CLASSES:
        raise HyvInputError("model_path", f"{path!r} names scheduler {name!r}; CogVideoX runs "
                                          f"{' or '.join(SCHEDULER_CLASSES)}")
    return getattr(diffusers, name)


def cogvideox_loader(name: str, model_path: str):
    """The class whose ``from_pretrained(model_path, subfolder=name)`` loads component ``name`` of a CogVideoX
    folder (the tokenizer through AutoTokenizer: the real folder holds T5's, a saved tiny one ByT5's)."""
    from diffusers import AutoencoderKLCogVideoX, CogVideoXTransformer3DModel
    from transformers import AutoTokenizer, T5EncoderModel

    if name == "scheduler":
        return scheduler_class(model_path)
    classes = {"tokenizer": AutoTokenizer, "text_encoder": T5EncoderModel, "transformer": CogVideoXTransformer3DModel,
               "vae": AutoencoderKLCogVideoX}
    if name not in classes:
        raise HyvInputError("preset", f"CogVideoX has no component {name!r}; its components are "
                                      f"{', '.join(COGVIDEOX_COMPONENTS)}")
    return classes[name]


def save_cogvideox_pipeline(components: dict[str, Any], path: str) -> None:
    """Write a diffusers-format CogVideoXPipeline folder (model_index.json + one subfolder per component)."""
    from diffusers import CogVideoXPipeline

    save_pipeline_folder(CogVideoXPipeline, components, COGVIDEOX_COMPONENTS, path)
