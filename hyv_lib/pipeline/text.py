"""Stage-1 text encoding with diffusers' own HunyuanVideo-1.5 recipe (Qwen2.5-VL template + ByT5 glyphs); CogVideoX's T5."""

from __future__ import annotations

import inspect
import logging
from typing import Any

import torch

from ..base.cogvideox_presets import COGVIDEOX_MODEL
from ..base.errors import HyvInputError
from ..base.presets import Preset
from ..models.components import IMAGE_COMPONENTS, torch_dtype
from .cogvideox import encode_t5_pair
from .encoder_device import module_device, on_device
from .image import encode_image

logger = logging.getLogger(__name__)


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


def _kept(span: tuple[int, int], length: int, window: int, side: str) -> int:
    """Tokens of ``span`` [start, end) left when a sequence of ``length`` is truncated to ``window`` on ``side``."""
    first, last = (0, min(window, length)) if side != "left" else (max(0, length - window), length)
    return max(0, min(span[1], last) - max(span[0], first))


def _plain_cut(tokenizer, text: str, max_length: int) -> tuple[int, int]:
    """(dropped, own) tokens of ``text`` tokenized with special tokens and truncated to ``max_length`` (ByT5's glyph
    text, T5's prompt): its own tokens are counted without the special ones (the EOS that truncation keeps)."""
    own = len(tokenizer(text, add_special_tokens=False).input_ids)
    full = len(tokenizer(text, add_special_tokens=True).input_ids)
    return own - min(own, max(0, max_length - (full - own))), own


def _cuts(components: dict[str, Any], preset: Preset, prompts: dict[str, str]) -> dict[str, tuple[int, int, int, str]]:
    """For each ``prompts`` key (``prompt``, ``negative_prompt``): ``{key}_tokens_dropped`` and, for HunyuanVideo-1.5,
    ``{key}_quoted_tokens_dropped`` -> (dropped, total, what the encoder reads, its name)."""
    tokenizer = components["tokenizer"]
    out = {}
    if preset.model == COGVIDEOX_MODEL:  # T5: the prompt, padded and truncated to text_len with its EOS
        for key, text in prompts.items():
            out[f"{key}_tokens_dropped"] = (*_plain_cut(tokenizer, text, preset.text_len), preset.text_len,
                                            "the text encoder")
        return out
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
        out[f"{key}_tokens_dropped"] = (own - _kept((prefix, prefix + own), length, window, side), own,
                                        preset.text_len, "the text encoder")
        glyphs = extract_glyph_texts(text)  # ByT5 encodes the quoted text only (None: nothing quoted)
        cut = (0, 0) if glyphs is None else _plain_cut(components["tokenizer_2"], glyphs, preset.byt5_len)
        out[f"{key}_quoted_tokens_dropped"] = (*cut, preset.byt5_len, "ByT5")
    return out


def tokens_dropped(components: dict[str, Any], preset: Preset, prompt: str, negative_prompt: str = "",
                   warn: bool = False) -> dict[str, int]:
    """How many of the prompt's own tokens the text encoder never sees, as generation_config.json records them:
    ``prompt_tokens_dropped`` and ``negative_prompt_tokens_dropped`` (0 when all fit), and for HunyuanVideo-1.5
    ``prompt_quoted_tokens_dropped`` and ``negative_prompt_quoted_tokens_dropped`` (ByT5's glyph text: the quoted
    parts, each written as ``Text "..."``, cut to ``byt5_len``). Counted honestly: each text is tokenized as the encoder
    tokenizes it (HunyuanVideo-1.5: inside the chat template, whose own tokens before and after the prompt are not
    counted), without truncation, and compared with what the truncation to the preset's length keeps (``text_len``
    after the template's ``crop_start``; T5 and ByT5: their length less the EOS). ``warn=True``: one warning line on
    the ``hyv_lib`` logger per text that was cut, e.g. ``prompt: 9,812 of 10,800 tokens dropped (the text encoder
    reads 1000; ...)``."""
    cuts = _cuts(components, preset, {"prompt": prompt, "negative_prompt": negative_prompt})
    for key, (dropped, total, reads, encoder) in cuts.items():
        if warn and dropped:
            what = key[: -len("_tokens_dropped")].replace("_quoted", "'s quoted text").replace("_", " ")
            logger.warning("%s: %s of %s tokens dropped (%s reads %d; only the first %s are encoded: shorten it)",
                           what, f"{dropped:,}", f"{total:,}", encoder, reads, f"{total - dropped:,}")
    return {key: cut[0] for key, cut in cuts.items()}


