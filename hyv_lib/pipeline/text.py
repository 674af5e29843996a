"""Stage-1 text encoding of a prompt pair by the preset's model family, and what its encoders cut from a prompt."""

from __future__ import annotations

import logging
from typing import Any

import torch

from ..base.errors import HyvInputError
from ..base.presets import Preset
from ..models.dtypes import torch_dtype
from ..models.families import family_for

logger = logging.getLogger(__name__)


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
    cuts = family_for(preset).tokens_cut(components, preset, {"prompt": prompt, "negative_prompt": negative_prompt})
    for key, (dropped, total, reads, encoder) in cuts.items():
        if warn and dropped:
            what = key[: -len("_tokens_dropped")].replace("_quoted", "'s quoted text").replace("_", " ")
            logger.warning("%s: %s of %s tokens dropped (%s reads %d; only the first %s are encoded: shorten it)",
                           what, f"{dropped:,}", f"{total:,}", encoder, reads, f"{total - dropped:,}")
    return {key: cut[0] for key, cut in cuts.items()}


@torch.no_grad()
def encode_prompts(components: dict, preset: Preset, prompts: list[str], device: torch.device | None = None,
                   release: bool = False) -> dict[str, torch.Tensor]:
    """The stage-1 text tensors of a batch of ``prompts`` by the preset's family
    (:meth:`hyv_lib.models.family.ModelFamily.encode_texts`; HunyuanVideo-1.5:
    :func:`hyv_lib.models.hunyuan_video15.text.encode_prompts`, CogVideoX: :func:`hyv_lib.models.cogvideox.recipe.encode_t5`).
    ``device`` and ``release`` as there."""
    return family_for(preset).encode_texts(components, preset, prompts, device=device, release=release)


def encode_pair(components: dict[str, Any], preset: Preset, prompt: str, negative_prompt: str = "",
                dtype: str = "fp32", image=None, argument: str = "image_path", device: torch.device | None = None,
                release: bool = False) -> dict[str, torch.Tensor]:
    """The stage-1 tensors of a prompt and its negative prompt (one text-encoder batch [negative, positive],
    :func:`encode_prompts`), each text tensor twice: as named and with a ``negative_`` prefix, batch 1 each, floats in
    ``dtype`` (HunyuanVideo-1.5: ``prompt_embeds``, ``prompt_embeds_mask``, ``prompt_embeds_2``,
    ``prompt_embeds_mask_2``; CogVideoX: T5's ``prompt_embeds``). With ``image`` (a first frame already cropped to its
    bucket, :func:`hyv_lib.pipeline.image.crop_to_bucket`) also the family's image tensors (HunyuanVideo-1.5:
    ``image_embeds`` in ``dtype`` and ``cond_latents`` in fp32), which need its image components (SigLIP and the VAE)
    in ``components``; a HyvInputError naming ``argument`` otherwise, or for a text-to-video model.

    ``device`` (e.g. :func:`hyv_lib.pipeline.encoder_device.resolve_text_device`'s; None: every encoder runs where
    it is): each encoder is moved there for its own call, one at a time, and leaves it right after (back where it was,
    or dropped with ``release=True``: components loaded for this call only); a GPU's cache is emptied after each, so
    the transformer has the card, and the tensors come back on the host CPU, in the dtypes above. Encoders already
    on ``device`` stay there (the in-memory pipeline's, when nothing is offloaded). A prompt (or negative prompt, or
    its quoted text) longer than its encoder reads is cut there: one warning line each says how many of its tokens
    were dropped (:func:`tokens_dropped`)."""
    tokens_dropped(components, preset, prompt, negative_prompt, warn=True)
    family = family_for(preset)
    if image is not None:
        if not family.takes_image:
            raise HyvInputError(argument, f"{preset.name} is text-to-video: it takes no image")
        missing = [n for n in family.image_components if n not in components]
        if missing:
            raise HyvInputError(argument, f"encoding a first frame needs {', '.join(missing)}; load the components "
                                          "of a preset that takes an image")
    # a text encoder that reads the first frame reads it with the prompt (the negative prompt: without)
    frames = {"images": [None, image]} if image is not None and family.texts_read_image else {}
    encoded = family.encode_texts(components, preset, [negative_prompt, prompt], device=device, release=release,
                                  **frames)
    tensors = {}
    for index, prefix in ((0, "negative_"), (1, "")):
        for name, value in encoded.items():
            value = value[index : index + 1]
            tensors[prefix + name] = value.to(torch_dtype(dtype)) if value.is_floating_point() else value
    if image is not None:
        tensors.update(family.encode_image(components, preset, image, device=device, release=release, dtype=dtype))
    return tensors
