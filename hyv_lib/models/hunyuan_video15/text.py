"""HunyuanVideo-1.5's stage-1 text encoding with diffusers' own recipe: Qwen2.5-VL in its chat template, ByT5 glyphs."""

from __future__ import annotations

import inspect
from typing import Any

import torch

from ...base.presets import Preset
from ..devices import module_device, on_device
from ..truncation import kept, plain_cut


def _recipe_defaults() -> dict:
    # The system prompt and crop index are defaults of diffusers' static encoder function; reading them
    # from its signature keeps this module identical to the pipeline without copying the text.
    from diffusers import HunyuanVideo15Pipeline

    params = inspect.signature(HunyuanVideo15Pipeline._get_mllm_prompt_embeds).parameters
    return {name: params[name].default for name in ("system_message", "crop_start", "num_hidden_layers_to_skip")}


def system_message() -> str:
    """The system prompt HunyuanVideo-1.5 wraps every prompt in (diffusers' default)."""
    return _recipe_defaults()["system_message"]


def template_crop_start(tokenizer, system: str | None = None) -> int:
    """Number of chat-template tokens before the user's text: what the recipe crops away.

    Computed by rendering the template around a marker prompt. For the real Qwen2.5-VL tokenizer
    diffusers hard-codes this as 108; the tiny byte-level tokenizer needs its own value.
    """
    from diffusers.pipelines.hunyuan_video1_5.pipeline_hunyuan_video1_5 import format_text_input

    system = system_message() if system is None else system
    marker = "\u2603"  # a character no template contains
    conversation = format_text_input([marker], system)[0]
    text = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
    prefix = text[: text.index(marker)]
    return len(tokenizer(prefix, add_special_tokens=False).input_ids)


def _template_suffix(tokenizer, system: str | None = None) -> int:
    """Number of chat-template tokens after the user's text (end of turn, the assistant's generation prompt)."""
    from diffusers.pipelines.hunyuan_video1_5.pipeline_hunyuan_video1_5 import format_text_input

    system = system_message() if system is None else system
    marker = "\u2603"
    conversation = format_text_input([marker], system)[0]
    text = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
    return len(tokenizer(text[text.index(marker) + len(marker):], add_special_tokens=False).input_ids)


def prompt_cuts(components: dict[str, Any], preset: Preset,
                prompts: dict[str, str]) -> dict[str, tuple[int, int, int, str]]:
    """For each ``prompts`` key (``prompt``, ``negative_prompt``): ``{key}_tokens_dropped`` (Qwen2.5-VL, inside the
    chat template, whose own tokens before and after the prompt are not counted; ``text_len`` after the template's
    ``crop_start``) and ``{key}_quoted_tokens_dropped`` (ByT5's glyph text: the quoted parts, cut to ``byt5_len``)
    -> (dropped, total, what the encoder reads, its name)."""
    tokenizer = components["tokenizer"]
    out = {}
    from diffusers.pipelines.hunyuan_video1_5.pipeline_hunyuan_video1_5 import extract_glyph_texts, format_text_input

    system = _recipe_defaults()["system_message"]
    prefix, suffix = template_crop_start(tokenizer, system), _template_suffix(tokenizer, system)
    crop = preset.crop_start if preset.crop_start is not None else prefix
    window = preset.text_len + crop  # what the recipe tokenizes (max_length), before the crop
    side = getattr(tokenizer, "truncation_side", "right")
    for key, text in prompts.items():
        conversation = format_text_input([text], system)  # "" becomes " ", as the recipe encodes it
        length = len(tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=True,
                                                   return_dict=True)["input_ids"][0])  # untruncated
        own = length - prefix - suffix
        out[f"{key}_tokens_dropped"] = (own - kept((prefix, prefix + own), length, window, side), own,
                                        preset.text_len, "the text encoder")
        glyphs = extract_glyph_texts(text)  # ByT5 encodes the quoted text only (None: nothing quoted)
        cut = (0, 0) if glyphs is None else plain_cut(components["tokenizer_2"], glyphs, preset.byt5_len)
        out[f"{key}_quoted_tokens_dropped"] = (*cut, preset.byt5_len, "ByT5")
    return out




@torch.no_grad()
def encode_prompts(components: dict, preset: Preset, prompts: list[str], device: torch.device | None = None,
                   release: bool = False) -> dict[str, torch.Tensor]:
    """Encode prompts (batch) into the four stage-1 tensors with diffusers' recipe.

    Qwen2.5-VL: chat template with the system prompt, padded to crop + text_len, hidden_states[-3],
    template tokens cropped; ByT5: only quoted text is encoded, zeros + mask 0 when there is none.
    Returns ``prompt_embeds`` [B,text_len,text_dim], ``prompt_embeds_mask`` [B,text_len] (int64),
    ``prompt_embeds_2`` [B,byt5_len,byt5_dim], ``prompt_embeds_mask_2`` [B,byt5_len] (int64).

    ``device`` (None: each encoder runs where it is, and so are the tensors returned): each encoder runs there, one
    at a time, and leaves it after its call (:func:`hyv_lib.models.devices.on_device`; ``release=True``
    drops the weights of encoders loaded for this call only); the tensors come back on the host CPU.
    """
    from diffusers import HunyuanVideo15Pipeline

    defaults = _recipe_defaults()
    tokenizer, text_encoder = components["tokenizer"], components["text_encoder"]
    crop = preset.crop_start if preset.crop_start is not None else template_crop_start(tokenizer)
    with on_device(text_encoder, device, release):
        embeds, mask = HunyuanVideo15Pipeline._get_mllm_prompt_embeds(
            text_encoder=text_encoder,
            tokenizer=tokenizer,
            prompt=prompts,
            device=text_encoder.device,
            tokenizer_max_length=preset.text_len,
            num_hidden_layers_to_skip=defaults["num_hidden_layers_to_skip"],
            system_message=defaults["system_message"],
            crop_start=crop,
        )
        if device is not None:  # to the host before the encoder leaves the device
            embeds, mask = embeds.cpu(), mask.cpu()
    text_encoder_2 = components["text_encoder_2"]
    with on_device(text_encoder_2, device, release):
        embeds_2, mask_2 = HunyuanVideo15Pipeline._get_byt5_prompt_embeds(
            tokenizer=components["tokenizer_2"],
            text_encoder=text_encoder_2,
            prompt=prompts,
            device=text_encoder.device if device is None else module_device(text_encoder_2),  # None: as before
            tokenizer_max_length=preset.byt5_len,
        )
        if device is not None:
            embeds_2, mask_2 = embeds_2.cpu(), mask_2.cpu()
    return {
        "prompt_embeds": embeds,
        "prompt_embeds_mask": mask.to(torch.int64),
        "prompt_embeds_2": embeds_2.to(embeds.dtype),
        "prompt_embeds_mask_2": mask_2.to(torch.int64),
    }
