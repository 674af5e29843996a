"""HunyuanVideo-1.5's denoising recipe: the flow-matching schedule, CFG as one batch, the Euler steps, i2v conditioning."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from ...base.errors import HyvFaultError, HyvInputError
from ...base.presets import Preset, samples_per_step
from ..family import Warmup, initial_latents, warmup_count
from ..flow_matching import condition_channels


def sample(step: Callable[..., torch.Tensor], transformer, scheduler_config, preset: Preset,
           embeds: dict[str, torch.Tensor], settings, *, warmup: Warmup | None = None, progress: bool = True,
           device: torch.device | None = None) -> torch.Tensor:
    """Stage 2's work without files (:meth:`hyv_lib.models.family.ModelFamily.sample`): seeded noise
    (:func:`hyv_lib.models.family.initial_latents`) denoised by ``step`` with CFG (:func:`denoise`), conditioned on
    the stage-1 tensors ``embeds`` (with ``image_embeds`` and ``cond_latents``: image-to-video); fp32 latents
    [1, C, T, h, w] on the CPU. ``transformer`` supplies the dtype and widths (and whether it is a MeanFlow model);
    the scheduler is built from ``scheduler_config`` with the settings' flow shift."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    config = transformer.config
    for key, dim in (("prompt_embeds", config.text_embed_dim), ("prompt_embeds_2", config.text_embed_2_dim)):
        if embeds[key].shape[-1] != dim:
            raise HyvInputError("input_dir", f"stage 1's {key} has width {embeds[key].shape[-1]} but the "
                                             f"transformer expects {dim}; stage1 used a different model")
    model_dtype = next(transformer.parameters()).dtype
    device = device or torch.device("cpu")
    scheduler = FlowMatchEulerDiscreteScheduler.from_config(scheduler_config, shift=settings.flow_shift)
    shape = preset.latent_shape(settings.height, settings.width, settings.video_length)
    shape = (shape[0], config.out_channels, *shape[2:])  # the model decides the channels
    cond_latents = embeds.get("cond_latents")
    if cond_latents is not None and tuple(cond_latents.shape[-2:]) != shape[-2:]:
        raise HyvInputError("height", f"the first frame's latents are {list(cond_latents.shape[-2:])} but the "
                                      f"video's are {list(shape[-2:])}: the image decides the size")
    conditioning = {k: v.to(device) for k, v in prepare_conditioning(
        embeds, preset, model_dtype, image_dim=config.image_embed_dim).items()}
    return denoise(step, initial_latents(shape, settings.seed).to(device), conditioning, scheduler,
                   num_inference_steps=settings.num_inference_steps, guidance_scale=settings.guidance_scale,
                   model_dtype=model_dtype, progress=progress,
                   # --compile: one untimed call compiles before the first timed step (unless warmup_steps says)
                   warmup_steps=warmup_count(warmup, settings, (
                       shape, samples_per_step(settings.guidance_scale), model_dtype, str(device))),
                   cond_latents=None if cond_latents is None else cond_latents.to(device),
                   meanflow=bool(getattr(config, "use_meanflow", False))).cpu()


def prepare_conditioning(embeds: dict[str, torch.Tensor], preset: Preset, dtype: torch.dtype,
                         image_dim: int | None = None) -> dict[str, Any]:
    """Stage-1 tensors -> the forward's conditioning kwargs as a CFG batch of 2 ([negative, positive]).

    t2v passes all-zero image embeddings (the model then masks those tokens out), as diffusers does; i2v passes the
    first frame's SigLIP tokens to both halves (diffusers does not drop the image for the negative prompt).
    ``image_dim`` (default: the preset's) is the transformer's ``image_embed_dim``.
    """
    image = embeds.get("image_embeds")
    if image is None:
        image = torch.zeros(1, preset.image_tokens, image_dim or preset.image_dim)

    def pair(name: str) -> torch.Tensor:
        return torch.cat([embeds["negative_" + name], embeds[name]], dim=0)

    return {
        "encoder_hidden_states": pair("prompt_embeds").to(dtype),
        "encoder_attention_mask": pair("prompt_embeds_mask").to(torch.int64),
        "encoder_hidden_states_2": pair("prompt_embeds_2").to(dtype),
        "encoder_attention_mask_2": pair("prompt_embeds_mask_2").to(torch.int64),
        "image_embeds": image.to(dtype).repeat(2, 1, 1),
    }


