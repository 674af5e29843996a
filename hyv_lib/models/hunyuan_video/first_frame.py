"""HunyuanVideo-I2V's first frame by HunyuanVideoImageToVideoPipeline's recipe: LLaVA's prompt with it, its latents."""

from __future__ import annotations

import importlib
from types import SimpleNamespace
from typing import Any

import torch

from ...base.errors import HyvInputError
from ...base.presets import Preset
from ..devices import module_device, on_device
from ..truncation import kept, plain_cut
from .components import IMAGE_TOKEN, i2v_pipeline_class
from .presets import CLIP_TOKENS, I2V_ASSISTANT_TOKENS, I2V_INTERLEAVE, i2v_text_tokens, llava_image_tokens
from .text import HIDDEN_LAYERS_TO_SKIP

#: The (width, height) of the black frame read with prompts given no frame at all (any size reads the same).
BLACK_SIZE = (64, 64)
#: The pipeline's ``image_embed_interleave`` for each ``image_condition_type`` (``__call__``'s default rule).
INTERLEAVE = {"latent_concat": I2V_INTERLEAVE, "token_replace": 4}


def default_template() -> dict[str, Any]:
    """HunyuanVideoImageToVideoPipeline's ``DEFAULT_PROMPT_TEMPLATE`` (its module imported quietly:
    :func:`~hyv_lib.models.hunyuan_video.components.i2v_pipeline_class`)."""
    return importlib.import_module(i2v_pipeline_class().__module__).DEFAULT_PROMPT_TEMPLATE


def _template_parts() -> tuple[str, str]:
    before, after = default_template()["template"].split("{}")
    return before, after


def prompt_template(preset: Preset, tokenizer) -> dict[str, Any]:
    """The pipeline's image-to-video prompt template: diffusers' own (crop 103, the image at tokens 5 to 581, 576
    image tokens) with the crop ``preset.crop_start``; for a tokenizer without one (a tiny preset, ``crop_start``
    None) the same template with its crop (the tokens before the user's text, ``<image>`` one of them), the image
    token's place in it and the preset's :func:`~hyv_lib.models.hunyuan_video.presets.llava_image_tokens`."""
    if preset.crop_start is not None:
        return {**default_template(), "crop_start": preset.crop_start}
    ids = tokenizer(_template_parts()[0]).input_ids
    start, length = ids.index(tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)), llava_image_tokens(preset)
    return {"template": default_template()["template"], "crop_start": len(ids), "image_emb_start": start,
            "image_emb_end": start + length, "image_emb_len": length}


def interleave(preset: Preset) -> int:
    """The pipeline's ``image_embed_interleave`` for the preset's transformer (:data:`INTERLEAVE`, else 1)."""
    return INTERLEAVE.get(preset.transformer.get("image_condition_type"), 1)


