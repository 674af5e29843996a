"""gpu_check.py's ``hunyuanvideo`` section: HunyuanVideo's (13B, Dec 2024) denoising step on one GPU, diffusers'
forward and hyv_lib's (the rows of :mod:`gpu_model_step`).

- ``tiny``: the tiny HunyuanVideo (``hunyuanvideo_tiny``, fp32, seeded weights, 20 of 32 text tokens valid) on this
  device with hyv_lib's attention against diffusers' eager fp32 forward on the CPU (the oracle): the max difference.
- ``real``: one denoising step of the 12.8B-parameter transformer (20 dual-stream + 40 single-stream blocks) with
  random bf16 weights at 544x960 and 720x1280, 129 frames (67,320 and 118,800 video tokens + 256 text tokens, 120 of
  them valid). Guidance is embedded (the guidance-distilled checkpoint): ONE sample per step, no CFG pair. diffusers'
  stock forward (SDPA with a key mask) against the same forward with hyv_lib's attention (``auto``), then the blocks
  compiled.

The reference to put it beside (xDiT's docs/performance/hunyuanvideo.md, cited in shared/reference/anchors.md):
1,904 s for 50 steps at 1280x720x129 on one H100 (about 38 s/step), 337.6 s on 8 H100s with Ulysses; no per-step
figure on one H200 is published.
"""

from __future__ import annotations

from typing import Any

import torch

from gpu_model_step import ModelStep, model_step_section

#: (height, width, frames) of the real rows, and of the tiny rows ``--tiny`` runs on the CPU.
REAL_SIZES = {"544x960": (544, 960, 129), "720x1280": (720, 1280, 129)}
TINY_SIZES = {"small": (64, 96, 9)}
#: Valid text tokens of one sample: a typical prompt after the template's crop (the rest of text_len is padding).
VALID_TEXT = {"real": 120, "tiny": 20}


def forward_inputs(preset, config, height: int, width: int, frames: int, device, dtype, seed: int = 1
                   ) -> dict[str, Any]:
    """One sample of the forward's keywords: latents [1, 16, (F-1)/4+1, H/8, W/8], random Llama-shaped text states
    with the first :data:`VALID_TEXT` tokens valid in the mask, a CLIP-shaped pooled vector, a mid-schedule timestep
    and the embedded guidance (6.0 x 1000, as HunyuanVideoPipeline passes it) where the checkpoint embeds it."""
    g = torch.Generator().manual_seed(seed)
    latent_frames = (frames - 1) // 4 + 1
    hidden = torch.randn(1, config.in_channels, latent_frames, height // 8, width // 8, generator=g)
    text = torch.randn(1, preset.text_len, config.text_embed_dim, generator=g)
    valid = VALID_TEXT["tiny" if preset.is_tiny else "real"]
    mask = (torch.arange(preset.text_len)[None] < valid).long()
    pooled = torch.randn(1, config.pooled_projection_dim, generator=g)
    inputs = dict(hidden_states=hidden.to(device, dtype), timestep=torch.full((1,), 500.0, device=device),
                  encoder_hidden_states=text.to(device, dtype), encoder_attention_mask=mask.to(device),
                  pooled_projections=pooled.to(device, dtype))
    if config.guidance_embeds:
        inputs["guidance"] = torch.full((1,), 6000.0, device=device, dtype=dtype)
    return inputs


def tokens(config, height: int, width: int, frames: int) -> tuple[int, int]:
    """(video, valid text) tokens of one sample: latent frames / patch_t x (H/8/patch) x (W/8/patch)."""
    latent_frames = (frames - 1) // 4 + 1
    p, p_t = config.patch_size, config.patch_size_t
    video = latent_frames // p_t * (height // 8 // p) * (width // 8 // p)
    return video, VALID_TEXT["real"] if config.num_layers >= 20 else VALID_TEXT["tiny"]


#: The section's model: HunyuanVideo text-to-video, one sample per step (embedded guidance).
HUNYUANVIDEO_STEP = ModelStep(
    key="hunyuanvideo", tiny="hunyuanvideo_tiny", real="hunyuanvideo_t2v", real_sizes=REAL_SIZES,
    tiny_sizes=TINY_SIZES, inputs=forward_inputs, tokens=tokens, batch=1,
    reference=("xDiT docs/performance/hunyuanvideo.md: 1280x720x129, 50 steps, 1,904 s on 1 H100 (~38 s/step), "
               "337.6 s on 8 H100s with Ulysses"))


def hunyuanvideo_section(section, device, clock, budget, tiny: bool, helpers: dict[str, Any]) -> None:
    """The section (:func:`gpu_model_step.model_step_section` on :data:`HUNYUANVIDEO_STEP`)."""
    model_step_section(HUNYUANVIDEO_STEP, section, device, clock, budget, tiny, helpers)
