"""CogVideoX's model adapter (CogVideoX1.5 first, 1.0 with RoPE too): diffusers' forward as pieces for every runtime."""

from __future__ import annotations

import math
from typing import Any, Mapping

import torch
import torch.nn.functional as F

from ...parallel.sharding import tensor_parallel_rule_sets
from ..adapter import ModelAdapter
from .processor import SharedProjectionsView, use_attention

#: The spatial patch of every CogVideoX checkpoint (2b, 5b, 1.5-5b); :meth:`CogVideoXAdapter.check` refuses others,
#: since :meth:`~CogVideoXAdapter.unpatchify` reads it from here (it is given the tokens and the latent shape only).
PATCH = 2

#: CogVideoX's weight-placement rule sets (``--sharding``), over diffusers' parameter names: the joint attention's
#: Q/K/V (one set for text and video) and the MLP's first layer column-parallel; the attention output and the MLP's
#: second layer row-parallel. Six matrices per block.
RULE_SETS = tensor_parallel_rule_sets(
    r"transformer_blocks\.\d+\.",
    column={"attn_qkv": r"attn1\.(to_q|to_k|to_v)\.(weight|bias)", "mlp_in": r"ff\.net\.0\.proj\.(weight|bias)"},
    row={"attn_out": r"attn1\.to_out\.0\.weight", "mlp_out": r"ff\.net\.2\.weight"})


#: CogVideoX's LoRA target groups (``train --lora_targets``): ``attn`` the joint attention's Q/K/V and output (4 per
#: block: one set for text and video), ``mlp`` the feed-forward's two layers (2 per block), ``all`` every ``nn.Linear``
#: (with the blocks' AdaLN ``norm1``/``norm2`` modulations, the patch and text embeddings, the timestep embedding and
#: the output head).
LORA_TARGETS = {
    "attn": r"transformer_blocks\.\d+\.attn1\.(to_q|to_k|to_v|to_out\.0)",
    "mlp": r"transformer_blocks\.\d+\.ff\.net\.(0\.proj|2)",
    "all": r".+",
}


