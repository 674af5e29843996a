"""HunyuanVideo-1.5's presets: the real 480p/720p checkpoints, the tiny random one, and hyv-tiny (480p and 720p)."""

from __future__ import annotations

import dataclasses
from typing import Any

from ...base.errors import HyvInputError
from ...base.presets import TASKS, Preset
from .adapter import HUNYUAN_VIDEO_15

# Flow shift and CFG per variant follow the official PIPELINE_CONFIGS
# (Tencent-Hunyuan/HunyuanVideo-1.5, hyvideo/commons/__init__.py): 480p shift 5, 720p t2v shift 9, 720p i2v shift 7,
# CFG 6. The step-distilled 480p I2V model (MeanFlow) runs shift 7 with CFG off (1.0) in 8 or 12 steps (official
# README, "Optimal Inference Configurations"; diffusers PR #12802 adds its config with use_meanflow=True).
# The CFG-distilled checkpoints (480p_t2v_distilled, 480p_i2v_distilled, 720p_i2v_distilled) keep their base model's
# shift (5, 5, 7) and 50 steps with CFG off (1.0): the official README's "Optimal Inference Configurations" table
# ("the cfg distilled model we provided, must use 50 steps") and diffusers'
# scripts/convert_hunyuan_video1_5_to_diffusers.py (SCHEDULER_CONFIGS / GUIDANCE_CONFIGS). 720p_t2v_distilled is listed
# there but not released (README model cards: "Coming soon"). Hub ids follow the naming of the hunyuanvideo-community
# collection the README links, HunyuanVideo-1.5-Diffusers-<version> (the distilled names as third-party code loads
# them; not checked against the hub here).

#: ``Preset.model`` of every preset here: the adapter's name.
MODEL = HUNYUAN_VIDEO_15.name


def _dit_config(latent: int, heads: int, head_dim: int, layers: int, refiner_layers: int, text_dim: int,
                byt5_dim: int, image_dim: int, rope_axes: list[int], target_size: int, task: str = "t2v",
                use_meanflow: bool = False) -> dict[str, Any]:
    """HunyuanVideo15Transformer3DModel's config: the input is latents, condition latents and a mask channel
    (2 C + 1), the output the C-channel noise; 1 x 1 x 1 patches, RMS QK-norm and RoPE theta 256 at every size."""
    return dict(in_channels=2 * latent + 1, out_channels=latent, num_attention_heads=heads, attention_head_dim=head_dim,
                num_layers=layers, num_refiner_layers=refiner_layers, mlp_ratio=4.0, patch_size=1, patch_size_t=1,
                qk_norm="rms_norm", text_embed_dim=text_dim, text_embed_2_dim=byt5_dim, image_embed_dim=image_dim,
                rope_theta=256.0, rope_axes_dim=rope_axes, target_size=target_size, task_type=task,
                use_meanflow=use_meanflow)


def _vae_config(latent: int, widths: list[int], layers_per_block: int) -> dict[str, Any]:
    """AutoencoderKLHunyuanVideo15's config: RGB in and out, 16x spatial and 4x temporal compression at every size."""
    return dict(in_channels=3, out_channels=3, latent_channels=latent, block_out_channels=widths,
                layers_per_block=layers_per_block, spatial_compression_ratio=16, temporal_compression_ratio=4,
                scaling_factor=1.03682)


def _real(name: str, target_size: int, flow_shift: float, description: str, *, task: str = "t2v",
          guidance_scale: float = 6.0, default_steps: int = 50, use_meanflow: bool = False,
          attention: str = "auto") -> Preset:
    return Preset(
        name=name, description=description, is_tiny=False,
        hub_id=f"hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-{name}",
        text_len=1000, text_dim=3584, byt5_len=256, byt5_dim=1472, image_tokens=729, image_dim=1152,
        latent_channels=32, spatial_compression=16, temporal_compression=4, target_size=target_size,
        default_video_length=121, default_steps=default_steps, flow_shift=flow_shift, guidance_scale=guidance_scale,
        fps=24, default_dtype="bf16",
        crop_start=108,  # diffusers HunyuanVideo15Pipeline.prompt_template_encode_start_idx
        transformer=_dit_config(32, heads=16, head_dim=128, layers=54, refiner_layers=2, text_dim=3584,
                                byt5_dim=1472, image_dim=1152, rope_axes=[16, 56, 56], target_size=target_size,
                                task=task, use_meanflow=use_meanflow),
        vae=_vae_config(32, [128, 256, 512, 1024, 1024], layers_per_block=2),
        tasks=(task,), attention=attention, model=MODEL,
    )


