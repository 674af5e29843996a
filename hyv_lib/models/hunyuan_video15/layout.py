"""Token layout of the joint sequence [video ; image ; ByT5 ; text]: sizes and the valid-first reorder as a gather."""

from __future__ import annotations

import torch

from ...base.presets import Preset


def video_tokens(preset: Preset, height: int, width: int, video_length: int) -> int:
    """Video tokens of one sample: latent frames x latent height x latent width (patch size 1)."""
    _, _, t, h, w = preset.latent_shape(height, width, video_length)
    return t * h * w


def context_tokens(preset: Preset) -> int:
    """Context tokens after the reorder: image + ByT5 + text (729 + 256 + 1000 = 1985 for the real model)."""
    return preset.image_tokens + preset.byt5_len + preset.text_len


def joint_sequence_length(preset: Preset, height: int, width: int, video_length: int) -> int:
    """S of the joint attention: video tokens followed by all (valid-first) context tokens."""
    return video_tokens(preset, height, width, video_length) + context_tokens(preset)


def dense_mask_bytes(preset: Preset, height: int, width: int, video_length: int, batch: int = 2) -> int:
    """Bytes of the [B, 1, S, S] boolean mask diffusers' processor builds in every block (CFG: B = 2)."""
    s = joint_sequence_length(preset, height, width, video_length)
    return batch * s * s


def valid_first_order(*masks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Gather indices that put valid tokens first, as diffusers' boolean-index reorder does.

    ``masks`` are [B, L_k] masks of the sources in concatenation order (image, ByT5, text). Returns
    ``order`` [B, sum L_k] with ``reordered = torch.cat(sources, 1).gather(1, order[..., None].expand(...))``
    and the reordered mask. A stable sort keeps [valid image, valid ByT5, valid text, invalid image,
    invalid ByT5, invalid text]: the same layout, but static-shaped and jittable (no boolean indexing).
    """
    valid = torch.cat([m.bool() for m in masks], dim=1)
    order = torch.argsort((~valid).to(torch.int8), dim=1, stable=True)
    return order, valid.gather(1, order)
