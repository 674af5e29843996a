"""HunyuanVideo's stage-2 recipe as HunyuanVideoPipeline runs it (embedded guidance, one sample a step), checks."""

from __future__ import annotations

import os
from typing import Any, Callable

import numpy as np
import torch

from ...base.errors import HyvFaultError, HyvInputError
from ...base.presets import Preset
from ..family import Warmup, initial_latents, warmup_count
from ..stage_tensors import FLOATS, INTS, require_finite

#: The stage-1 text tensors of one prompt: Llama's states and mask, CLIP's pooled vector.
TEXT_NAMES = ("prompt_embeds", "prompt_embeds_mask", "pooled_prompt_embeds")
#: What stage 1 writes: the prompt's and the negative prompt's (the loop reads the prompt's: guidance is embedded).
STAGE1_NAMES = (*TEXT_NAMES, *(f"negative_{name}" for name in TEXT_NAMES))
#: The latent-concat image-to-video checkpoint's first frame: its VAE latents [1, C, 1, h, w] (scaled).
IMAGE_NAMES = ("cond_latents",)
#: HunyuanVideoImageToVideoPipeline's start: noise x 0.999 + the first frame's latents x 0.001 in every frame.
I2V_NOISE_KEEP = 0.999


def embedded_guidance(guidance_scale: float, batch: int, dtype: torch.dtype, device=None) -> torch.Tensor:
    """The ``guidance`` input of a guidance-distilled checkpoint: the scale x 1000 per sample, in the model's dtype,
    as HunyuanVideoPipeline makes it."""
    return torch.tensor([guidance_scale] * batch, dtype=dtype, device=device) * 1000.0


@torch.no_grad()
def denoise(step: Callable[..., torch.Tensor], latents: torch.Tensor, conditioning: dict[str, torch.Tensor],
            scheduler, *, num_inference_steps: int, guidance_scale: float, guidance_embeds: bool,
            model_dtype: torch.dtype = torch.float32, cond_latents: torch.Tensor | None = None,
            warmup_steps: int = 0, progress: bool = True) -> torch.Tensor:
    """HunyuanVideoPipeline's loop from ``latents`` [1, C, T, h, w]: sigmas linspace(1, 0, N+1)[:-1] shifted by the
    flow-matching ``scheduler``, one transformer call per step on the prompt's ``conditioning``
    (``encoder_hidden_states``, ``encoder_attention_mask``, ``pooled_projections``) with the ``guidance_scale`` fed
    to the guidance embedding (x 1000; checkpoints without ``guidance_embeds`` get none), float32 timesteps, an
    Euler step per call; returns fp32 latents. ``cond_latents`` (latent-concat image-to-video): the first frame's
    latents, mixed into the start (x 0.001) and given to every call after the latents with a first-frame mask, as
    HunyuanVideoImageToVideoPipeline does. A NaN or infinity stops the loop with a HyvFaultError naming the step;
    warmup calls run the first input and leave the scheduler alone."""
    from tqdm import tqdm

    device = latents.device
    scheduler.set_timesteps(sigmas=np.linspace(1.0, 0.0, num_inference_steps + 1)[:-1], device=device)
    scheduler.set_begin_index(0)
    timesteps = scheduler.timesteps
    latents = latents.float()
    batch = latents.shape[0]
    extra = None
    if cond_latents is not None:
        image = cond_latents.float().to(device).expand(batch, -1, latents.shape[2], -1, -1)
        latents = latents * torch.tensor([I2V_NOISE_KEEP], device=device) + image * (1 - torch.tensor(
            [I2V_NOISE_KEEP], device=device))
        image = image.clone()
        image[:, :, 1:] = 0
        mask = image.new_zeros(batch, 1, *image.shape[2:])
        mask[:, :, 0] = 1
        extra = torch.cat([image, mask], dim=1)
    guidance = (embedded_guidance(guidance_scale, batch, model_dtype, device) if guidance_embeds else None)
    kwargs = {k: v.to(device) for k, v in conditioning.items()}
    if guidance is not None:
        kwargs["guidance"] = guidance

    def model_kwargs(x: torch.Tensor, t: torch.Tensor) -> dict[str, Any]:
        hidden = x if extra is None else torch.cat([x, extra], dim=1)
        return {"hidden_states": hidden.to(model_dtype), "timestep": t.expand(batch).to(x.dtype), **kwargs}

    for _ in range(warmup_steps):
        step(**model_kwargs(latents, timesteps[0]))
    if hasattr(step, "reset"):
        step.reset()
    for i, t in enumerate(tqdm(timesteps, desc="denoising", disable=not progress, leave=False)):
        noise = step(**model_kwargs(latents, t)).float()
        latents = scheduler.step(noise, t, latents, return_dict=False)[0].float()
        if not bool(torch.isfinite(latents).all()):
            raise HyvFaultError(f"denoising step {i + 1} of {len(timesteps)}",
                                f"the latents became NaN or infinite at timestep {float(t):.1f} (embedded guidance "
                                f"{guidance_scale:g}, model dtype {str(model_dtype).removeprefix('torch.')}); "
                                "stopped there, nothing written")
    return latents


