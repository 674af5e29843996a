"""CogVideoX1.5's stage work without files, as diffusers' CogVideoXPipeline does it: T5 embeddings, the CFG loop, the
padded latent frames."""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any, Callable

import torch

from ...base.errors import HyvFaultError, HyvInputError
from ...base.presets import Preset, samples_per_step
from ..devices import on_device
from ..family import Warmup, warmup_count
from ..stage_tensors import FLOATS, require_finite
from ..truncation import plain_cut
from .adapter import COGVIDEOX
from .components import SCHEDULER_CLASSES

#: CogVideoX's stage-1 tensors: T5's embeddings of the prompt and of the negative prompt, [1, 226, D] each (no masks).
T5_STAGE1_NAMES = ("prompt_embeds", "negative_prompt_embeds")


# ------------------------------------------------------------------------------------------------- stage 1
@torch.no_grad()
def encode_t5(components: dict[str, Any], preset: Preset, prompts: list[str], device: torch.device | None = None,
              release: bool = False) -> dict[str, torch.Tensor]:
    """``prompt_embeds`` [B, text_len, D] in T5's dtype: T5's last hidden state of each of ``prompts`` tokenized with
    padding to ``text_len`` (226) and truncation, by CogVideoXPipeline's own ``_get_t5_prompt_embeds`` (its warning
    names what a long prompt loses). T5 gets no attention mask here, so each row is what diffusers computes for its
    prompt alone. ``device`` (None: where T5 is): T5 runs there and leaves it after
    (:func:`hyv_lib.models.devices.on_device`, ``release`` as there); the tensors come back on the host CPU."""
    from diffusers import CogVideoXPipeline

    text_encoder = components["text_encoder"]
    with on_device(text_encoder, device, release):
        host = SimpleNamespace(tokenizer=components["tokenizer"], text_encoder=text_encoder,
                               _execution_device=text_encoder.device)
        embeds = CogVideoXPipeline._get_t5_prompt_embeds(host, prompt=list(prompts),
                                                         max_sequence_length=preset.text_len,
                                                         device=text_encoder.device, dtype=text_encoder.dtype)
        if device is not None:
            embeds = embeds.cpu()
    return {"prompt_embeds": embeds}


# ------------------------------------------------------------------------------------------------- stage 2
def make_scheduler(scheduler_config: Any):
    """A fresh scheduler of ``scheduler_config``: its ``_class_name`` (a loaded folder's), one of
    :data:`hyv_lib.models.cogvideox.components.SCHEDULER_CLASSES`; CogVideoXDDIMScheduler when it names none."""
    import diffusers

    name = dict(scheduler_config).get("_class_name") or SCHEDULER_CLASSES[0]
    if name not in SCHEDULER_CLASSES:
        raise HyvInputError("model_path", f"the scheduler is {name}; CogVideoX runs {' or '.join(SCHEDULER_CLASSES)}")
    return getattr(diffusers, name).from_config(scheduler_config)


def rotary_tables(transformer, latent_shape: tuple[int, ...]) -> tuple[torch.Tensor, ...] | None:
    """The (cos, sin) RoPE tables the transformer gets as ``image_rotary_emb`` for latents of ``latent_shape`` [B, T',
    C, h, w] (T' padded): the CogVideoX adapter's (:meth:`hyv_lib.models.cogvideox.adapter.CogVideoXAdapter.rope`, the tables
    of CogVideoXPipeline's ``_prepare_rotary_positional_embeddings``); None for a model without RoPE."""
    if not transformer.config.use_rotary_positional_embeddings:
        return None
    return COGVIDEOX.rope(transformer, tuple(latent_shape))