_TINY_LATENT = 8
TINY = Preset(
    name="tiny", model=MODEL,
    description="The real diffusers/transformers classes with small configs and seeded random weights (CPU, seconds).",
    is_tiny=True, hub_id=None,
    text_len=128, text_dim=32, byt5_len=32, byt5_dim=24, image_tokens=16, image_dim=16,
    latent_channels=_TINY_LATENT, spatial_compression=16, temporal_compression=4, target_size=128,
    default_video_length=9, default_steps=8, flow_shift=5.0, guidance_scale=6.0, fps=8, default_dtype="fp32",
    crop_start=None,
    transformer=_dit_config(_TINY_LATENT, heads=2, head_dim=16, layers=2, refiner_layers=1, text_dim=32, byt5_dim=24,
                            image_dim=16, rope_axes=[4, 6, 6], target_size=128),
    vae=_vae_config(_TINY_LATENT, [8, 16, 16, 32, 32], layers_per_block=1),
    # hidden_states[-3] needs >= 2 layers; mrope_section must sum to head_dim / 2 = 4.
    text_encoder=dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [2, 1, 1]},
    ),
    text_encoder_2=dict(
        vocab_size=384, d_model=24, d_kv=8, d_ff=48, num_layers=2, num_heads=3, feed_forward_proj="gated-gelu",
    ),
    tasks=TASKS,  # random weights: either task runs (the shapes are what is tested)
    # SigLIP as the real one (so400m-patch14-384: 27 x 27 = 729 tokens of width 1152), shrunk to width image_dim;
    # its image_size follows image_tokens (siglip_image_size): 32 px = 4 x 4 patches = 16 tokens here.
    image_encoder=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, patch_size=8),
)


def siglip_image_size(preset: "Preset") -> int:
    """Pixel size of the tiny SigLIP's square input for the preset's image-token count (patches^2 tokens)."""
    side = round(preset.image_tokens ** 0.5)
    if side * side != preset.image_tokens:
        raise ValueError(f"{preset.name}: image_tokens {preset.image_tokens} is not a square number of patches")
    return side * preset.image_encoder["patch_size"]


def real_layout_tiny(real: Preset) -> Preset:
    """The tiny classes (random widths of ``tiny``) with a real preset's *layout*: its text_len (1000) and ByT5 length
    (256), image-token count (729), 32 latent channels (so in_channels 65), 16x/4x VAE, scheduler shift, guidance,
    steps and buckets. Saved by ``python -m hyv_lib save_tiny --preset 720p_t2v``, it loads through
    ``--preset 720p_t2v --model_path`` exactly as the real weights do: every shape that the real preset fixes is
    real, only the widths (and so the cost) are tiny. Its videos are noise."""
    if real.is_tiny:
        raise HyvInputError("preset", f"{real.name} is already tiny; give a real preset")
    channels = real.latent_channels
    return dataclasses.replace(
        TINY, name=real.name, description=f"{real.name}'s layout with tiny widths and random weights (tests, CI)",
        text_len=real.text_len, byt5_len=real.byt5_len, image_tokens=real.image_tokens, latent_channels=channels,
        tasks=real.tasks,
        spatial_compression=real.spatial_compression, temporal_compression=real.temporal_compression,
        target_size=real.target_size, default_video_length=real.default_video_length,
        default_steps=real.default_steps, flow_shift=real.flow_shift, guidance_scale=real.guidance_scale,
        fps=real.fps, default_dtype=real.default_dtype,
        transformer=dict(TINY.transformer, in_channels=2 * channels + 1, out_channels=channels,
                         target_size=real.target_size, task_type=real.transformer["task_type"],
                         use_meanflow=real.use_meanflow),
        # The encoder averages groups of block_out[-1] / (2 x latent) channels into its shortcut: the last widths must
        # be at least twice the latent channels for it to encode (image-to-video's first frame).
        vae=dict(TINY.vae, latent_channels=channels, block_out_channels=[8, 16, 32, 2 * channels, 2 * channels],
                 spatial_compression_ratio=real.spatial_compression,
                 temporal_compression_ratio=real.temporal_compression, scaling_factor=real.vae["scaling_factor"]),
    )


