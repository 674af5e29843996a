"""The model families by the preset's ``model``: HunyuanVideo-1.5 and CogVideoX built in, more by register_family."""

from __future__ import annotations

from ..base.errors import HyvInputError
from ..base.presets import Preset
from .cogvideox.family import COGVIDEOX_FAMILY
from .family import ModelFamily
from .hunyuan_video15.family import HUNYUAN_VIDEO_15_FAMILY
from .registry import register_adapter

#: Registered families by name (a preset's ``model``).
FAMILIES: dict[str, ModelFamily] = {family.name: family for family in (HUNYUAN_VIDEO_15_FAMILY, COGVIDEOX_FAMILY)}


def register_family(family: ModelFamily) -> ModelFamily:
    """Add ``family`` (an instance) to :data:`FAMILIES` and its adapter to the adapters
    (:func:`hyv_lib.models.registry.register_adapter`): presets with ``model=family.name`` then run it."""
    register_adapter(family.adapter)
    FAMILIES[family.name] = family
    return family


def family_for(preset: Preset) -> ModelFamily:
    """The registered family of ``preset``'s ``model``; HyvInputError naming ``preset`` for a model none runs."""
    family = FAMILIES.get(preset.model)
    if family is None:
        raise HyvInputError("preset", f"{preset.name} runs {preset.model!r}, which no registered model family runs "
                                      f"({', '.join(FAMILIES)}; hyv_lib.models.families.register_family adds one)")
    return family
