"""CogVideoX1.5's presets (the diffusers conversion script's 1.5/5B configs, and a tiny twin) and its scheduler's config."""

from __future__ import annotations

import dataclasses
from typing import Any

from ...base.presets import Preset
from .adapter import COGVIDEOX

# CogVideoX1.5-5B (zai-org/CogVideoX1.5-5B, formerly THUDM/): the transformer config that diffusers'
# scripts/convert_cogvideox_to_diffusers.py writes for --version 1.5 with the 5B flags (42 layers, 48 heads x 64,
# RoPE; patch 2 x 2, temporal patch 2, no patch bias, sample 300 x 300 latents, 81 frames), T5-XXL text of 226 tokens
# (4096 wide, no padding mask: the pipeline pads to 226 and the model attends to every token), a 16-channel VAE
# with 8x spatial / 4x temporal compression and scaling factor 0.7 (1.5 inverts it when encoding a first frame).
# Sampling: CogVideoXDDIMScheduler (v-prediction, zero-terminal-SNR betas, trailing spacing, snr_shift_scale 1.0 for
# 5B), CFG 6, 50 steps, 16 fps; 1360 x 768 is the recommended size (the 16:9 bucket of target 1024 at stride 16:
# the VAE's 8 times the patch's 2). flow_shift is not used by this scheduler (1.0: none).

#: ``Preset.model`` of both CogVideoX presets: the adapter's name.
MODEL = COGVIDEOX.name
#: CogVideoXDDIMScheduler's config for the 5B models (the conversion script's, snr_shift_scale 1.0 for 5B).
COGVIDEOX_SCHEDULER = dict(snr_shift_scale=1.0, beta_end=0.012, beta_schedule="scaled_linear", beta_start=0.00085,
                           clip_sample=False, num_train_timesteps=1000, prediction_type="v_prediction",
                           rescale_betas_zero_snr=True, set_alpha_to_one=True, timestep_spacing="trailing")


def cogvideox_dit(heads: int, head_dim: int, layers: int, text_dim: int, time_embed_dim: int) -> dict[str, Any]:
    """CogVideoXTransformer3DModel's config for version 1.5: patch 2 x 2 x 2 (no patch bias), RoPE over a 300 x 300
    latent grid, 16 latent channels, 226 text tokens; only the widths and the depth vary."""
    return dict(num_attention_heads=heads, attention_head_dim=head_dim, in_channels=16, out_channels=16,
                time_embed_dim=time_embed_dim, text_embed_dim=text_dim, num_layers=layers, patch_size=2,
                patch_size_t=2, patch_bias=False, sample_height=300, sample_width=300, sample_frames=81,
                temporal_compression_ratio=4, max_text_seq_length=226, use_rotary_positional_embeddings=True,
                use_learned_positional_embeddings=False)


#: ``Preset`` fields of ``cogvideox1.5_5b`` (real weights from a diffusers-format folder).
COGVIDEOX_15_5B_FIELDS: dict[str, Any] = dict(
    name="cogvideox1.5_5b",
    description="CogVideoX1.5-5B text-to-video (5B DiT, T5-XXL text encoder), diffusers format.",
    is_tiny=False, hub_id="zai-org/CogVideoX1.5-5B",
    text_len=226, text_dim=4096, byt5_len=0, byt5_dim=0, image_tokens=0, image_dim=0,
    latent_channels=16, spatial_compression=8, temporal_compression=4, target_size=1024,
    default_video_length=81, default_steps=50, flow_shift=1.0, guidance_scale=6.0, fps=16, default_dtype="bf16",
    crop_start=0,  # no chat template: the prompt is tokenized as is
    transformer=cogvideox_dit(heads=48, head_dim=64, layers=42, text_dim=4096, time_embed_dim=512),
    vae=dict(latent_channels=16, scaling_factor=0.7, invert_scale_latents=True, temporal_compression_ratio=4),
    model=MODEL, frames_first=True, text_masks=False,
)
#: What ``cogvideox_tiny`` changes of ``cogvideox1.5_5b``: the same classes and token layout at tiny widths.
COGVIDEOX_TINY_CHANGES: dict[str, Any] = dict(
    name="cogvideox_tiny",
    description="CogVideoX1.5's classes (CogVideoXTransformer3DModel, AutoencoderKLCogVideoX, a T5 encoder) with tiny "
    "widths, the real token layout (226 text tokens, patch 2 x 2 x 2) and seeded random weights: its videos are noise.",
    is_tiny=True, hub_id=None, text_dim=32, target_size=128, default_video_length=9, default_steps=8,
    default_dtype="fp32", fps=8,
    # 8 heads (a mesh of 8 devices splits them), head_dim 16: RoPE gives 4 of it to time, 6 each to height and width
    transformer=cogvideox_dit(heads=8, head_dim=16, layers=2, text_dim=32, time_embed_dim=32),
    # four levels as the real VAE (8x spatial), narrow; groups of 4 channels
    vae=dict(latent_channels=16, scaling_factor=0.7, invert_scale_latents=True, temporal_compression_ratio=4,
             block_out_channels=[16, 16, 32, 32], layers_per_block=1, norm_num_groups=4),
    # vocab 384: ByT5's byte vocabulary, so a ByT5Tokenizer (no files) tokenizes for it
    text_encoder=dict(vocab_size=384, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                      feed_forward_proj="gated-gelu"),
)

COGVIDEOX_15_5B = Preset(**COGVIDEOX_15_5B_FIELDS)
COGVIDEOX_TINY = dataclasses.replace(COGVIDEOX_15_5B, **COGVIDEOX_TINY_CHANGES)
#: CogVideoX1.5's presets: ``cogvideox1.5_5b`` and its tiny twin ``cogvideox_tiny``.
PRESETS: tuple[Preset, ...] = (COGVIDEOX_15_5B, COGVIDEOX_TINY)
