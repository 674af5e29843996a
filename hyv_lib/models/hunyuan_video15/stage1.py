"""HunyuanVideo-1.5's stage-1 file: the text tensors its stage 1 writes (and a first frame's), checked on load."""

from __future__ import annotations

import os

import torch

from ...base.errors import HyvInputError
from ..stage_tensors import FLOATS, INTS, require_finite

EMBEDS = ("prompt_embeds", "prompt_embeds_2")  #: Qwen2.5-VL's and ByT5's embeddings
MASKS = ("prompt_embeds_mask", "prompt_embeds_mask_2")  #: their masks
#: The 8 text tensors: the embeddings and masks of the prompt, then of the negative prompt.
STAGE1_NAMES = tuple(p + n for p in ("", "negative_") for n in ("prompt_embeds", "prompt_embeds_mask",
                                                                 "prompt_embeds_2", "prompt_embeds_mask_2"))
#: Image-to-video adds the first frame's SigLIP tokens [1, N, D] and VAE latents [1, C, 1, h, w].
IMAGE_NAMES = ("image_embeds", "cond_latents")


def check_stage1(tensors: dict[str, torch.Tensor], path: str) -> None:
    """HyvInputError naming ``input_dir`` unless ``tensors`` (read from ``path``) are exactly the 8 text names (plus
    both image names for image-to-video), ranks 3/2, float embeds, integer/bool masks, batch 1, masks as long as
    their embeddings, each negative tensor shaped as its positive one, and no NaN or infinite value."""
    file = os.path.basename(path)
    expected = set(STAGE1_NAMES) | (set(IMAGE_NAMES) if set(IMAGE_NAMES) & set(tensors) else set())
    if set(tensors) != expected:
        missing = sorted(expected - set(tensors))
        extra = sorted(set(tensors) - expected)
        raise HyvInputError("input_dir", f"{file} must hold exactly {', '.join(STAGE1_NAMES)} (and "
                                         f"{' and '.join(IMAGE_NAMES)} for image-to-video); missing "
                                         f"{missing or 'none'}, unexpected {extra or 'none'}")
    for name, rank, layout in (("image_embeds", 3, "[1, N, D]"), ("cond_latents", 5, "[1, C, 1, h, w]")):
        value = tensors.get(name)
        if value is not None and (value.ndim != rank or value.shape[0] != 1 or value.dtype not in FLOATS
                                  or (rank == 5 and value.shape[2] != 1)):
            raise HyvInputError("input_dir", f"{file}: {name} must be a float tensor {layout}, got "
                                             f"{value.dtype} {list(value.shape)}")
    for prefix in ("", "negative_"):
        for embeds_name, mask_name in zip(EMBEDS, MASKS):
            embeds, mask = tensors[prefix + embeds_name], tensors[prefix + mask_name]
            if embeds.ndim != 3 or embeds.dtype not in FLOATS:
                raise HyvInputError("input_dir", f"{file}: {prefix + embeds_name} must be a float tensor "
                                                 f"[1, L, D], got {embeds.dtype} {list(embeds.shape)}")
            if mask.ndim != 2 or mask.dtype not in INTS:
                raise HyvInputError("input_dir", f"{file}: {prefix + mask_name} must be an integer or bool "
                                                 f"tensor [1, L], got {mask.dtype} {list(mask.shape)}")
            if embeds.shape[0] != 1 or mask.shape != embeds.shape[:2]:
                raise HyvInputError("input_dir", f"{file}: {prefix + mask_name} {list(mask.shape)} does not "
                                                 f"match {prefix + embeds_name} {list(embeds.shape)} (batch must be 1)")
    for name in STAGE1_NAMES[4:]:  # the negative_* tensors must match their positive counterparts
        if tensors[name].shape != tensors[name.removeprefix("negative_")].shape:
            raise HyvInputError("input_dir", f"{file}: {name} and its positive counterpart differ in shape")
    for name, value in tensors.items():
        require_finite(path, name, value, "rerun stage1")
