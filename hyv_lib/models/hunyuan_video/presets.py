"""HunyuanVideo's presets (the 13B text-to-video and latent-concat image-to-video checkpoints, a tiny twin of each)."""

from __future__ import annotations

import dataclasses
from typing import Any

from ...base.presets import Preset
from .adapter import HUNYUAN_VIDEO

# Where the real numbers come from (diffusers 0.42, the version this module is tested with):
# * the transformer configs: diffusers' scripts/convert_hunyuan_video_to_diffusers.py, TRANSFORMER_CONFIGS
#   "HYVideo-T/2-cfgdistill" (text-to-video: 16 channels in and out, 24 heads x 128, 20 dual-stream + 40 single-stream
#   blocks, 2 refiner blocks, MLP ratio 4, patch 1 x 2 x 2, RMS QK-norm, guidance embedding, Llama text 4096 wide,
#   CLIP pooled 768 wide, RoPE theta 256 over axes (16, 56, 56)) and "HYVideo-T/2-I2V-33ch" (the same with
#   in_channels 16 * 2 + 1, image_condition_type "latent_concat", guidance_embeds False); they are also
#   HunyuanVideoTransformer3DModel's own defaults (models/transformers/transformer_hunyuan_video.py).
# * the scheduler: the conversion script's FlowMatchEulerDiscreteScheduler(shift=args.flow_shift), default 7.0.
# * the VAE: AutoencoderKLHunyuanVideo's defaults (16 latent channels, scaling factor 0.476986, 8x spatial and 4x
#   temporal compression), which the conversion script builds with no arguments.
# * sampling: HunyuanVideoPipeline.__call__'s defaults: 720 x 1280, 129 frames, 50 steps, embedded guidance 6.0
#   (``guidance_scale``, fed to the guidance embedding x 1000; no CFG batch, ``true_cfg_scale`` 1), text
#   ``max_sequence_length`` 256 Llama tokens after the template's crop_start 95 (DEFAULT_PROMPT_TEMPLATE), CLIP
#   77 tokens; fps 15 is the pipeline docstring's export_to_video example.
# * image-to-video: HunyuanVideoImageToVideoPipeline: its DEFAULT_PROMPT_TEMPLATE (crop_start 103, 576 image tokens
#   of the LLaVA image at image_embed_interleave 2 for latent_concat -> 288), max_sequence_length 256 less the 4
#   assistant-header tokens it cuts -> 252 text tokens, 540 in all; its docstring's example runs the 33-channel
#   checkpoint (hunyuanvideo-community/HunyuanVideo-I2V-33ch) with guidance_scale 1 and true_cfg_scale 1.

#: ``Preset.model`` of every HunyuanVideo preset: the adapter's name.
MODEL = HUNYUAN_VIDEO.name
#: The CLIP text encoder's token window (HunyuanVideoPipeline.encode_prompt's ``max_sequence_length=77`` for CLIP).
CLIP_TOKENS = 77
#: HunyuanVideoImageToVideoPipeline's image tokens (LLaVA's 576 CLIP patches), its interleave for latent_concat (it
#: keeps every second image token) and the assistant-header tokens it cuts from the text.
I2V_IMAGE_TOKENS, I2V_INTERLEAVE, I2V_ASSISTANT_TOKENS = 576, 2, 4
#: The tiny LLaVA's vision tower: 32 x 32 pixels in 8 x 8 patches -> 16 image tokens (8 after the interleave).
TINY_VISION = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, image_size=32,
                   patch_size=8)
#: The tiny image-to-video text window: the pipeline's ``max_sequence_length`` (256 for the real model).
TINY_I2V_TEXT_TOKENS = 36


def hunyuanvideo_dit(heads: int, head_dim: int, layers: int, single_layers: int, refiner_layers: int,
                     text_dim: int, pooled_dim: int, rope_axes_dim: tuple[int, int, int], *, in_channels: int = 16,
                     guidance_embeds: bool = True, image_condition_type: str | None = None,
                     mlp_ratio: float = 4.0) -> dict[str, Any]:
    """HunyuanVideoTransformer3DModel's config: patch 1 x 2 x 2, 16 output channels, RMS QK-norm, RoPE theta 256;
    the widths, depths and the task's keys vary."""
    return dict(in_channels=in_channels, out_channels=16, num_attention_heads=heads, attention_head_dim=head_dim,
                num_layers=layers, num_single_layers=single_layers, num_refiner_layers=refiner_layers,
                mlp_ratio=mlp_ratio, patch_size=2, patch_size_t=1, qk_norm="rms_norm",
                guidance_embeds=guidance_embeds, text_embed_dim=text_dim, pooled_projection_dim=pooled_dim,
                rope_theta=256.0, rope_axes_dim=list(rope_axes_dim),  # a list, as the saved config.json has it
                image_condition_type=image_condition_type)


