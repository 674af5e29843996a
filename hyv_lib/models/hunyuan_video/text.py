"""HunyuanVideo's stage-1 text by HunyuanVideoPipeline's recipe: Llama in its template, cropped; CLIP pooled."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from ...base.presets import Preset
from ..devices import module_device, on_device
from ..truncation import kept, plain_cut
from .presets import CLIP_TOKENS

#: The Llama hidden states the recipe reads: ``hidden_states[-(skip + 1)]`` (HunyuanVideoPipeline's default skip).
HIDDEN_LAYERS_TO_SKIP = 2


def prompt_template(preset: Preset, tokenizer) -> dict[str, Any]:
    """The pipeline's prompt template (its system text around ``{}``) with the crop: ``preset.crop_start`` (95 for the
    real Llama-3 tokenizer, diffusers' own value) or, for a tokenizer without one, :func:`template_crop_start`."""
    from diffusers.pipelines.hunyuan_video.pipeline_hunyuan_video import DEFAULT_PROMPT_TEMPLATE

    crop = preset.crop_start if preset.crop_start is not None else template_crop_start(tokenizer)
    return {"template": DEFAULT_PROMPT_TEMPLATE["template"], "crop_start": crop}


def _template_parts() -> tuple[str, str]:
    from diffusers.pipelines.hunyuan_video.pipeline_hunyuan_video import DEFAULT_PROMPT_TEMPLATE

    before, after = DEFAULT_PROMPT_TEMPLATE["template"].split("{}")
    return before, after


def template_crop_start(tokenizer) -> int:
    """Tokens before the user's text in the tokenized template (its BOS included): what the recipe crops away."""
    return len(tokenizer(_template_parts()[0]).input_ids)


def _host(components: dict[str, Any], device: torch.device | None) -> SimpleNamespace:
    """The attributes HunyuanVideoPipeline's encoder methods read from ``self``."""
    return SimpleNamespace(tokenizer=components["tokenizer"], text_encoder=components["text_encoder"],
                           tokenizer_2=components["tokenizer_2"], text_encoder_2=components["text_encoder_2"],
                           _execution_device=device)


@torch.no_grad()
def encode_prompts(components: dict[str, Any], preset: Preset, prompts: list[str],
                   device: torch.device | None = None, release: bool = False) -> dict[str, torch.Tensor]:
    """The stage-1 text tensors of ``prompts`` by HunyuanVideoPipeline's own ``_get_llama_prompt_embeds`` and
    ``_get_clip_prompt_embeds`` (what its ``encode_prompt`` calls): ``prompt_embeds`` [B, text_len, D] (Llama's
    third-last hidden states of each prompt in the template, padded to crop + text_len, the template cropped away),
    ``prompt_embeds_mask`` [B, text_len] (int64, valid tokens first) and ``pooled_prompt_embeds`` [B, D_clip]
    (CLIP's pooled output of the prompt in 77 tokens), each in its encoder's dtype. ``device`` (None: each encoder
    where it is, the tensors too): each encoder runs there for its call and leaves after
    (:func:`hyv_lib.models.devices.on_device`, ``release`` as there); the tensors come back on the host CPU."""
    from diffusers import HunyuanVideoPipeline

    text_encoder, text_encoder_2 = components["text_encoder"], components["text_encoder_2"]
    template = prompt_template(preset, components["tokenizer"])
    with on_device(text_encoder, device, release):
        where = module_device(text_encoder)
        embeds, mask = HunyuanVideoPipeline._get_llama_prompt_embeds(
            _host(components, where), list(prompts), template, device=where, dtype=text_encoder.dtype,
            max_sequence_length=preset.text_len, num_hidden_layers_to_skip=HIDDEN_LAYERS_TO_SKIP)
        if device is not None:
            embeds, mask = embeds.cpu(), mask.cpu()
    with on_device(text_encoder_2, device, release):
        where = module_device(text_encoder_2)
        pooled = HunyuanVideoPipeline._get_clip_prompt_embeds(
            _host(components, where), list(prompts), device=where, dtype=text_encoder_2.dtype,
            max_sequence_length=CLIP_TOKENS)
        if device is not None:
            pooled = pooled.cpu()
    return {"prompt_embeds": embeds, "prompt_embeds_mask": mask.to(torch.int64), "pooled_prompt_embeds": pooled}


def prompt_cuts(components: dict[str, Any], preset: Preset,
                prompts: dict[str, str]) -> dict[str, tuple[int, int, int, str]]:
    """For each ``prompts`` key (``prompt``, ``negative_prompt``): ``{key}_tokens_dropped`` (Llama, in the template:
    its own tokens before and after the prompt not counted, the window ``text_len`` after the crop) and
    ``{key}_clip_tokens_dropped`` (CLIP's 77 tokens, its start and end tokens not counted) -> (dropped, the text's
    own tokens, what the encoder reads, its name)."""
    tokenizer = components["tokenizer"]
    before, after = _template_parts()
    prefix = len(tokenizer(before).input_ids)
    suffix = len(tokenizer(after, add_special_tokens=False).input_ids)
    crop = prompt_template(preset, tokenizer)["crop_start"]
    window = preset.text_len + crop  # what the recipe tokenizes (max_length), before the crop
    side = getattr(tokenizer, "truncation_side", "right")
    out = {}
    for key, text in prompts.items():
        length = len(tokenizer(before + text + after).input_ids)  # untruncated
        own = length - prefix - suffix
        out[f"{key}_tokens_dropped"] = (own - kept((prefix, prefix + own), length, window, side), own,
                                        preset.text_len, "the text encoder")
        out[f"{key}_clip_tokens_dropped"] = (*plain_cut(components["tokenizer_2"], text, CLIP_TOKENS), CLIP_TOKENS,
                                             "CLIP")
    return out