@torch.no_grad()
def encode_prompts(components: dict, preset: Preset, prompts: list[str], device: torch.device | None = None,
                   release: bool = False) -> dict[str, torch.Tensor]:
    """Encode prompts (batch) into the four stage-1 tensors with diffusers' recipe.

    Qwen2.5-VL: chat template with the system prompt, padded to crop + text_len, hidden_states[-3],
    template tokens cropped; ByT5: only quoted text is encoded, zeros + mask 0 when there is none.
    Returns ``prompt_embeds`` [B,text_len,text_dim], ``prompt_embeds_mask`` [B,text_len] (int64),
    ``prompt_embeds_2`` [B,byt5_len,byt5_dim], ``prompt_embeds_mask_2`` [B,byt5_len] (int64).

    ``device`` (None: each encoder runs where it is, and so are the tensors returned): each encoder runs there, one
    at a time, and leaves it after its call (:func:`hyv_lib.pipeline.encoder_device.on_device`; ``release=True``
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


def encode_pair(components: dict[str, Any], preset: Preset, prompt: str, negative_prompt: str = "",
                dtype: str = "fp32", image=None, argument: str = "--image_path", device: torch.device | None = None,
                release: bool = False) -> dict[str, torch.Tensor]:
    """The stage-1 tensors of a prompt and its negative prompt (one text-encoder batch [negative, positive]):
    ``prompt_embeds``, ``prompt_embeds_mask``, ``prompt_embeds_2``, ``prompt_embeds_mask_2`` and their
    ``negative_`` twins, batch 1 each, floats in ``dtype``. With ``image`` (a first frame already cropped to its
    bucket, :func:`hyv_lib.pipeline.image.crop_to_bucket`) also ``image_embeds`` (in ``dtype``) and ``cond_latents`` (fp32),
    which need SigLIP and the VAE in ``components`` (a HyvInputError naming ``argument`` otherwise). CogVideoX:
    T5's ``prompt_embeds`` and ``negative_prompt_embeds`` (:func:`hyv_lib.pipeline.cogvideox.encode_t5_pair`).

    ``device`` (e.g. :func:`hyv_lib.pipeline.encoder_device.resolve_text_device`'s; None: every encoder runs where
    it is): each encoder is moved there for its own call, one at a time, and leaves it right after (back where it was,
    or dropped with ``release=True``: components loaded for this call only); a GPU's cache is emptied after each, so
    the transformer has the card, and the tensors come back on the host CPU, in the dtypes above. Encoders already
    on ``device`` stay there (the in-memory pipeline's, when nothing is offloaded). A prompt (or negative prompt, or
    its quoted text) longer than its encoder reads is cut there: one warning line each says how many of its tokens
    were dropped (:func:`tokens_dropped`)."""
    tokens_dropped(components, preset, prompt, negative_prompt, warn=True)
    if preset.model == COGVIDEOX_MODEL:  # T5 alone: prompt_embeds and negative_prompt_embeds, no masks, no image
        if image is not None:
            raise HyvInputError(argument, f"{preset.name} is text-to-video: it takes no image")
        return encode_t5_pair(components, preset, prompt, negative_prompt, dtype, device=device, release=release)
    if image is not None:
        missing = [n for n in (*IMAGE_COMPONENTS, "vae") if n not in components]
        if missing:
            raise HyvInputError(argument, f"encoding a first frame needs {', '.join(missing)}; load the components "
                                          "of a preset that takes an image")
    encoded = encode_prompts(components, preset, [negative_prompt, prompt], device=device, release=release)
    tensors = {}
    for index, prefix in ((0, "negative_"), (1, "")):
        for name, value in encoded.items():
            value = value[index : index + 1]
            tensors[prefix + name] = value.to(torch_dtype(dtype)) if value.is_floating_point() else value
    if image is not None:
        frame = encode_image(components, preset, image, device=device, release=release)
        tensors.update(image_embeds=frame["image_embeds"].to(torch_dtype(dtype)), cond_latents=frame["cond_latents"])
    return tensors