@torch.no_grad()
def denoise_cogvideox(step: Callable[..., torch.Tensor], latents: torch.Tensor, prompt_embeds: torch.Tensor,
                      negative_prompt_embeds: torch.Tensor, scheduler, *, num_inference_steps: int,
                      guidance_scale: float, image_rotary_emb=None, model_dtype: torch.dtype = torch.float32,
                      generator: torch.Generator | None = None, warmup_steps: int = 0,
                      progress: bool = True) -> torch.Tensor:
    """CogVideoXPipeline's denoising loop from ``latents`` [1, T', C, h, w] (T' already padded); returns fp32 latents.

    ``scheduler`` (CogVideoXDDIMScheduler or CogVideoXDPMScheduler) gets ``set_timesteps(num_inference_steps)``; each
    step runs ``step`` on the CFG batch [negative, positive] (one sample when ``guidance_scale`` is 1) with
    ``encoder_hidden_states``, the timestep and ``image_rotary_emb``, combines uncond + scale x (cond - uncond), and
    steps the scheduler as the pipeline does: DDIM ``step(noise, t, latents)``; DPM ``step(noise, old_x0, t,
    t_previous, latents)``, carrying its x0 prediction. ``generator`` feeds the schedulers' noise (DDIM at eta 0 draws
    none; DPM draws some every step). The latents stay fp32 between steps and go to the transformer in
    ``model_dtype``. A NaN or infinity stops the loop with a HyvFaultError naming the step. Warmup calls run the
    first input and leave the scheduler alone.
    """
    from diffusers import CogVideoXDPMScheduler
    from tqdm import tqdm

    device = latents.device
    scheduler.set_timesteps(num_inference_steps, device=device)
    timesteps = scheduler.timesteps
    latents = latents.float() * scheduler.init_noise_sigma
    batch = samples_per_step(guidance_scale)
    context = (torch.cat([negative_prompt_embeds, prompt_embeds]) if batch == 2 else prompt_embeds)
    context = context.to(device, model_dtype)
    dpm = isinstance(scheduler, CogVideoXDPMScheduler)

    def model_kwargs(x: torch.Tensor, t: torch.Tensor) -> dict[str, Any]:
        hidden = scheduler.scale_model_input(torch.cat([x] * batch), t).to(model_dtype)
        return {"hidden_states": hidden, "encoder_hidden_states": context, "timestep": t.expand(batch),
                "image_rotary_emb": image_rotary_emb}

    for _ in range(warmup_steps):
        step(**model_kwargs(latents, timesteps[0]))
    if hasattr(step, "reset"):
        step.reset()
    old_pred_original_sample = None
    for i, t in enumerate(tqdm(timesteps, desc="denoising", disable=not progress, leave=False)):
        noise = step(**model_kwargs(latents, t)).float()
        if batch == 2:
            noise_uncond, noise_cond = noise.chunk(2)
            noise = noise_uncond + guidance_scale * (noise_cond - noise_uncond)
        if dpm:
            latents, old_pred_original_sample = scheduler.step(
                noise, old_pred_original_sample, t, timesteps[i - 1] if i > 0 else None, latents,
                generator=generator, return_dict=False)
        else:
            latents = scheduler.step(noise, t, latents, generator=generator, return_dict=False)[0]
        latents = latents.float()
        if not bool(torch.isfinite(latents).all()):
            raise HyvFaultError(f"denoising step {i + 1} of {len(timesteps)}",
                                f"the latents became NaN or infinite at timestep {int(t)} (guidance scale "
                                f"{guidance_scale:g}, model dtype {str(model_dtype).removeprefix('torch.')}); "
                                "stopped there, nothing written")
    return latents


def sample_cogvideox(step: Callable[..., torch.Tensor], transformer, scheduler_config, preset: Preset,
                     embeds: dict[str, torch.Tensor], settings, *, warmup: Warmup | None = None, progress: bool = True,
                     device: torch.device | None = None) -> torch.Tensor:
    """Stage 2's work for CogVideoX without files: seeded noise [1, T', C, h, w] (:meth:`Preset.denoising_shape`,
    drawn from a CPU generator seeded with ``settings.seed``: the bits of :func:`hyv_lib.models.family.initial_latents`;
    the same generator then feeds a DPM scheduler's noise, as CogVideoXPipeline's ``generator`` does), denoised by
    :func:`denoise_cogvideox` with the scheduler of ``scheduler_config``, conditioned on the stage-1 ``embeds``;
    fp32 latents on the CPU. ``warmup``: :meth:`hyv_lib.models.family.ModelFamily.sample`'s."""
    config = transformer.config
    if embeds["prompt_embeds"].shape[-1] != config.text_embed_dim:
        raise HyvInputError("input_dir", f"stage 1's prompt_embeds has width {embeds['prompt_embeds'].shape[-1]} "
                                         f"but the transformer expects {config.text_embed_dim}; stage1 used a "
                                         "different model")
    device = device or torch.device("cpu")
    shape = preset.denoising_shape(settings.height, settings.width, settings.video_length)
    shape = (shape[0], shape[1], config.in_channels, *shape[3:])  # the model decides the channels
    generator = torch.Generator("cpu").manual_seed(settings.seed)
    latents = torch.randn(shape, generator=generator, dtype=torch.float32)
    rope = rotary_tables(transformer, shape)
    rope = None if rope is None else tuple(table.to(device) for table in rope)
    dtype = next(transformer.parameters()).dtype
    return denoise_cogvideox(step, latents.to(device), embeds["prompt_embeds"], embeds["negative_prompt_embeds"],
                             make_scheduler(scheduler_config), num_inference_steps=settings.num_inference_steps,
                             guidance_scale=settings.guidance_scale, image_rotary_emb=rope,
                             model_dtype=dtype, generator=generator, progress=progress,
                             warmup_steps=warmup_count(warmup, settings, (
                                 shape, samples_per_step(settings.guidance_scale), dtype, str(device)))).cpu()


