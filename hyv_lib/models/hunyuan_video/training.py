"""HunyuanVideo's train-step batch: the noisy latents alone, Llama's states and mask, CLIP's pooled vector, guidance."""

from __future__ import annotations

import torch

from ..flow_matching import NUM_TRAIN_TIMESTEPS
from .recipe import TEXT_NAMES, embedded_guidance

#: The forward keywords of the feature folder's text tensors (stage 1's names, :data:`recipe.TEXT_NAMES`).
TEXT_KEYS = dict(zip(("encoder_hidden_states", "encoder_attention_mask", "pooled_projections"), TEXT_NAMES))


def batch_inputs(preset, model_config, x0: torch.Tensor, noise: torch.Tensor, sigma: torch.Tensor,
                 texts: dict[str, torch.Tensor], images: dict[str, torch.Tensor] | None = None) -> dict:
    """The flow-matching objective of :mod:`hyv_lib.models.flow_matching` without condition channels (text-to-video):
    ``(1 - sigma) x0 + sigma noise``, the timestep ``sigma * 1000``, the velocity ``noise - x0`` as target, and, for
    a guidance-distilled checkpoint, the preset's guidance scale x 1000, what sampling feeds the guidance embedding
    (a choice of this recipe: the model is tuned at the guidance it runs with)."""
    if images is not None or model_config["in_channels"] != x0.shape[1]:
        raise ValueError("HunyuanVideo's train step is text-to-video: the image-to-video checkpoint's latent-concat "
                         "training is not built yet")
    s = sigma.view(-1, *([1] * (x0.dim() - 1)))
    batch = {key: texts[name] for key, name in TEXT_KEYS.items()}
    batch["hidden_states"], batch["target"] = (1 - s) * x0 + s * noise, noise - x0
    batch["timestep"] = sigma * NUM_TRAIN_TIMESTEPS
    if model_config["guidance_embeds"]:
        batch["guidance"] = embedded_guidance(preset.guidance_scale, x0.shape[0], torch.float32)
    return batch
