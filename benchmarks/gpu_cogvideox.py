"""gpu_check.py's ``cogvideox`` section: CogVideoX1.5-5B's denoising step on one GPU, diffusers' forward and hyv_lib's
(the rows of :mod:`gpu_model_step`).

- ``tiny``: the tiny CogVideoX (``cogvideox_tiny``, fp32, seeded weights) on this device with hyv_lib's attention
  against diffusers' eager fp32 forward on the CPU (the oracle): the max difference.
- ``real``: one denoising step (the CFG batch of 2) of the 42-block, 5.57B-parameter transformer with random bf16
  weights at 768x1360 and 720x1280, 81 frames (44,880 and 39,600 video tokens + 226 text tokens), diffusers' stock
  forward (its SDPA processor) against the same forward with hyv_lib's attention (``auto``), then the blocks
  compiled. The RoPE tables are diffusers' own (``get_3d_rotary_pos_embed`` as ``CogVideoXPipeline`` calls it).
  Target (issue 44): the compiled step >= 1.15x diffusers' stock forward.

The reference to put it beside (gpu-tpu-pedia, single author, TPU v6e-8 with data=2 x tensor=4): 1.13 s/step at
768x1360x81, about 2.13 s/step at 720x1280x81 (106.47 s for 50 steps end to end).
"""

from __future__ import annotations

from typing import Any

import torch

from gpu_model_step import ModelStep, model_step_section

#: (height, width, frames) of the real rows, and of the tiny rows ``--tiny`` runs on the CPU.
REAL_SIZES = {"768x1360": (768, 1360, 81), "720x1280": (720, 1280, 81)}
TINY_SIZES = {"small": (96, 160, 9)}
#: The issue's target for the compiled step against diffusers' stock forward (the real rows).
COMPILED_TARGET = dict(text=">= 1.15x diffusers' stock forward (issue 44)", speedup=1.15)


def pipeline_rope(config, height: int, width: int, latent_frames: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The (cos, sin) tables CogVideoXPipeline passes as ``image_rotary_emb`` (its
    ``_prepare_rotary_positional_embeddings``, restated from the pipeline's arguments; VAE factor 8)."""
    from diffusers.models.embeddings import get_3d_rotary_pos_embed

    p, p_t = config.patch_size, config.patch_size_t
    grid = (height // (8 * p), width // (8 * p))
    if p_t is None:
        raise ValueError("the section runs CogVideoX 1.5 (patch_size_t=2)")
    return get_3d_rotary_pos_embed(embed_dim=config.attention_head_dim, crops_coords=None, grid_size=grid,
                                   temporal_size=(latent_frames + p_t - 1) // p_t, grid_type="slice",
                                   max_size=(config.sample_height // p, config.sample_width // p), device=device)


def forward_inputs(config, height: int, width: int, frames: int, device, dtype, seed: int = 1) -> dict[str, Any]:
    """A CFG batch of the forward's keywords: latents [2, F, 16, H/8, W/8] with F padded to the temporal patch as the
    pipeline pads it, random T5-shaped text states, a mid-schedule timestep and the pipeline's RoPE tables."""
    latent_frames = (frames - 1) // 4 + 1
    latent_frames += (-latent_frames) % (config.patch_size_t or 1)
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(2, latent_frames, config.in_channels, height // 8, width // 8, generator=g)
    text = torch.randn(2, config.max_text_seq_length, config.text_embed_dim, generator=g)
    rope = pipeline_rope(config, height, width, latent_frames, device)
    return dict(hidden_states=hidden.to(device, dtype), encoder_hidden_states=text.to(device, dtype),
                timestep=torch.full((2,), 500, device=device, dtype=torch.long), image_rotary_emb=rope)


def video_tokens(config, height: int, width: int, frames: int) -> int:
    """Video tokens of one sample: padded latent frames / 2 x (H/16) x (W/16)."""
    latent_frames = (frames - 1) // 4 + 1
    latent_frames += (-latent_frames) % config.patch_size_t
    return latent_frames // config.patch_size_t * (height // 16) * (width // 16)


def tokens(config, height: int, width: int, frames: int) -> tuple[int, int]:
    """(video, text) tokens of one sample."""
    return video_tokens(config, height, width, frames), config.max_text_seq_length


#: The section's model: CogVideoX1.5-5B, a CFG pair per step.
COGVIDEOX_STEP = ModelStep(
    key="cogvideox", tiny="cogvideox_tiny", real="cogvideox1.5_5b", real_sizes=REAL_SIZES, tiny_sizes=TINY_SIZES,
    inputs=lambda preset, *args: forward_inputs(*args), tokens=tokens, batch=2, target=COMPILED_TARGET,
    reference=("gpu-tpu-pedia (single author), TPU v6e-8, data=2 x tensor=4: 1.13 s/step at 768x1360x81; "
               "~2.13 s/step at 720x1280x81 (106.47 s end to end, 50 steps)"))


def cogvideox_section(section, device, clock, budget, tiny: bool, helpers: dict[str, Any]) -> None:
    """The section (:func:`gpu_model_step.model_step_section` on :data:`COGVIDEOX_STEP`)."""
    model_step_section(COGVIDEOX_STEP, section, device, clock, budget, tiny, helpers)


