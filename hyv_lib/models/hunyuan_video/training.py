"""HunyuanVideo's train-step batch: the noisy latents (I2V: + first-frame latents and mask), Llama's or LLaVA's text."""

from __future__ import annotations

import torch

from ..flow_matching import NUM_TRAIN_TIMESTEPS, training_inputs
from .recipe import IMAGE_NAMES, TEXT_NAMES, embedded_guidance

#: The forward keywords of the feature folder's text tensors (stage 1's names, :data:`recipe.TEXT_NAMES`).
TEXT_KEYS = dict(zip(("encoder_hidden_states", "encoder_attention_mask", "pooled_projections"), TEXT_NAMES))


def batch_inputs(preset, model_config, x0: torch.Tensor, noise: torch.Tensor, sigma: torch.Tensor,
                 texts: dict[str, torch.Tensor], images: dict[str, torch.Tensor] | None = None) -> dict:
    """The flow-matching objective of :mod:`hyv_lib.models.flow_matching`: ``(1 - sigma) x0 + sigma noise`` in every
    latent frame, the timestep ``sigma * 1000``, the velocity ``noise - x0`` as target (all frames, the first too).
    Text-to-video: the noisy latents alone and, for a guidance-distilled checkpoint, the preset's guidance scale
    x 1000, what sampling feeds the guidance embedding (a choice of this recipe: the model is tuned at the guidance it
    runs with). The latent-concat image-to-video checkpoint (``images``: :data:`recipe.IMAGE_NAMES`, the first frame's
    ``cond_latents`` [B, C, 1, h, w]): its 2 C + 1 input channels as HunyuanVideoImageToVideoPipeline's loop builds
    ``latent_model_input`` (the noisy latents, the first frame's latents in latent frame 0 and zeros after, a mask
    1 on frame 0: :func:`~hyv_lib.models.flow_matching.condition_channels`), as Tencent's HunyuanVideo-I2V trainer
    concatenates them; no guidance input. ValueError when the channels do not fit the checkpoint (images for the
    text-to-video one, none for the image-to-video one)."""
    concat = model_config.get("image_condition_type") == "latent_concat"
    if (images is not None) != concat or model_config["in_channels"] != x0.shape[1] * (2 if concat else 1) + concat:
        raise ValueError(
            f"{preset.name}'s transformer takes {model_config['in_channels']} input channels: "
            + ("train it with task i2v, on features extracted with first frames" if concat else
               f"latents of {x0.shape[1]} channels alone (text-to-video; it takes no first frame)"))
    batch = {key: texts[name] for key, name in TEXT_KEYS.items()}
    if concat:
        (cond_latents,) = (images[name] for name in IMAGE_NAMES)
        batch["hidden_states"], batch["target"] = training_inputs(x0, noise, sigma, cond_latents.to(x0.dtype))
    else:
        s = sigma.view(-1, *([1] * (x0.dim() - 1)))
        batch["hidden_states"], batch["target"] = (1 - s) * x0 + s * noise, noise - x0
    batch["timestep"] = sigma * NUM_TRAIN_TIMESTEPS
    if model_config["guidance_embeds"]:
        batch["guidance"] = embedded_guidance(preset.guidance_scale, x0.shape[0], torch.float32)
    return batch