# ------------------------------------------------------------------------------------------------- stage 3
def vae_latents(preset: Preset, latents: torch.Tensor, video_length: Any) -> torch.Tensor:
    """The stage-2 latents as CogVideoX's VAE decodes them, [1, C, T, h, w]: the padded frames dropped from the
    front, as CogVideoXPipeline drops them (``latents[:, T' - T:]``, T the latent frames of ``video_length``), and
    channels put before frames. HyvInputError naming ``input_dir`` when the latents do not fit ``video_length``."""
    if video_length is None:
        raise HyvInputError("input_dir", "the folder's config has no video_length: stage 3 needs it to drop the "
                                         "padded latent frames; rerun stage2 into this folder")
    frames = (int(video_length) - 1) // preset.temporal_compression + 1
    patch_t = int(preset.transformer.get("patch_size_t") or 1)
    padded = -(-frames // patch_t) * patch_t
    if latents.ndim != 5 or latents.shape[2] != preset.latent_channels or latents.shape[1] != padded:
        raise HyvInputError("input_dir", f"{preset.name} latents of {video_length} frames are "
                                         f"[1, {padded}, {preset.latent_channels}, h, w] ({frames} latent frames "
                                         f"padded to the temporal patch {patch_t}); got {list(latents.shape)}")
    return latents[:, latents.shape[1] - frames:].permute(0, 2, 1, 3, 4)


# ------------------------------------------------------------------------------------------------- checks
def check_t5_stage1(tensors: dict[str, torch.Tensor], preset: Preset, path: str) -> None:
    """CogVideoX's stage-1 file: exactly :data:`T5_STAGE1_NAMES`, each a float [1, text_len, D], both one shape,
    every value finite."""
    if set(tensors) != set(T5_STAGE1_NAMES):
        raise HyvInputError("input_dir", f"{os.path.basename(path)} of {preset.name} must hold exactly "
                                         f"{', '.join(T5_STAGE1_NAMES)}; got {', '.join(sorted(tensors))}")
    for name, value in tensors.items():
        if value.ndim != 3 or value.shape[:2] != (1, preset.text_len) or value.dtype not in FLOATS:
            raise HyvInputError("input_dir", f"{path!r}: {name} must be a float tensor [1, {preset.text_len}, D], "
                                             f"got {value.dtype} {list(value.shape)}")
    if tensors["prompt_embeds"].shape != tensors["negative_prompt_embeds"].shape:
        raise HyvInputError("input_dir", f"{path!r}: negative_prompt_embeds and prompt_embeds differ in shape")
    for name, value in tensors.items():
        require_finite(path, name, value, "rerun stage1")


def t5_cuts(components: dict[str, Any], preset: Preset,
            prompts: dict[str, str]) -> dict[str, tuple[int, int, int, str]]:
    """T5's cut of each prompt: padded and truncated to ``text_len`` with its EOS (:meth:`CogVideoXFamily.tokens_cut
    <hyv_lib.models.family.ModelFamily.tokens_cut>`)."""
    return {f"{key}_tokens_dropped": (*plain_cut(components["tokenizer"], text, preset.text_len), preset.text_len,
                                      "the text encoder")
            for key, text in prompts.items()}
