"""Stage 2 without files: the preset's family denoises seeded noise with the runtime's step."""

from __future__ import annotations

from typing import Any

import torch

from ..base.presets import Preset
from ..models.families import family_for
from ..runtimes.compiled import warmup_calls
from ..runtimes.step import TransformerStep


def sample_latents(step: TransformerStep, transformer, scheduler_config, preset: Preset,
                   embeds: dict[str, torch.Tensor], settings: Any, *, progress: bool = True,
                   device: torch.device | None = None) -> torch.Tensor:
    """Stage 2's work without files: seeded noise denoised by ``step`` with guidance, conditioned on the stage-1
    tensors ``embeds``, with resolved ``settings`` (:func:`hyv_lib.pipeline.settings.resolve_settings`); fp32 latents
    on the CPU in :meth:`hyv_lib.base.presets.Preset.denoising_shape`'s layout. The preset's family runs its own
    recipe (:meth:`hyv_lib.models.family.ModelFamily.sample`; HunyuanVideo-1.5:
    :func:`hyv_lib.models.hunyuan_video15.sampling.sample`, CogVideoX:
    :func:`hyv_lib.models.cogvideox.recipe.sample_cogvideox`); a compiled ``transformer`` gets one untimed call per
    new program first (:func:`hyv_lib.runtimes.compiled.warmup_calls`, unless ``settings.warmup_steps`` says)."""
    return family_for(preset).sample(
        step, transformer, scheduler_config, preset, embeds, settings, progress=progress, device=device,
        warmup=lambda key: warmup_calls(transformer, settings.warmup_steps, key))