#: 32 of hyv-tiny's training captions (every fourth of ``hyv_lib.tiny.data.split_combos()``'s training split, none
#: a probe caption of chapter 9's gates): its prior captions, what a fine-tune keeps (``Preset.train_defaults``).
TINY_PRIOR_CAPTIONS = (
    "a red circle moving left on a gray background",
    "a red circle moving up on a black background",
    "a red circle moving down on a purple background",
    "a red square moving right on a gray background",
    "a red square moving down on a black background",
    "a red triangle moving right on a gray background",
    "a red triangle moving up on a purple background",
    "a green circle moving left on a purple background",
    "a green circle moving up on a black background",
    "a green circle moving down on a gray background",
    "a green square moving left on a purple background",
    "a green square moving up on a purple background",
    "a green triangle moving left on a black background",
    "a green triangle moving right on a purple background",
    "a green triangle moving down on a gray background",
    "a blue circle moving right on a black background",
    "a blue circle moving down on a gray background",
    "a blue square moving right on a black background",
    "a blue square moving down on a black background",
    "a blue triangle moving left on a gray background",
    "a blue triangle moving up on a purple background",
    "a yellow circle moving left on a gray background",
    "a yellow circle moving up on a gray background",
    "a yellow circle moving down on a purple background",
    "a yellow square moving up on a gray background",
    "a yellow triangle moving left on a purple background",
    "a yellow triangle moving up on a gray background",
    "a white circle moving left on a purple background",
    "a white circle moving up on a gray background",
    "a white square moving left on a gray background",
    "a white square moving up on a black background",
    "a white square moving down on a purple background",
)


_TRAINED_LATENT = 16
# The config of hyv-tiny, the trained tiny model: tools/train_hyv_tiny.py trains it from this config,
# and its weights ship in hyv_lib/weights/hyv-tiny with the training log and the measured quality gates.
TINY_TRAINED = dataclasses.replace(
    TINY,
    name="tiny_trained",
    description="hyv-tiny: the tiny classes trained on procedural moving shapes (64x112, 9 frames; prompts like "
    "'a red circle moving left on a gray background', words from hyv_lib.base.presets.tiny_vocabulary()), from the text "
    "alone or from a first frame too (--image_path); weights bundled in hyv_lib/weights/hyv-tiny.",
    text_len=24,  # after the crop: 9 word tokens of a caption + 13 of the template's closing turn
    word_tokens=True,
    # Frozen random text encoder with larger weights: at Qwen's default init (std 0.02) its features are ~0.1 per
    # token, smaller than the bias of the DiT's text input layer, and the DiT ignored the colour word; at 0.5 a
    # 2500-step DiT probe got the colour right in 82% of held-out prompts (chapter 7 shows the scales).
    text_encoder=dict(TINY.text_encoder, initializer_range=0.5),
    byt5_len=16,  # captions quote nothing (all padding); 16 still fits a short quoted word
    image_tokens=4,  # SigLIP tokens of the first frame (16 x 16 pixels, 8 x 8 patches); t2v: zeros, masked out
    latent_channels=_TRAINED_LATENT,
    target_size=96,  # 16:9 bucket 64 x 112, the training size
    default_steps=20,
    transformer=dict(
        TINY.transformer, in_channels=2 * _TRAINED_LATENT + 1, out_channels=_TRAINED_LATENT, num_attention_heads=2,
        attention_head_dim=32, num_layers=3, rope_axes_dim=[8, 12, 12], target_size=96,
    ),
    vae=dict(TINY.vae, latent_channels=_TRAINED_LATENT, block_out_channels=[8, 16, 32, 64, 64]),
    flow_shift=3.0,  # 84 video tokens: far fewer than 720p, so less shift towards high noise
    guidance_scale=4.5,
    bundled_weights="hyv-tiny",
    # A 19 MB model learns at 30x the official 8.3B rate; the caption's path only, batches of 8 and a cosine decay
    # taught it a new direction for each of 8 training seeds (with twins of the clips; chapter 9). The prior
    # captions keep what it knows without clips of them: each batch also trains towards the frozen model's own
    # prediction for 8 of them (extract_features encodes them; chapter 9), and a caption-dropped clip towards its
    # prediction for the empty prompt, so that guidance does not push the other captions away from the new clips.
    train_defaults=dict(learning_rate=3e-3, batch_size=8, lr_schedule="cosine", lora_targets="text",
                        prior_captions=TINY_PRIOR_CAPTIONS, dropout_target="frozen"),
)

