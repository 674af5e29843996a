"""Model families and their presets by name: HunyuanVideo-1.5, CogVideoX, HunyuanVideo; more by register_family."""

from __future__ import annotations

from ..base.errors import HyvInputError
from ..base.presets import Preset
from .cogvideox.family import COGVIDEOX_FAMILY
from .family import ModelFamily
from .hunyuan_video.family import HUNYUAN_VIDEO_FAMILY
from .hunyuan_video15.family import HUNYUAN_VIDEO_15_FAMILY
from .registry import register_adapter

#: Registered families by name (a preset's ``model``).
FAMILIES: dict[str, ModelFamily] = {family.name: family for family in (HUNYUAN_VIDEO_15_FAMILY, COGVIDEOX_FAMILY,
                                                                        HUNYUAN_VIDEO_FAMILY)}

#: Every preset by name, each family's in turn: HunyuanVideo-1.5's (the tiny ones, ``tiny`` with random weights and
#: ``tiny_trained``, the bundled hyv-tiny; the real 480p/720p text- and image-to-video checkpoints, step-distilled,
#: CFG-distilled and sparse), then CogVideoX1.5's (``cogvideox1.5_5b`` and its tiny twin ``cogvideox_tiny``), then
#: HunyuanVideo's (``hunyuanvideo_t2v``, ``hunyuanvideo_i2v`` and ``hunyuanvideo_tiny``).
#: ``python -m hyv_lib info --preset NAME --json`` prints one.
PRESETS: dict[str, Preset] = {preset.name: preset for family in FAMILIES.values() for preset in family.presets}

#: The preset every entry point uses when none is given (the CLI, the stage functions, generate, load_pipeline):
#: hyv-tiny, the trained tiny model, whose videos show what the prompt says (``tiny`` is random: its videos are noise).
DEFAULT_PRESET = "tiny_trained"


def register_family(family: ModelFamily) -> ModelFamily:
    """Add ``family`` (an instance) to :data:`FAMILIES`, its adapter to the adapters
    (:func:`hyv_lib.models.registry.register_adapter`) and its presets to :data:`PRESETS`: presets with
    ``model=family.name`` then run it."""
    clash = [preset.name for preset in family.presets if PRESETS.get(preset.name, preset).model != family.name]
    if clash:
        raise ValueError(f"presets {', '.join(clash)} already belong to another family")
    register_adapter(family.adapter)
    FAMILIES[family.name] = family
    PRESETS.update({preset.name: preset for preset in family.presets})
    return family


def family_for(preset: Preset) -> ModelFamily:
    """The registered family of ``preset``'s ``model``; HyvInputError naming ``preset`` for a model none runs."""
    family = FAMILIES.get(preset.model)
    if family is None:
        raise HyvInputError("preset", f"{preset.name} runs {preset.model!r}, which no registered model family runs "
                                      f"({', '.join(FAMILIES)}; hyv_lib.models.families.register_family adds one)")
    return family


def get_preset(name: str | Preset) -> Preset:
    """Look a preset up by name (a :class:`~hyv_lib.base.presets.Preset` passes through); an unknown name raises
    HyvInputError listing the valid ones."""
    if isinstance(name, Preset):
        return name
    if not isinstance(name, str):
        raise HyvInputError("preset", f"must be a preset name ({', '.join(PRESETS)}) or a Preset, "
                                      f"got {type(name).__name__}")
    try:
        return PRESETS[name]
    except KeyError:
        raise HyvInputError("preset", f"unknown preset {name!r}; valid: {', '.join(PRESETS)}") from None
