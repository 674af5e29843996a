"""HunyuanVideo-1.5's train-step batch: stage-1 names to forward keywords, the 2C + 1 condition channels, SigLIP."""

from __future__ import annotations

import torch

from ..flow_matching import NUM_TRAIN_TIMESTEPS, training_inputs

#: The forward keywords of the feature folder's text tensors (stage 1's names).
TEXT_KEYS = {"encoder_hidden_states": "prompt_embeds", "encoder_attention_mask": "prompt_embeds_mask",
             "encoder_hidden_states_2": "prompt_embeds_2", "encoder_attention_mask_2": "prompt_embeds_mask_2"}
#: The text tensors a clip's features hold (and the empty prompt's).
TEXT_NAMES = tuple(TEXT_KEYS.values())
#: What image-to-video adds per clip: the first frame's SigLIP tokens and scaled VAE latents.
IMAGE_NAMES = ("image_embeds", "cond_latents")


def batch_inputs(preset, model_config, x0: torch.Tensor, noise: torch.Tensor, sigma: torch.Tensor,
                 texts: dict[str, torch.Tensor], images: dict[str, torch.Tensor] | None = None) -> dict:
    """The official trainer's inputs (:func:`hyv_lib.models.flow_matching.training_inputs`): the noisy latents with
    the condition channels (text-to-video: zeros and a zero mask; image-to-video: the first frame's latents), the
    timestep ``sigma * 1000``, both text encoders' tensors, and SigLIP's tokens (zeros for text-to-video: the model
    masks them out)."""
    batch = {key: texts[name] for key, name in TEXT_KEYS.items()}
    cond_latents = None if images is None else images["cond_latents"]
    if images is None:
        batch["image_embeds"] = torch.zeros(x0.shape[0], preset.image_tokens, model_config["image_embed_dim"])
    else:
        batch["image_embeds"] = images["image_embeds"]
    batch["hidden_states"], batch["target"] = training_inputs(x0, noise, sigma, cond_latents)
    batch["timestep"] = sigma * NUM_TRAIN_TIMESTEPS
    return batch