# hyv-tiny at 1280x720 (tools/train_hyv_tiny_720p.py): hyv-tiny's text encoders; its DiT re-cut to 5 x 5 latent
# patches (a 720p frame is 9 x 16 tokens, not 45 x 80: the 3-block, 64-wide DiT drew speckles on the full grid)
# and fine-tuned on 720p clips; its VAE's decoder fine-tuned on crops of 720p latents (the encoder, so the
# latents, unchanged). 720x1280 is its only size (its stride is 16 x 5 = 80 pixels, and it saw nothing else).
TINY_TRAINED_720P = dataclasses.replace(
    TINY_TRAINED,
    name="tiny_trained_720p",
    description="hyv-tiny-720p: hyv-tiny with its DiT re-cut to 5x5 latent patches and fine-tuned at 1280x720, and "
    "its VAE decoder fine-tuned there (text-to-video, 720x1280 only); weights bundled in hyv_lib/weights/hyv-tiny.",
    target_size=960,  # 16:9 bucket 720 x 1280 at an 80-pixel stride
    train_defaults={},  # hyv-tiny's were measured at 64x112 only
    transformer=dict(TINY_TRAINED.transformer, patch_size=5, target_size=960),
    flow_shift=5.0,  # as it was fine-tuned
    tasks=("t2v",),
    bundled_subfolders={"transformer": "transformer_720p", "vae": "vae_720p"},
)


#: HunyuanVideo-1.5's presets in the order ``python -m hyv_lib info`` lists them: the tiny ones (``tiny``: random
#: weights; ``tiny_trained``: the bundled hyv-tiny), then the real 480p/720p text-to-video and image-to-video settings
#: (with the step-distilled 480p I2V one, the CFG-distilled 480p T2V, 480p I2V and 720p I2V ones and the sparse ones).
PRESETS: tuple[Preset, ...] = (
    TINY,
    TINY_TRAINED,
    TINY_TRAINED_720P,
    _real("480p_t2v", 640, 5.0, "HunyuanVideo-1.5 480p text-to-video (8.3B DiT), diffusers format."),
    _real("720p_t2v", 960, 9.0, "HunyuanVideo-1.5 720p text-to-video (8.3B DiT), diffusers format."),
    _real("480p_i2v", 640, 5.0, "HunyuanVideo-1.5 480p image-to-video (8.3B DiT + SigLIP), diffusers format.",
          task="i2v"),
    _real("720p_i2v", 960, 7.0, "HunyuanVideo-1.5 720p image-to-video (8.3B DiT + SigLIP), diffusers format.",
          task="i2v"),
    _real("480p_i2v_step_distilled", 640, 7.0, "HunyuanVideo-1.5 480p image-to-video, step-distilled "
          "(MeanFlow: 8 or 12 steps, CFG off), diffusers format.", task="i2v", guidance_scale=1.0,
          default_steps=8, use_meanflow=True),
    # CFG-distilled: the base model's shift and 50 steps, CFG off (see the comment at the top of this module)
    _real("480p_t2v_distilled", 640, 5.0, "HunyuanVideo-1.5 480p text-to-video, CFG-distilled (CFG off: one "
          "sample per step, 50 steps), diffusers format.", guidance_scale=1.0),
    _real("480p_i2v_distilled", 640, 5.0, "HunyuanVideo-1.5 480p image-to-video, CFG-distilled (CFG off: one "
          "sample per step, 50 steps), diffusers format.", task="i2v", guidance_scale=1.0),
    _real("720p_i2v_distilled", 960, 7.0, "HunyuanVideo-1.5 720p image-to-video, CFG-distilled (CFG off: one "
          "sample per step, 50 steps), diffusers format.", task="i2v", guidance_scale=1.0),
    # The official's sparse transformers: CFG-distilled and trained with SSTA (hyv_lib.SstaConfig's defaults)
    _real("720p_t2v_distilled_sparse", 960, 9.0, "HunyuanVideo-1.5 720p text-to-video, CFG-distilled and trained "
          "with SSTA sparse attention (--attention ssta by default; CFG off, 50 steps).", guidance_scale=1.0,
          attention="ssta"),
    _real("720p_i2v_distilled_sparse", 960, 7.0, "HunyuanVideo-1.5 720p image-to-video, CFG-distilled and "
          "trained with SSTA sparse attention (--attention ssta by default; CFG off, 50 steps).", task="i2v",
          guidance_scale=1.0, attention="ssta"),
)