def video_tokens(latent_shape: tuple[int, ...], config: Mapping[str, Any]) -> tuple[int, int, int]:
    """(frames, height, width) of the video token grid for latents [B, F, C, H, W] (``config``: the transformer's):
    ``F / patch_size_t`` rounded up (CogVideoX1.5; 1.0 has no temporal patch) and ``H, W / patch_size``."""
    _, frames, _, height, width = latent_shape
    p, p_t = config["patch_size"], config.get("patch_size_t")
    return (frames if p_t is None else -(-frames // p_t)), height // p, width // p


def latent_frames(config: Mapping[str, Any], video_length: int, temporal_compression: int = 4) -> int:
    """Latent frames of a ``video_length``-frame video as CogVideoXPipeline makes them: ``(L - 1) / 4 + 1``, padded
    up to a multiple of ``patch_size_t`` (81 frames: 21 -> 22; the pipeline drops the extra first frame after
    denoising)."""
    frames = (video_length - 1) // temporal_compression + 1
    p_t = config.get("patch_size_t")
    return frames if p_t is None else -(-frames // p_t) * p_t


def rotary_tables(config: Mapping[str, Any], latent_shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) [N, head_dim], one row per video token, as CogVideoXPipeline's
    ``_prepare_rotary_positional_embeddings`` makes them for latents [B, F, C, H, W]: its pixel grid divided by the
    VAE's 8x is the latent grid, so the token grid is ``H, W / patch_size``. CogVideoX1.5 (``patch_size_t``): the
    "slice" grid of a ``sample_height x sample_width`` latent canvas; 1.0: the "linspace" grid of its crop region."""
    from diffusers.models.embeddings import get_3d_rotary_pos_embed

    frames, grid_h, grid_w = video_tokens(latent_shape, config)
    p = config["patch_size"]
    base_h, base_w = config["sample_height"] // p, config["sample_width"] // p
    if config.get("patch_size_t") is None:
        from diffusers.pipelines.cogvideo.pipeline_cogvideox import get_resize_crop_region_for_grid

        crops = get_resize_crop_region_for_grid((grid_h, grid_w), base_w, base_h)
        return get_3d_rotary_pos_embed(embed_dim=config["attention_head_dim"], crops_coords=crops,
                                       grid_size=(grid_h, grid_w), temporal_size=frames)
    return get_3d_rotary_pos_embed(embed_dim=config["attention_head_dim"], crops_coords=None,
                                   grid_size=(grid_h, grid_w), temporal_size=frames, grid_type="slice",
                                   max_size=(base_h, base_w))


def patches(latents: torch.Tensor, patch_size: int, patch_size_t: int | None) -> torch.Tensor:
    """Latents [B, F, C, H, W] -> [B, N, K] patch vectors, tokens in (frame, row, column) order. CogVideoX1.5: K in
    ``(C, p_t, p, p)`` order, what CogVideoXPatchEmbed's Linear takes; 1.0: ``(C, p, p)``, its Conv2d's kernel
    order."""
    b, f, c, h, w = latents.shape
    p = patch_size
    if patch_size_t is None:
        x = latents.reshape(b, f, c, h // p, p, w // p, p).permute(0, 1, 3, 5, 2, 4, 6)
        return x.flatten(4, 6).flatten(1, 3)
    x = latents.permute(0, 1, 3, 4, 2).reshape(b, f // patch_size_t, patch_size_t, h // p, p, w // p, p, c)
    return x.permute(0, 1, 3, 5, 7, 2, 4, 6).flatten(4, 7).flatten(1, 3)


class CogVideoXAdapter(ModelAdapter):
    """``CogVideoXTransformer3DModel`` piece by piece: frames-first latents [B, F, C, H, W] (F a multiple of
    ``patch_size_t``), one T5 text input without a mask, text-to-video, RoPE on the video tokens (the runtimes make
    the tables from the latent shape, so the forward's ``image_rotary_emb`` is accepted and not needed), blocks
    called with keywords ``block(hidden_states=, encoder_hidden_states=, temb=, image_rotary_emb=)``."""

    name = "cogvideox"
    model_classes = ("CogVideoXTransformer3DModel",)
    layout_keys = ("in_channels", "out_channels", "patch_size", "patch_size_t", "sample_height", "sample_width",
                   "sample_frames", "max_text_seq_length", "temporal_compression_ratio",
                   "use_rotary_positional_embeddings")
    conditioning = ("encoder_hidden_states", "image_rotary_emb")
    block_keys = ()
    rule_sets = RULE_SETS
    block_prefix = "transformer_blocks."
    lora_targets = LORA_TARGETS
    timestep_dtype = torch.float32  # the pipeline's integer timesteps, embedded in float32 by diffusers
    vae_class = "AutoencoderKLCogVideoX"
    takes_flow_shift = False  # CogVideoXDDIMScheduler / CogVideoXDPMScheduler: v-prediction
    takes_lora_files = False  # hyv_lib's LoRA files are made for HunyuanVideo-1.5's transformer
    gpu_plan_note = ("the GPU rows' Ulysses layout is modelled as for HunyuanVideo-1.5; hyv_lib's Ulysses runtime "
                     "runs CogVideoX (tests/test_cogvideox_runtimes.py), but no multi-GPU CogVideoX run has checked "
                     "this plan.")

    def cost_dims(self, config: Mapping[str, Any]) -> dict[str, int]:
        """One joint stream (``streams`` 1: T5 text and video through the same weights), CogVideoXBlock's
        FeedForward at its default inner width 4 x dim, AdaLN-zero from a ``time_embed_dim`` embedding; no refiner,
        ByT5 or image input."""
        heads, head_dim = config["num_attention_heads"], config["attention_head_dim"]
        hidden = heads * head_dim
        return dict(heads=heads, head_dim=head_dim, hidden=hidden, mlp=4 * hidden, refiner_mlp=0,
                    layers=config["num_layers"], refiner_layers=0, patch=config["patch_size"],
                    patch_t=config.get("patch_size_t") or 1, in_channels=config["in_channels"],
                    out_channels=config["out_channels"], text_dim=config["text_embed_dim"], byt5_dim=0, image_dim=0,
                    time_dim=config["time_embed_dim"], streams=1)

    def token_grid(self, denoising_shape: tuple[int, ...]) -> tuple[int, int, int]:
        """Frames-first latents [B, F, C, H, W]."""
        return (denoising_shape[1], denoising_shape[3], denoising_shape[4])

    def example_inputs(self, preset, height: int, width: int, video_length: int, batch: int = 2,
                       dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
        """A CFG batch of ``preset``'s real shapes: latents [batch, F, C, H/8, W/8] with F padded as
        CogVideoXPipeline pads it, ``text_len`` T5 tokens, integer timesteps as the pipeline passes them."""
        preset.latent_shape(height, width, video_length)  # a size the VAE cannot take is a HyvInputError
        config = preset.transformer
        frames = latent_frames(config, video_length, preset.temporal_compression)
        s = preset.spatial_compression
        return dict(hidden_states=torch.zeros(batch, frames, preset.latent_channels, height // s, width // s,
                                              dtype=dtype),
                    timestep=torch.full((batch,), 900, dtype=torch.long),
                    encoder_hidden_states=torch.zeros(batch, preset.text_len, preset.text_dim, dtype=dtype))

    def check(self, model, who: str) -> None:
        """RoPE models without learned positional embeddings, text-to-video (no ``ofs`` embedding: CogVideoX1.5's
        image-to-video model), a :data:`PATCH`-wide patch."""
        config = model.config
        if not config.use_rotary_positional_embeddings or config.use_learned_positional_embeddings:
            raise ValueError(f"{who} runs CogVideoX models with rotary positional embeddings only (CogVideoX1.5, "
                             "CogVideoX-5b); this one adds sin-cos or learned positional embeddings to its tokens")
        if config.ofs_embed_dim:
            raise ValueError(f"{who} runs text-to-video CogVideoX only; this model has an ofs embedding "
                             "(CogVideoX1.5 image-to-video)")
        if config.patch_size != PATCH or config.out_channels != config.in_channels:
            raise ValueError(f"{who} runs CogVideoX models with a {PATCH}x{PATCH} patch and as many output as input "
                             "channels (every text-to-video checkpoint)")

    def blocks(self, model) -> torch.nn.ModuleList:
        return model.transformer_blocks

    def attention_modules(self, model) -> list[SharedProjectionsView]:
        """Each block's ``attn1`` seen as a dual-stream attention (:class:`SharedProjectionsView`): Ulysses' processor
        then projects the text with the shared weights, as CogVideoX does."""
        return [SharedProjectionsView(block.attn1) for block in self.blocks(model)]

    def use_attention(self, model, backend: str = "auto", **options: Any) -> int:
        return use_attention(model, backend, **options)

    def prepare(self, model, encoder_hidden_states, image_rotary_emb=None, timestep_cond=None,
                ofs=None) -> dict[str, torch.Tensor]:
        """The T5 text states in the model's dtype. ``image_rotary_emb`` is ignored (the runtimes compute the same
        tables from the latent shape); ``timestep_cond`` and ``ofs`` are not inputs of a text-to-video CogVideoX."""
        for name, value in (("timestep_cond", timestep_cond), ("ofs", ofs)):
            if value is not None:
                raise ValueError(f"{name} is not supported by hyv_lib's CogVideoX runtimes (text-to-video only): "
                                 f"pass {name}=None")
        return {"text_states": encoder_hidden_states.to(next(model.parameters()).dtype)}

    def time_embedding(self, model, timestep, timestep_r=None) -> torch.Tensor:
        """``time_proj`` (float32 sinusoids) cast to the model's dtype, then ``time_embedding``: the forward's
        ``emb`` (it casts to the latents' dtype, which the runtimes make the model's)."""
        dtype = model.time_embedding.linear_1.weight.dtype
        return model.time_embedding(model.time_proj(timestep).to(dtype))

    def embed_video(self, model, latents, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """The patch embedding of the video alone (CogVideoXPatchEmbed without the text); a ``start``/``stop`` token
        range embeds only those tokens, tokens past the end being zero patches (Ulysses' padding)."""
        embed = model.patch_embed
        if embed.patch_size_t is None and start == 0 and stop is None:  # 1.0: the module's own Conv2d
            b, f, c, h, w = latents.shape
            x = embed.proj(latents.reshape(-1, c, h, w))
            return x.view(b, f, *x.shape[1:]).flatten(3).transpose(2, 3).flatten(1, 2)
        x = patches(latents, embed.patch_size, embed.patch_size_t)
        if start != 0 or stop is not None:
            x = F.pad(x, (0, 0, 0, max(0, (stop or 0) - x.shape[1])))[:, start:stop]
        if embed.patch_size_t is None:  # the Conv2d as a Linear over (C, p, p) patches
            return F.linear(x, embed.proj.weight.flatten(1), embed.proj.bias)
        return embed.proj(x)

    def embed_context(self, model, timestep, prepared) -> torch.Tensor:
        """The text tokens [B, L, C]: CogVideoXPatchEmbed's ``text_proj``."""
        return model.patch_embed.text_proj(prepared["text_states"])

    def run_block(self, block, video, context, temb, inputs, rope) -> tuple:
        return block(hidden_states=video, encoder_hidden_states=context, temb=temb, image_rotary_emb=rope)

    def block_call(self, args: tuple, kwargs: dict) -> tuple:
        """The forward calls each block with keywords only; positional arguments are bound by the same names."""
        names = ("hidden_states", "encoder_hidden_states", "temb", "image_rotary_emb")
        call = {**dict(zip(names, args)), **kwargs}
        return (call["hidden_states"], call["encoder_hidden_states"], call["temb"], {},
                call.get("image_rotary_emb"))

    def video_token_count(self, model, latent_shape) -> int:
        """One token per patch: ``F / p_t`` x ``H / 2`` x ``W / 2`` (:func:`video_tokens`)."""
        return math.prod(video_tokens(tuple(latent_shape), model.config))

    def rope(self, model, latent_shape) -> tuple[torch.Tensor, ...]:
        """The pipeline's (cos, sin) tables for these latents (:func:`rotary_tables`), float32 as it makes them."""
        return rotary_tables(model.config, tuple(latent_shape))

    def output_tokens(self, model, video, temb) -> torch.Tensor:
        """``norm_final``, then the AdaLayerNorm ``norm_out`` with ``temb`` and ``proj_out``: [B, N, p_t*p*p*C]."""
        return model.proj_out(model.norm_out(model.norm_final(video), temb=temb))

    def unpatchify(self, tokens, latent_shape) -> torch.Tensor:
        """Output tokens [B, N, p_t*p*p*C] back to [B, F, C, H, W], as diffusers' forward unpatchifies. The patch is
        :data:`PATCH` wide (checked by :meth:`check`); the head's width gives ``p_t`` (1 for CogVideoX 1.0, whose
        layout is the same as a temporal patch of 1)."""
        batch, frames, channels, height, width = latent_shape
        p = PATCH
        p_t = tokens.shape[-1] // (p * p * channels)
        out = tokens.reshape(batch, -(-frames // p_t), height // p, width // p, channels, p_t, p, p)
        return out.permute(0, 1, 5, 4, 2, 6, 3, 7).flatten(6, 7).flatten(4, 5).flatten(1, 2)


#: The CogVideoX adapter (found for CogVideoXTransformer3DModel by :func:`hyv_lib.models.registry.adapter_for`).
COGVIDEOX = CogVideoXAdapter()