def sample(step: Callable[..., torch.Tensor], transformer, scheduler_config, preset: Preset,
           embeds: dict[str, torch.Tensor], settings, *, warmup: Warmup | None = None, progress: bool = True,
           device: torch.device | None = None) -> torch.Tensor:
    """Stage 2's work for HunyuanVideo without files: seeded noise [1, 16, T, h, w]
    (:func:`hyv_lib.models.family.initial_latents`, the bits a CPU generator seeded with ``settings.seed`` gives
    HunyuanVideoPipeline) denoised by :func:`denoise` with the settings' flow shift and ``guidance_scale`` as the
    embedded guidance, conditioned on the prompt's stage-1 tensors (and ``cond_latents`` for image-to-video); fp32
    latents on the CPU. ``warmup``: :meth:`hyv_lib.models.family.ModelFamily.sample`'s."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    config = transformer.config
    for key, dim in (("prompt_embeds", config.text_embed_dim), ("pooled_prompt_embeds", config.pooled_projection_dim)):
        if embeds[key].shape[-1] != dim:
            raise HyvInputError("input_dir", f"stage 1's {key} has width {embeds[key].shape[-1]} but the "
                                             f"transformer expects {dim}; stage1 used a different model")
    cond_latents = embeds.get("cond_latents")
    if config.image_condition_type is not None and cond_latents is None:
        raise HyvInputError("image_path", f"{preset.name} generates from a first frame: stage 1 needs one")
    model_dtype = next(transformer.parameters()).dtype
    device = device or torch.device("cpu")
    scheduler = FlowMatchEulerDiscreteScheduler.from_config(scheduler_config, shift=settings.flow_shift)
    shape = preset.latent_shape(settings.height, settings.width, settings.video_length)
    shape = (shape[0], config.out_channels, *shape[2:])  # the model decides the channels
    if config.image_condition_type == "latent_concat" and settings.video_length <= preset.temporal_compression:
        raise HyvInputError("video_length", f"is {settings.video_length}, but {preset.name}'s video keeps the frames "
                                            f"after the first {preset.temporal_compression} (as its pipeline does): "
                                            f"give {preset.temporal_compression + 1} or more")
    if cond_latents is not None and tuple(cond_latents.shape[-2:]) != shape[-2:]:
        raise HyvInputError("height", f"the first frame's latents are {list(cond_latents.shape[-2:])} but the "
                                      f"video's are {list(shape[-2:])}: the image decides the size")
    conditioning = {"encoder_hidden_states": embeds["prompt_embeds"].to(model_dtype),
                    "encoder_attention_mask": embeds["prompt_embeds_mask"].to(model_dtype),
                    "pooled_projections": embeds["pooled_prompt_embeds"].to(model_dtype)}
    return denoise(step, initial_latents(shape, settings.seed).to(device), conditioning, scheduler,
                   num_inference_steps=settings.num_inference_steps, guidance_scale=settings.guidance_scale,
                   guidance_embeds=bool(config.guidance_embeds), model_dtype=model_dtype,
                   cond_latents=None if cond_latents is None else cond_latents.to(device), progress=progress,
                   warmup_steps=warmup_count(warmup, settings, (shape, 1, model_dtype, str(device)))).cpu()


def video_frames(preset: Preset, frames: torch.Tensor) -> torch.Tensor:
    """The decoded frames [F, H, W, 3] the video keeps: all of them, but for the latent-concat image-to-video
    checkpoint those after the first ``temporal_compression`` (4), as HunyuanVideoImageToVideoPipeline (and
    Tencent's HunyuanVideo-I2V pipeline it follows) drops them: 129 frames give a video of 125."""
    if preset.transformer.get("image_condition_type") == "latent_concat":
        return frames[preset.temporal_compression:]
    return frames


def check_stage1(tensors: dict[str, torch.Tensor], preset: Preset, path: str) -> None:
    """HyvInputError naming ``input_dir`` unless ``tensors`` (read from ``path``) are HunyuanVideo's stage-1 file:
    exactly :data:`STAGE1_NAMES` (plus ``cond_latents`` [1, C, 1, h, w] for image-to-video), float embeddings
    [1, text_len, D] and pooled [1, D], integer or bool masks [1, text_len], each negative shaped as its positive,
    every value finite."""
    file = os.path.basename(path)
    image = "i2v" in preset.tasks
    expected = set(STAGE1_NAMES) | (set(IMAGE_NAMES) if image else set())
    if set(tensors) != expected:
        raise HyvInputError("input_dir", f"{file} of {preset.name} must hold exactly {', '.join(sorted(expected))}; "
                                         f"got {', '.join(sorted(tensors))}")
    for prefix in ("", "negative_"):
        embeds, mask, pooled = (tensors[prefix + name] for name in TEXT_NAMES)
        if embeds.ndim != 3 or embeds.shape[:2] != (1, preset.text_len) or embeds.dtype not in FLOATS:
            raise HyvInputError("input_dir", f"{file}: {prefix}prompt_embeds must be a float tensor "
                                             f"[1, {preset.text_len}, D], got {embeds.dtype} {list(embeds.shape)}")
        if mask.shape != embeds.shape[:2] or mask.dtype not in INTS:
            raise HyvInputError("input_dir", f"{file}: {prefix}prompt_embeds_mask must be an integer or bool tensor "
                                             f"[1, {preset.text_len}], got {mask.dtype} {list(mask.shape)}")
        if pooled.ndim != 2 or pooled.shape[0] != 1 or pooled.dtype not in FLOATS:
            raise HyvInputError("input_dir", f"{file}: {prefix}pooled_prompt_embeds must be a float tensor [1, D], "
                                             f"got {pooled.dtype} {list(pooled.shape)}")
    for name in TEXT_NAMES:
        if tensors[name].shape != tensors["negative_" + name].shape:
            raise HyvInputError("input_dir", f"{file}: negative_{name} and {name} differ in shape")
    if image:
        latents = tensors["cond_latents"]
        if latents.ndim != 5 or latents.shape[:3] != (1, preset.latent_channels, 1) or latents.dtype not in FLOATS:
            raise HyvInputError("input_dir", f"{file}: cond_latents must be a float tensor "
                                             f"[1, {preset.latent_channels}, 1, h, w], got {latents.dtype} "
                                             f"{list(latents.shape)}")
    for name, value in tensors.items():
        require_finite(path, name, value, "rerun stage1")