def sampling_schedule(scheduler, num_inference_steps: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The loop's schedule: sets ``scheduler``'s sigmas to linspace(1, 0, N+1)[:-1], which a
    FlowMatchEulerDiscreteScheduler shifts by its flow shift s (sigma' = s sigma / (1 + (s - 1) sigma)), and returns
    (timesteps [N], timestep_r [N]): timestep i is 1000 sigma'_i, and timestep_r[i] is the next timestep (0 after the
    last), what a step-distilled (MeanFlow) model gets with each step, as diffusers' I2V pipeline passes it.
    :func:`denoise` runs exactly this schedule."""
    scheduler.set_timesteps(sigmas=np.linspace(1.0, 0.0, num_inference_steps + 1)[:-1], device=device)
    timesteps = scheduler.timesteps
    timestep_r = torch.cat([timesteps[1:], torch.zeros(1, dtype=timesteps.dtype, device=timesteps.device)])
    return timesteps, timestep_r


@torch.no_grad()
def denoise(
    step: Callable[..., torch.Tensor], latents: torch.Tensor, conditioning: dict[str, Any], scheduler, *,
    num_inference_steps: int, guidance_scale: float, model_dtype: torch.dtype = torch.float32,
    warmup_steps: int = 0, progress: bool = True, cond_latents: torch.Tensor | None = None, meanflow: bool = False,
) -> torch.Tensor:
    """Flow-matching Euler loop with CFG as one batch of 2 (one sample when ``guidance_scale`` is 1, as diffusers'
    guider runs it); returns fp32 latents.

    Sigmas are linspace(1, 0, N+1)[:-1] shifted by the scheduler, as diffusers' pipeline sets them
    (:func:`sampling_schedule`).
    After each step the latents are checked (one ``isfinite`` reduction): the first step that makes a NaN or an
    infinity raises :class:`hyv_lib.base.errors.HyvFaultError` naming it, instead of denoising on to a black video.
    Warmup calls run the step on the first input and discard the result without touching the
    scheduler, so they cannot change the latents (gpu-tpu-pedia's warmup advanced the step index).
    ``cond_latents`` [1, C, 1, h, w] (image-to-video): the first frame's latents go into latent frame 0 of the
    condition channels and the mask channel is 1 there, 0 elsewhere (:func:`hyv_lib.models.flow_matching.condition_channels`). ``meanflow``: each
    call also gets ``timestep_r``, the next timestep (0 after the last), as diffusers' I2V pipeline passes it.
    """
    from tqdm import tqdm  # plain text bar: works in terminals and in executed notebooks alike

    timesteps, timesteps_r = sampling_schedule(scheduler, num_inference_steps, device=latents.device)
    latents = latents.float()
    # After the noisy latents: C condition channels and a mask channel (t2v: all zero).
    condition = condition_channels(latents, cond_latents)
    batch = samples_per_step(guidance_scale)
    cfg = batch == 2
    if not cfg:  # the [negative, positive] pair's positive half: uncond + 1 * (cond - uncond) is cond
        conditioning = {k: v[1:] for k, v in conditioning.items()}

    def model_kwargs(x: torch.Tensor, i: int) -> dict[str, Any]:
        hidden = torch.cat([x, condition], dim=1).to(model_dtype)
        kwargs = {"hidden_states": hidden.repeat(batch, 1, 1, 1, 1),
                  "timestep": timesteps[i].expand(batch).to(model_dtype), **conditioning}
        if meanflow:
            kwargs["timestep_r"] = timesteps_r[i].expand(batch).to(model_dtype)
        return kwargs

    for _ in range(warmup_steps):
        step(**model_kwargs(latents, 0))
    if hasattr(step, "reset"):  # stateful steps (DeepCache) count steps from here: warmup must not shift them
        step.reset()
    schedule = getattr(step, "schedule", None)
    if schedule is not None:  # a DeepCache schedule that does not fit this loop is worth a word
        import warnings

        if schedule.num_steps != num_inference_steps:
            warnings.warn(f"the DeepCache schedule has {schedule.num_steps} steps but the loop runs "
                          f"{num_inference_steps}", stacklevel=2)
        if schedule.cached_in(num_inference_steps) == 0:
            warnings.warn(f"DeepCache caches none of these {num_inference_steps} steps ({schedule.describe()}): "
                          "every step runs full", stacklevel=2)
    for i, t in enumerate(tqdm(timesteps, desc="denoising", disable=not progress, leave=False)):
        noise = step(**model_kwargs(latents, i)).float()
        if cfg:
            noise_uncond, noise_cond = noise.chunk(2)
            noise = noise_uncond + guidance_scale * (noise_cond - noise_uncond)
        latents = scheduler.step(noise, t, latents, return_dict=False)[0]
        if not bool(torch.isfinite(latents).all()):  # one reduction per step; a NaN would run on to a black video
            raise HyvFaultError(f"denoising step {i + 1} of {len(timesteps)}",
                                f"the latents became NaN or infinite at timestep {float(t):.1f} (guidance scale "
                                f"{guidance_scale:g}, model dtype {str(model_dtype).removeprefix('torch.')}); "
                                "stopped there, nothing written")
    return latents