#: ``Preset`` fields of ``hunyuanvideo_t2v`` (real weights from a diffusers-format folder).
HUNYUANVIDEO_T2V_FIELDS: dict[str, Any] = dict(
    name="hunyuanvideo_t2v",
    description="HunyuanVideo (13B, Dec 2024) text-to-video: 20 dual- + 40 single-stream blocks, Llama-3 (LLaVA) "
    "+ CLIP text, embedded (guidance-distilled) guidance, diffusers format.",
    is_tiny=False, hub_id="hunyuanvideo-community/HunyuanVideo",
    text_len=256, text_dim=4096, byt5_len=0, byt5_dim=0, image_tokens=0, image_dim=0,
    latent_channels=16, spatial_compression=8, temporal_compression=4,
    target_size=960,  # its 16:9 bucket at stride 16 (8x VAE x 2 x 2 patch) is 720 x 1280, the pipeline's default
    default_video_length=129, default_steps=50, flow_shift=7.0,
    guidance_scale=6.0,  # embedded guidance (the guidance embedding), one sample per step: not CFG
    fps=15, default_dtype="bf16", crop_start=95,
    transformer=hunyuanvideo_dit(heads=24, head_dim=128, layers=20, single_layers=40, refiner_layers=2,
                                 text_dim=4096, pooled_dim=768, rope_axes_dim=(16, 56, 56)),
    vae=dict(latent_channels=16, scaling_factor=0.476986, spatial_compression_ratio=8, temporal_compression_ratio=4),
    model=MODEL, tasks=("t2v",), text_masks=True, guidance_embedded=True,
)

#: What ``hunyuanvideo_i2v`` changes: the 33-channel latent-concat transformer, LLaVA's image tokens in the text.
HUNYUANVIDEO_I2V_CHANGES: dict[str, Any] = dict(
    name="hunyuanvideo_i2v",
    description="HunyuanVideo-I2V (33-channel latent concat: noise, first-frame latents, frame mask), LLaVA "
    "image tokens in the text, no guidance embedding, diffusers format.",
    hub_id="hunyuanvideo-community/HunyuanVideo-I2V-33ch",
    text_len=I2V_IMAGE_TOKENS // I2V_INTERLEAVE + 256 - I2V_ASSISTANT_TOKENS,  # 288 image + 252 text tokens
    guidance_scale=1.0, guidance_embedded=False, crop_start=103, tasks=("i2v",),
    transformer=hunyuanvideo_dit(heads=24, head_dim=128, layers=20, single_layers=40, refiner_layers=2,
                                 text_dim=4096, pooled_dim=768, rope_axes_dim=(16, 56, 56), in_channels=33,
                                 guidance_embeds=False, image_condition_type="latent_concat"),
)

#: What ``hunyuanvideo_tiny`` changes of ``hunyuanvideo_t2v``: the same classes and token layout at tiny widths.
HUNYUANVIDEO_TINY_CHANGES: dict[str, Any] = dict(
    name="hunyuanvideo_tiny",
    description="HunyuanVideo's classes (HunyuanVideoTransformer3DModel with dual- and single-stream blocks, "
    "AutoencoderKLHunyuanVideo, a Llama and a CLIP text encoder) at tiny widths with seeded random weights: its "
    "videos are noise.",
    is_tiny=True, hub_id=None, text_len=32, text_dim=32, target_size=128, default_video_length=9, default_steps=6,
    default_dtype="fp32", fps=8,
    crop_start=None,  # the tiny byte-level tokenizer's own count of the template's tokens
    # 8 heads (a mesh of 8 devices splits them) x 8: RoPE gives 2 to time, 2 to height and 4 to width
    transformer=hunyuanvideo_dit(heads=8, head_dim=8, layers=2, single_layers=2, refiner_layers=1, text_dim=32,
                                 pooled_dim=16, rope_axes_dim=(2, 2, 4)),
    # four levels as the real VAE (8x spatial, 4x temporal), narrow; groups of 4 channels
    vae=dict(latent_channels=16, scaling_factor=0.476986, spatial_compression_ratio=8, temporal_compression_ratio=4,
             block_out_channels=(8, 8, 16, 16), layers_per_block=1, norm_num_groups=4),
    # LlamaModel: hidden_states[-3] is what the recipe reads (num_hidden_layers_to_skip 2), so 3 layers at least
    text_encoder=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=2048),
    # CLIPTextModel: its pooled output is hidden_size wide = the transformer's pooled_projection_dim
    text_encoder_2=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                        max_position_embeddings=CLIP_TOKENS),
)

