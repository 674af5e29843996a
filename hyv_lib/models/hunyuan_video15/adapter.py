"""HunyuanVideo-1.5's model adapter: the top-level glue of diffusers' forward, restated once for every runtime.

``HunyuanVideo15Transformer3DModel.forward`` is not jittable as is (it decides t2v vs i2v from the data and reorders
the context tokens with boolean masks); the runtimes split it into a prompt-only part decided in Python
(:func:`context_layout`) and static-shaped pieces (:func:`embed_context`, :func:`output_tokens`,
:func:`unpatchify`) around the model's own blocks and submodules, served to the runtimes as
:data:`HUNYUAN_VIDEO_15`, a :class:`hyv_lib.models.adapter.ModelAdapter`. Only this module restates diffusers' glue,
so it alone must track diffusers.
"""

from __future__ import annotations

from typing import Any, Mapping, NamedTuple

import torch
import torch.nn.functional as F

from ...parallel.sharding import tensor_parallel_rule_sets
from ..adapter import ModelAdapter
from .layout import context_tokens, valid_first_order
from .processors import TokenGrid, use_attention


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
    :meth:`HunyuanVideo15Adapter.check`)."""
    batch, _, frames, height, width = latent_shape
    return tokens.reshape(batch, frames, height, width, -1).permute(0, 4, 1, 2, 3)


#: HunyuanVideo-1.5's weight-placement rule sets (``--sharding``), over diffusers' parameter names: Q/K/V of both
#: streams and the first MLP layers column-parallel; the attention outputs and second MLP layers row-parallel.
RULE_SETS = tensor_parallel_rule_sets(
    r"transformer_blocks\.\d+\.",
    column={"attn_qkv": r"attn\.(to_q|to_k|to_v|add_q_proj|add_k_proj|add_v_proj)\.(weight|bias)",
            "mlp_in": r"(ff|ff_context)\.net\.0\.proj\.(weight|bias)"},
    row={"attn_out": r"attn\.(to_out\.0|to_add_out)\.weight",
         "mlp_out": r"(ff|ff_context)\.net\.2\.weight"})


#: HunyuanVideo-1.5's LoRA target groups (``train --lora_targets``), over diffusers' module names: ``attn`` the Q/K/V
#: and output projections of both streams (8 per block, hyv_lib's default); ``mlp`` the two layers of the video and
#: text feed-forwards ``ff``/``ff_context`` (4 per block: ``attn,mlp`` is MindSpeed-MM's I2V recipe, whose "single
#: blocks" diffusers' 1.5 transformer does not have); ``all`` every ``nn.Linear`` of the transformer, what the official
#: train.py adapts by default (peft's ``"all-linear"``): the blocks' layers with their AdaLN modulations
#: ``norm1(_context).linear``, and outside the blocks the text embedder and its token refiner, the ByT5 and image
#: embedders, the timestep embedding and the output head ``norm_out.linear``/``proj_out`` (the patch embedding is a
#: Conv3d: no LoRA); ``text`` the caption's path only: the text embedder (``proj_in``, the token refiner, the pooled
#: text's ``text_embedder``), the ByT5 mapping ``context_embedder_2`` and in each block the text stream's layers
#: (``norm1_context.linear``, ``add_q/k/v_proj``, ``to_add_out``, ``ff_context``). A ``text`` adapter reaches the video
#: tokens only through the caption: the text tokens they attend to in joint attention and the pooled text's
#: modulation; the video stream's own layers stay as trained (chapter 9's motion sweep).
LORA_TARGETS = {
    "attn": r"transformer_blocks\.\d+\.attn\.(to_q|to_k|to_v|to_out\.0|add_q_proj|add_k_proj|add_v_proj|to_add_out)",
    "mlp": r"transformer_blocks\.\d+\.(ff|ff_context)\.net\.(0\.proj|2)",
    "text": (r"context_embedder\.(proj_in|token_refiner\..+|time_text_embed\.text_embedder\..+)|context_embedder_2\..+"
             r"|transformer_blocks\.\d+\.(norm1_context\.linear|attn\.(add_q_proj|add_k_proj|add_v_proj|to_add_out)"
             r"|ff_context\.net\.(0\.proj|2))"),
    "all": r".+",
}


#: HunyuanVideo15TokenRefiner is built with its default mlp_ratio, not the model's.
REFINER_MLP_RATIO = 4.0


class HunyuanVideo15Adapter(ModelAdapter):
    """``HunyuanVideo15Transformer3DModel`` piece by piece: latents [B, C, T, H, W] with a 1x1x1 patch, the joint
    context [image ; ByT5 ; text] reordered valid-first, dual-stream blocks called
    ``block(video, context, temb, context_mask, (cos, sin))``, MeanFlow's optional ``timestep_r``."""

    name = "hunyuanvideo-1.5"
    model_classes = ("HunyuanVideo15Transformer3DModel",)
    layout_keys = ("in_channels", "out_channels", "patch_size", "patch_size_t", "target_size", "task_type",
                   "use_meanflow")
    conditioning = ("encoder_hidden_states", "encoder_attention_mask", "encoder_hidden_states_2",
                    "encoder_attention_mask_2", "image_embeds")
    block_keys = ("context_mask",)
    rule_sets = RULE_SETS
    block_prefix = "transformer_blocks."
    lora_targets = LORA_TARGETS
    runs_ssta = True
    vae_memory_model = True
    vae_class = "AutoencoderKLHunyuanVideo15"

    def video_grid(self, model, video_tokens: int) -> tuple[int, int, int]:
        """The grid :class:`hyv_lib.models.hunyuan_video15.processors.TokenGrid` recorded from the RoPE module's
        input."""
        return TokenGrid.of(model).current(video_tokens)

    def context_tokens(self, preset) -> int:
        """Image + ByT5 + text, after the valid-first reorder (:func:`hyv_lib.models.hunyuan_video15.layout.context_tokens`:
        729 + 256 + 1000 = 1985 for the real model)."""
        return context_tokens(preset)

    def cost_dims(self, config: Mapping[str, Any]) -> dict[str, int]:
        """Dual-stream blocks (``streams`` 2), a token refiner whose MLP is built at its default ratio 4 (not the
        model's ``mlp_ratio``), ByT5 and image embedders; the time embedding is ``hidden`` wide."""
        hidden = config["num_attention_heads"] * config["attention_head_dim"]
        return dict(heads=config["num_attention_heads"], head_dim=config["attention_head_dim"], hidden=hidden,
                    mlp=int(hidden * config["mlp_ratio"]), refiner_mlp=int(hidden * REFINER_MLP_RATIO),
                    layers=config["num_layers"], refiner_layers=config["num_refiner_layers"],
                    patch=config["patch_size"], patch_t=config["patch_size_t"], in_channels=config["in_channels"],
                    out_channels=config["out_channels"], text_dim=config["text_embed_dim"],
                    byt5_dim=config["text_embed_2_dim"], image_dim=config["image_embed_dim"], time_dim=hidden,
                    streams=2)

    def example_inputs(self, preset, height: int, width: int, video_length: int, batch: int = 2,
                       dtype: torch.dtype = torch.bfloat16, text_tokens: int = 120) -> dict[str, torch.Tensor]:
        """A CFG batch, t2v, ``text_tokens`` valid text tokens, no ByT5 text; MeanFlow presets also get
        ``timestep_r``, a traced input of their step. The masks fix the (data, not program) token order."""
        _, c, t, h, w = preset.latent_shape(height, width, video_length)

        def mask(length: int, valid: int) -> torch.Tensor:
            return (torch.arange(length)[None] < valid).long().repeat(batch, 1)

        meanflow = {"timestep_r": torch.full((batch,), 800.0)} if preset.transformer.get("use_meanflow") else {}
        return dict(hidden_states=torch.zeros(batch, 2 * c + 1, t, h, w, dtype=dtype),
                    timestep=torch.full((batch,), 900.0),
                    encoder_hidden_states=torch.zeros(batch, preset.text_len, preset.text_dim, dtype=dtype),
                    encoder_attention_mask=mask(preset.text_len, min(text_tokens, preset.text_len)),
                    encoder_hidden_states_2=torch.zeros(batch, preset.byt5_len, preset.byt5_dim, dtype=dtype),
                    encoder_attention_mask_2=mask(preset.byt5_len, 0),
                    image_embeds=torch.zeros(batch, preset.image_tokens, preset.image_dim, dtype=dtype), **meanflow)

    def check(self, model, who: str) -> None:
        """The restated forward assumes a 1x1x1 patch (one token per latent pixel, as in every HunyuanVideo-1.5
        checkpoint); anything else is a clear error."""
        config = model.config
        if config.patch_size != 1 or config.patch_size_t != 1:
            raise ValueError(f"{who} supports patch size 1x1x1 (every HunyuanVideo-1.5 checkpoint)")

    def check_timestep_r(self, model, timestep_r) -> None:
        """``timestep_r`` needs a MeanFlow model (``use_meanflow=True``): diffusers' forward would fail on others with
        a TypeError deep inside its time embedding, so say which argument is wrong instead."""
        if timestep_r is not None and not model.config.use_meanflow:
            raise ValueError("timestep_r is only for step-distilled (MeanFlow) models, whose transformer config has "
                             "use_meanflow=True; this model has use_meanflow=False: pass timestep_r=None")

    def blocks(self, model) -> torch.nn.ModuleList:
        return model.transformer_blocks

    def use_attention(self, model, backend: str = "auto", **options: Any) -> int:
        return use_attention(model, backend, **options)

    def note_latent_shape(self, model, latent_shape) -> None:
        """SSTA's processors read the token grid of the step being run (installed by ``use_attention``)."""
        grid = getattr(model, "hyv_token_grid", None)
        if grid is not None:
            grid.record_shape(latent_shape)

    def prepare(self, model, encoder_hidden_states, encoder_attention_mask, encoder_hidden_states_2=None,
                encoder_attention_mask_2=None, image_embeds=None) -> dict[str, torch.Tensor]:
        """The text, ByT5 and image inputs in the model's dtype (zeros with an all-padding mask where absent), the
        image scale (0-d), the valid-first gather ``order`` and the reordered ``context_mask``."""
        dtype = next(model.parameters()).dtype
        layout = context_layout(model.config, encoder_hidden_states, encoder_attention_mask, encoder_hidden_states_2,
                                encoder_attention_mask_2, image_embeds)
        return {"text_states": encoder_hidden_states.to(dtype), "text_mask": encoder_attention_mask.long(),
                "byt5_states": layout.byt5.to(dtype), "byt5_mask": layout.byt5_mask.long(),
                "image_embeds": layout.image.to(dtype),
                "image_scale": torch.tensor(layout.image_scale, dtype=dtype, device=encoder_hidden_states.device),
                "order": layout.order, "context_mask": layout.context_mask}

    def time_embedding(self, model, timestep, timestep_r=None) -> torch.Tensor:
        return model.time_embed(timestep, timestep_r=timestep_r)  # MeanFlow: plus timestep_r's embedding

    def embed_video(self, model, latents, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """Patch 1x1x1: ``x_embedder`` is a per-token linear map, so a token range is embedded as a [B, C, n, 1, 1]
        volume of its (row-major) latent pixels; tokens past the end are zeros (Ulysses' padding)."""
        if start == 0 and stop is None:
            return model.x_embedder(latents)
        flat = latents.flatten(2)
        flat = F.pad(flat, (0, max(0, stop - flat.shape[-1])))[..., start:stop]
        return model.x_embedder(flat[..., None, None])

    def embed_context(self, model, timestep, prepared) -> torch.Tensor:
        p = prepared
        return embed_context(model, timestep, p["text_states"], p["text_mask"], p["byt5_states"], p["byt5_mask"],
                             p["image_embeds"], p["image_scale"], p["order"])

    def run_block(self, block, video, context, temb, inputs, rope) -> tuple:
        return block(video, context, temb, inputs["context_mask"], rope)

    def block_call(self, args: tuple, kwargs: dict) -> tuple:
        video, context, temb, mask, rope = args
        return video, context, temb, {"context_mask": mask}, rope

    def rope(self, model, latent_shape) -> tuple[torch.Tensor, ...]:
        """(cos, sin), one row per video token: ``model.rope`` reads only the latents' shape."""
        return model.rope(torch.zeros(()).expand(1, 1, *latent_shape[2:]))

    def output_tokens(self, model, video, temb) -> torch.Tensor:
        return output_tokens(model, video, temb)

    def unpatchify(self, tokens, latent_shape) -> torch.Tensor:
        return unpatchify(tokens, latent_shape)


#: The HunyuanVideo-1.5 adapter (found for the model class by :func:`hyv_lib.models.registry.adapter_for`).
HUNYUAN_VIDEO_15 = HunyuanVideo15Adapter()