def check_llava(preset: Preset, text_encoder) -> None:
    """HyvInputError naming ``model_path`` unless ``text_encoder`` is a LLaVA whose vision tower gives the preset's
    image tokens (the text-to-video folder's Llama cannot read a first frame)."""
    config = getattr(text_encoder, "config", None)
    vision = getattr(config, "vision_config", None)
    if vision is None:
        raise HyvInputError("model_path", f"{preset.name} reads the first frame with LLaVA, but the folder's "
                                          f"text_encoder is a {type(text_encoder).__name__}: use the image-to-video "
                                          "checkpoint's folder (HunyuanVideoImageToVideoPipeline's layout)")
    tokens = (vision.image_size // vision.patch_size) ** 2 + (config.vision_feature_select_strategy == "full")
    if tokens != llava_image_tokens(preset):
        raise HyvInputError("model_path", f"the folder's LLaVA gives {tokens} image tokens, {preset.name} expects "
                                          f"{llava_image_tokens(preset)}")


def _host(components: dict[str, Any], device: torch.device | None) -> SimpleNamespace:
    """The attributes HunyuanVideoImageToVideoPipeline's encoder methods read from ``self``."""
    return SimpleNamespace(tokenizer=components["tokenizer"], text_encoder=components["text_encoder"],
                           image_processor=components["image_processor"], tokenizer_2=components["tokenizer_2"],
                           text_encoder_2=components["text_encoder_2"], _execution_device=device)


@torch.no_grad()
def encode_prompts(components: dict[str, Any], preset: Preset, prompts: list[str], images: list,
                   device: torch.device | None = None, release: bool = False) -> dict[str, torch.Tensor]:
    """The stage-1 text tensors of ``prompts``, each read with its first frame in ``images`` (a PIL image; None: the
    black frame the pipeline gives a negative prompt; all None: black frames, what a feature folder's empty prompt
    is read with), by HunyuanVideoImageToVideoPipeline's own ``_get_llama_prompt_embeds`` and
    ``_get_clip_prompt_embeds`` (what its ``encode_prompt`` calls, one prompt and image a call, as the pipeline runs
    them): ``prompt_embeds`` [B, text_len, D] (LLaVA's third-last hidden states:
    the image's tokens, every :func:`interleave`-th, then the prompt's after the template's crop, the assistant
    header cut), ``prompt_embeds_mask`` [B, text_len] (int64) and ``pooled_prompt_embeds`` [B, D_clip] (CLIP's pooled
    output of the prompt alone). ``device`` and ``release`` as in
    :func:`hyv_lib.models.hunyuan_video.text.encode_prompts`.
    HyvInputError naming ``images`` unless they are one per prompt. A black frame has the first given frame's size
    (else :data:`BLACK_SIZE`): LLaVA's image processor resizes it to its own, one constant image whatever the size."""
    from PIL import Image

    if images is None or len(images) != len(prompts):
        raise HyvInputError("images", f"{preset.name}'s text encoder (LLaVA) reads each prompt with its first frame: "
                                      f"give one image a prompt, None for a black one ({len(prompts)} prompts, "
                                      f"{len(images or ())} images)")
    size = next((image.size for image in images if image is not None), BLACK_SIZE)
    images = [Image.new("RGB", size, 0) if image is None else image for image in images]
    text_encoder, text_encoder_2 = components["text_encoder"], components["text_encoder_2"]
    check_llava(preset, text_encoder)
    template = prompt_template(preset, components["tokenizer"])
    pipeline = i2v_pipeline_class()
    with on_device(text_encoder, device, release):
        where = module_device(text_encoder)
        host = _host(components, where)
        pairs = [pipeline._get_llama_prompt_embeds(
            host, image, [prompt], template, device=where, dtype=text_encoder.dtype,
            max_sequence_length=i2v_text_tokens(preset), num_hidden_layers_to_skip=HIDDEN_LAYERS_TO_SKIP,
            image_embed_interleave=interleave(preset)) for prompt, image in zip(prompts, images)]
        embeds, mask = torch.cat([e for e, _ in pairs]).cpu(), torch.cat([m for _, m in pairs]).cpu()
    with on_device(text_encoder_2, device, release):
        where = module_device(text_encoder_2)
        pooled = pipeline._get_clip_prompt_embeds(_host(components, where), list(prompts), device=where,
                                                  dtype=text_encoder_2.dtype, max_sequence_length=CLIP_TOKENS).cpu()
    if embeds.shape[1] != preset.text_len:
        raise HyvInputError("model_path", f"the text encoder gave {embeds.shape[1]} tokens, {preset.name} expects "
                                          f"{preset.text_len}")
    return {"prompt_embeds": embeds, "prompt_embeds_mask": mask.to(torch.int64), "pooled_prompt_embeds": pooled}


@torch.no_grad()
def encode_image(components: dict[str, Any], preset: Preset, image, device: torch.device | None = None,
                 release: bool = False) -> dict[str, torch.Tensor]:
    """``cond_latents`` [1, C, 1, h, w] (fp32, on the host CPU): the first frame (already cropped to its bucket:
    :meth:`hyv_lib.models.family.ModelFamily.crop_frame`, which the pipeline's resize to that size leaves as it is)
    through the pipeline's own ``video_processor.preprocess`` and ``prepare_latents`` (the VAE latents' mode times its
    scaling factor, one latent frame: what the loop mixes in and concatenates). ``device`` and ``release`` as in
    :func:`encode_prompts`."""
    from diffusers.video_processor import VideoProcessor

    vae = components["vae"]
    width, height = image.size
    with on_device(vae, device, release):
        where = module_device(vae)
        host = SimpleNamespace(vae=vae, vae_scaling_factor=vae.config.scaling_factor,
                               vae_scale_factor_temporal=vae.temporal_compression_ratio,
                               vae_scale_factor_spatial=vae.spatial_compression_ratio)
        pixels = VideoProcessor(vae_scale_factor=host.vae_scale_factor_spatial).preprocess(image, height, width)
        shape = (1, preset.latent_channels, 1, height // host.vae_scale_factor_spatial,
                 width // host.vae_scale_factor_spatial)
        _, latents = i2v_pipeline_class().prepare_latents(
            host, pixels.to(where, vae.dtype), 1, preset.latent_channels, height, width, 1, torch.float32, where,
            latents=torch.zeros(shape, device=where), image_condition_type=preset.transformer["image_condition_type"])
    return {"cond_latents": latents.float().cpu()}


def prompt_cuts(components: dict[str, Any], preset: Preset,
                prompts: dict[str, str]) -> dict[str, tuple[int, int, int, str]]:
    """:func:`hyv_lib.models.hunyuan_video.text.prompt_cuts` for the image-to-video template: the prompt's own tokens
    (``<image>`` and the template's tokens around it not counted) that reach the embeddings, the pipeline's window
    being :func:`~hyv_lib.models.hunyuan_video.presets.i2v_text_tokens` after the crop. A prompt that pushes the
    assistant header out of the window loses its last :data:`~hyv_lib.models.hunyuan_video.presets.I2V_ASSISTANT_TOKENS`
    kept tokens too (the pipeline then cuts the window's last 4 as that header), so the encoder reads 252 of the
    prompt's tokens at most (32 tiny); CLIP's 77 as there."""
    tokenizer = components["tokenizer"]
    before, after = _template_parts()
    prefix = len(tokenizer(before).input_ids)
    suffix = len(tokenizer(after, add_special_tokens=False).input_ids)
    window = i2v_text_tokens(preset) + prompt_template(preset, tokenizer)["crop_start"]  # what the pipeline reads
    side = getattr(tokenizer, "truncation_side", "right")
    reads = i2v_text_tokens(preset) - I2V_ASSISTANT_TOKENS
    out = {}
    for key, text in prompts.items():
        length = len(tokenizer(before + text + after).input_ids)
        own = length - prefix - suffix
        left = kept((prefix, prefix + own), length, window, side)
        if side != "left" and prefix + own + I2V_ASSISTANT_TOKENS > window:  # the header's end is cut off
            left -= max(0, min(window, prefix + own) - max(window - I2V_ASSISTANT_TOKENS, prefix))
        out[f"{key}_tokens_dropped"] = (own - left, own, reads, "the text encoder")
        out[f"{key}_clip_tokens_dropped"] = (*plain_cut(components["tokenizer_2"], text, CLIP_TOKENS), CLIP_TOKENS,
                                             "CLIP")
    return out