#: What ``hunyuanvideo_i2v_tiny`` changes of ``hunyuanvideo_tiny``: the image-to-video layout (33 channels, no
#: guidance embedding) and a tiny LLaVA (a CLIP vision tower before the tiny Llama) reading the first frame.
HUNYUANVIDEO_I2V_TINY_CHANGES: dict[str, Any] = dict(
    name="hunyuanvideo_i2v_tiny",
    description="HunyuanVideo-I2V's classes (the 33-channel latent-concat HunyuanVideoTransformer3DModel, "
    "AutoencoderKLHunyuanVideo, a LlavaForConditionalGeneration with a CLIP vision tower and a Llama, a CLIP text "
    "encoder, CLIP's image processor) at tiny widths with seeded random weights: its videos are noise.",
    tasks=("i2v",), guidance_scale=1.0, guidance_embedded=False,
    # 16 image tokens kept every second (8) + the text window less the 4 assistant-header tokens (32)
    text_len=-(-((TINY_VISION["image_size"] // TINY_VISION["patch_size"]) ** 2) // I2V_INTERLEAVE)
    + TINY_I2V_TEXT_TOKENS - I2V_ASSISTANT_TOKENS,
    transformer=hunyuanvideo_dit(heads=8, head_dim=8, layers=2, single_layers=2, refiner_layers=1, text_dim=32,
                                 pooled_dim=16, rope_axes_dim=(2, 2, 4), in_channels=33, guidance_embeds=False,
                                 image_condition_type="latent_concat"),
    image_encoder=TINY_VISION,
)

HUNYUANVIDEO_T2V = Preset(**HUNYUANVIDEO_T2V_FIELDS)
HUNYUANVIDEO_I2V = dataclasses.replace(HUNYUANVIDEO_T2V, **HUNYUANVIDEO_I2V_CHANGES)
HUNYUANVIDEO_TINY = dataclasses.replace(HUNYUANVIDEO_T2V, **HUNYUANVIDEO_TINY_CHANGES)
HUNYUANVIDEO_I2V_TINY = dataclasses.replace(HUNYUANVIDEO_TINY, **HUNYUANVIDEO_I2V_TINY_CHANGES)
#: HunyuanVideo's presets: text-to-video, latent-concat image-to-video and the tiny twin of each.
PRESETS: tuple[Preset, ...] = (HUNYUANVIDEO_T2V, HUNYUANVIDEO_I2V, HUNYUANVIDEO_TINY, HUNYUANVIDEO_I2V_TINY)


def llava_image_tokens(preset: Preset) -> int:
    """The image tokens LLaVA puts in the prompt of an image-to-video preset: one per patch of its vision tower
    (CLS dropped, LLaVA's ``vision_feature_select_strategy`` "default"): 576 for the real model's CLIP ViT-L/14 at
    336 px, ``image_size`` / ``patch_size`` squared for a tiny one."""
    vision = preset.image_encoder
    return I2V_IMAGE_TOKENS if vision is None else (vision["image_size"] // vision["patch_size"]) ** 2


def i2v_text_tokens(preset: Preset) -> int:
    """HunyuanVideoImageToVideoPipeline's ``max_sequence_length`` for an image-to-video preset: ``text_len`` less the
    image tokens it keeps (every :data:`I2V_INTERLEAVE`-th) plus the :data:`I2V_ASSISTANT_TOKENS` it cuts (256 for
    the real model's 540)."""
    return preset.text_len - -(-llava_image_tokens(preset) // I2V_INTERLEAVE) + I2V_ASSISTANT_TOKENS


def real_layout_tiny(preset: Preset) -> Preset:
    """The tiny widths of :data:`HUNYUANVIDEO_TINY` (an image-to-video preset: :data:`HUNYUANVIDEO_I2V_TINY`'s, its
    tiny LLaVA too) with ``preset``'s layout (channels, task, guidance embedding): what ``save_tiny`` writes for a
    real preset."""
    if preset.is_tiny:
        return preset
    tiny = HUNYUANVIDEO_I2V_TINY if "i2v" in preset.tasks else HUNYUANVIDEO_TINY
    layout = {k: preset.transformer[k] for k in ("in_channels", "guidance_embeds", "image_condition_type")}
    return dataclasses.replace(tiny, name=f"{preset.name}_tiny_layout", tasks=preset.tasks,
                               guidance_scale=preset.guidance_scale, guidance_embedded=preset.guidance_embedded,
                               transformer={**tiny.transformer, **layout})
