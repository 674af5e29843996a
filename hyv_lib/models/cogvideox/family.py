"""CogVideoX1.5 as a model family: T5 text, the v-prediction DDIM/DPM loop over padded frames, frames-first latents."""

from __future__ import annotations

from typing import Any

import torch

from ...base.presets import Preset
from ..family import ModelFamily
from . import components as parts
from . import presets, recipe
from .adapter import COGVIDEOX


class CogVideoXFamily(ModelFamily):
    """CogVideoX1.5 (text-to-video): :mod:`hyv_lib.models.cogvideox.recipe`'s pieces behind the family interface."""

    title = "CogVideoX"
    components = parts.COGVIDEOX_COMPONENTS
    text_components = parts.COGVIDEOX_TEXT_COMPONENTS

    def build_tiny(self, preset, seed=0, names=None):
        return parts.build_tiny_cogvideox(preset, seed, parts.COGVIDEOX_COMPONENTS if names is None else names)

    def component_class(self, name, model_path):
        return parts.cogvideox_loader(name, model_path)

    def save_tiny_pipeline(self, path, preset, seed=0):
        # the tiny twin has the real layout already
        tiny = preset if preset.is_tiny else presets.COGVIDEOX_TINY
        parts.save_cogvideox_pipeline(parts.build_tiny_cogvideox(tiny, seed=seed), path)

    def encode_texts(self, components, preset, prompts, device=None, release=False):
        return recipe.encode_t5(components, preset, prompts, device, release)

    def tokens_cut(self, components, preset, prompts):
        return recipe.t5_cuts(components, preset, prompts)

    def check_stage1(self, tensors, preset, path):
        recipe.check_t5_stage1(tensors, preset, path)

    def sample(self, step, transformer, scheduler_config, preset: Preset, embeds: dict[str, torch.Tensor], settings,
               *, warmup=None, progress: bool = True, device: torch.device | None = None) -> torch.Tensor:
        return recipe.sample_cogvideox(step, transformer, scheduler_config, preset, embeds, settings, warmup=warmup,
                                       progress=progress, device=device)

    def vae_latents(self, preset: Preset, latents: torch.Tensor, video_length: Any) -> torch.Tensor:
        return recipe.vae_latents(preset, latents, video_length)


#: The registered instance (:data:`hyv_lib.models.families.FAMILIES`).
COGVIDEOX_FAMILY = CogVideoXFamily(COGVIDEOX, presets.PRESETS)
