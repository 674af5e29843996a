"""The top-level glue of diffusers' HunyuanVideo-1.5 forward, written once for the TPU, Ulysses and DeepCache runtimes.

``HunyuanVideo15Transformer3DModel.forward`` is not jittable as is (it decides t2v vs i2v from the data and reorders
the context tokens with boolean masks); the runtimes split it into a prompt-only part decided in Python
(:func:`context_layout`) and static-shaped pieces (:func:`embed_context`, :func:`output_tokens`,
:func:`unpatchify`) around the model's own blocks and submodules. Only this module restates diffusers' glue, so it
alone must track diffusers.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch

from .layout import valid_first_order


class ContextLayout(NamedTuple):
    """The prompt-only decisions of the forward: ByT5 and image inputs (zeros with an all-padding mask where there
    were none), the image scale (0 for t2v: all-zero image embeddings are masked out), the valid-first gather order
    of the context tokens [image ; ByT5 ; text] and the reordered mask."""

    byt5: torch.Tensor
    byt5_mask: torch.Tensor
    image: torch.Tensor
    image_scale: float
    order: torch.Tensor
    context_mask: torch.Tensor


def context_layout(config, text: torch.Tensor, text_mask: torch.Tensor, byt5: torch.Tensor | None,
                   byt5_mask: torch.Tensor | None, image: torch.Tensor | None) -> ContextLayout:
    """Decide t2v vs i2v from the concrete image embeddings (a Python branch) and the valid-first order, as
    diffusers' forward does with boolean indexing; ``config`` is the model's config."""
    batch = text.shape[0]
    if byt5 is None:  # no glyph branch: zeros with an all-padding mask, as an empty ByT5 prompt
        byt5 = text.new_zeros(batch, 1, config.text_embed_2_dim)
        byt5_mask = torch.zeros(batch, 1, dtype=torch.long, device=text.device)
    if image is None:
        image = text.new_zeros(batch, 1, config.image_embed_dim)
    is_t2v = bool(torch.all(image == 0))
    image_mask = torch.full(image.shape[:2], not is_t2v, dtype=torch.bool, device=text.device)
    order, context_mask = valid_first_order(image_mask, byt5_mask, text_mask)
    return ContextLayout(byt5, byt5_mask, image, 0.0 if is_t2v else 1.0, order, context_mask)


def embed_context(model, timestep, text, text_mask, byt5, byt5_mask, image, image_scale, order) -> torch.Tensor:
    """The joint context [B, L, C] entering the first block: the text (with its token refiner), ByT5 and image
    embedders plus their type embeddings; padded ByT5 and text tokens zeroed (image tokens keep their values, as in
    diffusers), then reordered valid-first by the gather ``order``. Static-shaped: jittable."""
    cond = model.cond_type_embed.weight  # rows: 0 text, 1 ByT5, 2 image
    text = model.context_embedder(text, timestep, text_mask) + cond[0]
    byt5 = model.context_embedder_2(byt5) + cond[1]
    image = model.image_embedder(image) * image_scale + cond[2]
    keep = torch.cat([torch.ones_like(image[..., 0]), byt5_mask.to(image.dtype), text_mask.to(image.dtype)], 1)
    context = torch.cat([image, byt5, text], dim=1) * keep[..., None]
    return torch.gather(context, 1, order[..., None].expand(-1, -1, context.shape[-1]))


def output_tokens(model, video: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
    """diffusers' output layer per video token: [B, N, C] -> [B, N, C_out] (patch 1x1x1)."""
    return model.proj_out(model.norm_out(video, temb))


def unpatchify(tokens: torch.Tensor, latent_shape) -> torch.Tensor:
    """[B, T*H*W, C_out] output tokens back to [B, C_out, T, H, W] (patch 1x1x1, checked by
    :func:`hyv_lib.models.layout.check_supported`)."""
    batch, _, frames, height, width = latent_shape
    return tokens.reshape(batch, frames, height, width, -1).permute(0, 4, 1, 2, 3)


class RopeTables:
    """The model's RoPE tables (cos, sin) per latent shape (frames, height, width): computed once each in eager torch
    (``model.rope`` reads only the shape), then put where a runtime needs them by ``place(cos, sin, *extra)`` (the TPU
    runtime: to JAX; Ulysses: this rank's rows on its device). ``extra`` joins the shape in the cache key."""

    def __init__(self, model, place: Callable[..., tuple] | None = None):
        self.model, self.place, self.tables = model, place, {}

    def __call__(self, frames: int, height: int, width: int, *extra) -> tuple:
        key = (frames, height, width, *extra)
        if key not in self.tables:
            with torch.no_grad():
                cos, sin = self.model.rope(torch.zeros(()).expand(1, 1, frames, height, width))
            self.tables[key] = (cos, sin) if self.place is None else self.place(cos, sin, *extra)
        return self.tables[key]
