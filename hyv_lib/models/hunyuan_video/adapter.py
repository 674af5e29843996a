"""HunyuanVideo's model adapter: diffusers' forward of its dual- then single-stream blocks, as pieces for the runtimes.

``HunyuanVideoTransformer3DModel.forward`` embeds the latents (a 1 x 2 x 2 Conv3d patch), refines the Llama text
tokens (a token refiner reading the padded text mask), sums the timestep, guidance and pooled-CLIP embeddings into
one conditioning vector, runs 20 dual-stream blocks (own weights per stream) and 40 single-stream blocks (one set of
weights over [video ; text]), all attending over [video ; text] with the padded text tokens masked as keys, and
unpatchifies the output head. :data:`HUNYUAN_VIDEO` restates that glue once; the blocks, embedders and head are the
model's own modules.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import torch
import torch.nn.functional as F

from ...parallel.sharding import tensor_parallel_rule_sets
from ..adapter import ModelAdapter
from .processors import SingleStreamView, use_attention

#: The block-parameter prefix of both kinds of blocks (``transformer_blocks.N.``, ``single_transformer_blocks.N.``).
BLOCKS = r"(single_)?transformer_blocks\.\d+\."

#: HunyuanVideo's weight-placement rule sets (``--sharding``), over diffusers' parameter names: column-parallel the
#: Q/K/V of both streams (dual-stream blocks) or of the joint sequence (single-stream ones) and each MLP's first layer
#: (``ff``/``ff_context`` ``net.0.proj``; the single blocks' ``proj_mlp``); row-parallel the attention outputs
#: (``to_out.0``, ``to_add_out``) and the MLPs' second layers (``net.2``; the single blocks' ``proj_out``, which reads
#: [attention ; MLP] features).
RULE_SETS = tensor_parallel_rule_sets(
    BLOCKS,
    column={"attn_qkv": r"attn\.(to_q|to_k|to_v|add_q_proj|add_k_proj|add_v_proj)\.(weight|bias)",
            "mlp_in": r"((ff|ff_context)\.net\.0\.proj|proj_mlp)\.(weight|bias)"},
    row={"attn_out": r"attn\.(to_out\.0|to_add_out)\.weight",
         "mlp_out": r"((ff|ff_context)\.net\.2|proj_out)\.weight"})

#: HunyuanVideo's LoRA target groups (``train --lora_targets``), over diffusers' module names: ``attn`` the attention
#: projections of every block (dual: Q/K/V and outputs of both streams, 8; single: the joint Q/K/V, 3); ``mlp`` the
#: feed-forward layers (dual: ``ff``/``ff_context``, 4; single: ``proj_mlp`` and ``proj_out``, 2); ``single`` every
#: linear layer of the single-stream blocks (the official checkpoint's fused ``linear1`` = to_q/to_k/to_v/proj_mlp and
#: ``linear2`` = proj_out, the single blocks' layers MindSpeed-MM's HunyuanVideo-I2V LoRA adapts, without their
#: ``norm.linear`` modulation); ``all`` every ``nn.Linear`` (peft's ``"all-linear"``).
LORA_TARGETS = {
    "attn": r"(transformer_blocks\.\d+\.attn\.(to_q|to_k|to_v|to_out\.0|add_q_proj|add_k_proj|add_v_proj|to_add_out)"
            r"|single_transformer_blocks\.\d+\.attn\.(to_q|to_k|to_v))",
    "mlp": r"(transformer_blocks\.\d+\.(ff|ff_context)\.net\.(0\.proj|2)"
           r"|single_transformer_blocks\.\d+\.(proj_mlp|proj_out))",
    "single": r"single_transformer_blocks\.\d+\.(attn\.(to_q|to_k|to_v)|proj_mlp|proj_out)",
    "all": r".+",
}


def patches(latents: torch.Tensor, p_t: int, p: int) -> torch.Tensor:
    """Latents [B, C, T, H, W] -> [B, N, C*p_t*p*p]: one vector per patch, tokens in (frame, row, column) order and
    each vector in (C, p_t, p, p) order, the order of the patch Conv3d's flattened kernel."""
    b, c, t, h, w = latents.shape
    x = latents.reshape(b, c, t // p_t, p_t, h // p, p, w // p, p)
    return x.permute(0, 2, 4, 6, 1, 3, 5, 7).flatten(4, 7).flatten(1, 3)


class HunyuanVideoAdapter(ModelAdapter):
    """``HunyuanVideoTransformer3DModel`` piece by piece: latents [B, C, T, H, W] with a 1 x 2 x 2 patch, the Llama
    text tokens with their padded mask, pooled CLIP and (guidance-distilled checkpoints) the embedded guidance;
    :meth:`blocks` is the 20 dual-stream then the 40 single-stream blocks, each called
    ``block(video, text, temb, mask, (cos, sin))``. Text- and latent-concat image-to-video checkpoints
    (token-replace image-to-video is refused by :meth:`check`).

    The conditioning vector every block and the head are modulated by is the timestep embedding (:meth:`time_embedding`)
    plus the guidance and pooled-text embeddings (:meth:`condition_embedding`, from :meth:`prepare`'s tensors):
    :meth:`forward` adds both."""

    name = "hunyuanvideo"
    model_classes = ("HunyuanVideoTransformer3DModel",)
    layout_keys = ("in_channels", "out_channels", "patch_size", "patch_size_t", "guidance_embeds",
                   "image_condition_type", "qk_norm")
    conditioning = ("encoder_hidden_states", "encoder_attention_mask", "pooled_projections", "guidance")
    block_keys = ("context_mask", "pooled", "guidance")
    rule_sets = RULE_SETS
    block_prefix = "transformer_blocks."  # the planner's per-block sizes: the dual-stream blocks (the larger kind)
    block_prefixes = ("transformer_blocks.", "single_transformer_blocks.")  # the dual-, then the single-stream blocks
    lora_targets = LORA_TARGETS
    timestep_dtype = torch.float32  # HunyuanVideoPipeline passes float32 timesteps (the latents' dtype)
    vae_class = "AutoencoderKLHunyuanVideo"
    takes_lora_files = True  # LoRA files in diffusers' format (hyv_lib's train writes them for this model too)
    gpu_plan_note = ("the GPU rows are modelled as for HunyuanVideo-1.5's dual-stream blocks; no multi-GPU "
                     "HunyuanVideo run has checked this plan.")

    # ------------------------------------------------------------------------------------------ checks, shapes
    def check(self, model, who: str) -> None:
        """Text-to-video and latent-concat image-to-video (the token-replace checkpoint modulates its first frame's
        tokens apart: not restated here)."""
        if model.config.image_condition_type == "token_replace":
            raise ValueError(f"{who} runs HunyuanVideo text-to-video and latent-concat image-to-video; this model "
                             "replaces its first frame's tokens (image_condition_type token_replace)")
        if model.config.patch_size_t != 1:
            raise ValueError(f"{who} runs HunyuanVideo with a temporal patch of 1 (every checkpoint)")

    def token_grid(self, denoising_shape: tuple[int, ...]) -> tuple[int, int, int]:
        return tuple(denoising_shape[2:5])

    def cost_dims(self, config: Mapping[str, Any]) -> dict[str, int]:
        """``num_layers`` dual-stream blocks (``streams`` 2: own text weights) then ``num_single_layers``
        single-stream ones (``single_layers``, MLP ``single_mlp`` wide: one set of weights over [video ; text]); a
        token refiner whose MLP is built at its default ratio 4 (``HunyuanVideoTokenRefiner`` passes no
        ``mlp_ratio``); the conditioning vector sums the timestep, pooled-CLIP (``pooled_dim``) and, in the
        guidance-distilled checkpoints, guidance embeddings (``guidance_embed`` 1); no ByT5 or image embedder."""
        heads, head_dim = config["num_attention_heads"], config["attention_head_dim"]
        hidden = heads * head_dim
        mlp = int(hidden * config["mlp_ratio"])
        return dict(heads=heads, head_dim=head_dim, hidden=hidden, mlp=mlp, refiner_mlp=4 * hidden,
                    layers=config["num_layers"], refiner_layers=config["num_refiner_layers"],
                    patch=config["patch_size"], patch_t=config["patch_size_t"], in_channels=config["in_channels"],
                    out_channels=config["out_channels"], text_dim=config["text_embed_dim"], byt5_dim=0, image_dim=0,
                    time_dim=hidden, streams=2, single_layers=config["num_single_layers"], single_mlp=mlp,
                    pooled_dim=config["pooled_projection_dim"], guidance_embed=int(bool(config["guidance_embeds"])))

    def video_token_count(self, model, latent_shape) -> int:
        """One token per 1 x 2 x 2 patch: ``T / p_t`` x ``H / p`` x ``W / p``."""
        c = model.config
        _, _, t, h, w = latent_shape
        return (t // c.patch_size_t) * (h // c.patch_size) * (w // c.patch_size)

    def example_inputs(self, preset, height: int, width: int, video_length: int, batch: int = 1,
                       dtype: torch.dtype = torch.bfloat16, text_tokens: int = 120) -> dict[str, torch.Tensor]:
        """``batch`` samples of ``preset``'s real shapes (one per step: guidance is embedded, not a CFG pair),
        ``text_tokens`` valid text tokens, the guidance input when the checkpoint embeds it."""
        _, c, t, h, w = preset.latent_shape(height, width, video_length)
        mask = (torch.arange(preset.text_len)[None] < min(text_tokens, preset.text_len)).long().repeat(batch, 1)
        config = preset.transformer
        guidance = {"guidance": torch.full((batch,), 6000.0, dtype=dtype)} if config.get("guidance_embeds") else {}
        return dict(hidden_states=torch.zeros(batch, config["in_channels"], t, h, w, dtype=dtype),
                    timestep=torch.full((batch,), 900.0),
                    encoder_hidden_states=torch.zeros(batch, preset.text_len, preset.text_dim, dtype=dtype),
                    encoder_attention_mask=mask,
                    pooled_projections=torch.zeros(batch, config["pooled_projection_dim"], dtype=dtype), **guidance)

    # ------------------------------------------------------------------------------------------ pieces
    def blocks(self, model) -> torch.nn.ModuleList:
        """The dual-stream blocks, then the single-stream ones (one list; the modules stay the model's)."""
        return torch.nn.ModuleList([*model.transformer_blocks, *model.single_transformer_blocks])

    def attention_modules(self, model) -> list:
        """Each block's attention as a dual-stream one: the dual blocks' own, the single blocks' through a
        :class:`SingleStreamView` (shared projections, identity outputs)."""
        return ([block.attn for block in model.transformer_blocks]
                + [SingleStreamView(block.attn) for block in model.single_transformer_blocks])

    def use_attention(self, model, backend: str = "auto", **options: Any) -> int:
        return use_attention(model, backend, **options)

    def prepare(self, model, encoder_hidden_states, encoder_attention_mask, pooled_projections,
                guidance=None) -> dict[str, torch.Tensor]:
        """The text states and pooled CLIP in the model's dtype, the text mask as given (the token refiner pools
        and attends with it), ``context_mask`` [B, L]: the text keys the blocks attend to, the first
        ``mask.sum()`` tokens of each sample as diffusers' forward counts them, and ``guidance`` [B] (zeros, unused,
        for a checkpoint without a guidance embedding)."""
        dtype = next(model.parameters()).dtype
        batch, length = encoder_attention_mask.shape
        device = encoder_hidden_states.device
        if model.config.guidance_embeds and guidance is None:
            raise ValueError("this HunyuanVideo checkpoint embeds the guidance scale (guidance_embeds=True): pass "
                             "guidance= (the scale x 1000 per sample, as HunyuanVideoPipeline does)")
        valid = encoder_attention_mask.sum(dim=1, dtype=torch.int)
        context_mask = torch.arange(length, device=device)[None] < valid.to(device)[:, None]
        return {"text_states": encoder_hidden_states.to(dtype), "text_mask": encoder_attention_mask,
                "context_mask": context_mask, **self.condition_inputs(model, pooled_projections, guidance)}

    def time_embedding(self, model, timestep, timestep_r=None) -> torch.Tensor:
        """The timestep's part of the conditioning vector: ``time_proj`` (float32 sinusoids) in the model's dtype
        through ``timestep_embedder``; :meth:`condition_embedding` adds the rest."""
        embed = model.time_text_embed
        dtype = embed.timestep_embedder.linear_1.weight.dtype
        return embed.timestep_embedder(embed.time_proj(timestep).to(dtype))

    def condition_inputs(self, model, pooled_projections=None, guidance=None, **_) -> dict[str, torch.Tensor]:
        """The pooled CLIP and the guidance of a forward's keywords, as :meth:`prepare` gives them."""
        batch = pooled_projections.shape[0]
        dtype = next(model.parameters()).dtype
        if guidance is None or not model.config.guidance_embeds:
            guidance = torch.zeros(batch, device=pooled_projections.device)
        return {"pooled": pooled_projections.to(dtype),
                "guidance": torch.as_tensor(guidance, device=pooled_projections.device).reshape(-1).expand(batch)}

    def condition_embedding(self, model, temb, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """The whole conditioning vector from the timestep's: plus the guidance embedding (checkpoints with
        ``guidance_embeds``) and the pooled CLIP projection, summed in diffusers' order."""
        embed = model.time_text_embed
        pooled = inputs["pooled"]
        if embed.guidance_embedder is not None:
            temb = temb + embed.guidance_embedder(embed.time_proj(inputs["guidance"]).to(pooled.dtype))
        return temb + embed.text_embedder(pooled)

    def embed_video(self, model, latents, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """The patch embedding; a ``start``/``stop`` token range embeds only those tokens as a linear map of their
        patches (tokens past the end are zero patches: Ulysses' padding)."""
        proj = model.x_embedder.proj
        if start == 0 and stop is None:
            return model.x_embedder(latents)
        p_t, p = proj.kernel_size[0], proj.kernel_size[1]
        x = patches(latents, p_t, p)
        x = F.pad(x, (0, 0, 0, max(0, (stop or 0) - x.shape[1])))[:, start:stop]
        return F.linear(x, proj.weight.flatten(1), proj.bias)

    def embed_context(self, model, timestep, prepared) -> torch.Tensor:
        """The text tokens [B, L, C]: the token refiner over the Llama states with the text mask and the timestep."""
        return model.context_embedder(prepared["text_states"], timestep, prepared["text_mask"])

    def run_block(self, block, video, context, temb, inputs, rope) -> tuple:
        """A dual- or single-stream block; hyv_lib's processors take the [B, L] text mask, diffusers' own the
        [B, 1, 1, S] key mask its forward builds (the video keys first, always valid)."""
        from diffusers.models.transformers.transformer_hunyuan_video import HunyuanVideoAttnProcessor2_0

        mask = inputs["context_mask"]
        if isinstance(block.attn.processor, HunyuanVideoAttnProcessor2_0):
            mask = F.pad(mask, (video.shape[1], 0), value=True)[:, None, None]
        return block(video, context, temb, mask, rope)

    def block_call(self, args: tuple, kwargs: dict) -> tuple:
        """The forward calls each block positionally: (video, text, temb, [B, 1, 1, S] mask, rope, ...); the text
        mask is the mask's last L entries. The conditioning of the recorded call is already in its ``temb``."""
        video, context, temb, mask, rope = args[:5]
        text = mask.reshape(mask.shape[0], -1)[:, -context.shape[1]:]
        return video, context, temb, {"context_mask": text}, rope

    def rope(self, model, latent_shape) -> tuple[torch.Tensor, ...]:
        """(cos, sin) [N, head_dim], one row per video token: ``model.rope`` reads only the latents' shape."""
        return model.rope(torch.zeros(()).expand(*latent_shape))

    def output_tokens(self, model, video, temb) -> torch.Tensor:
        """``norm_out`` (AdaLayerNormContinuous with the conditioning vector) then ``proj_out``: [B, N, p_t*p*p*C]."""
        return model.proj_out(model.norm_out(video, temb))

    def unpatchify(self, tokens, latent_shape) -> torch.Tensor:
        """Output tokens back to [B, C, T, H, W] as diffusers' forward unpatchifies; the patch (1 x 2 x 2 in every
        checkpoint) is read from the head's width and the latents' shape."""
        batch, channels, frames, height, width = latent_shape
        p = math.isqrt(tokens.shape[-1] // channels)  # p_t = 1: every checkpoint's (:meth:`check`)
        out = tokens.reshape(batch, frames, height // p, width // p, channels, 1, p, p)
        return out.permute(0, 4, 1, 5, 2, 6, 3, 7).flatten(6, 7).flatten(4, 5).flatten(2, 3)

    # ------------------------------------------------------------------------------------------ composed
    def forward(self, model, latents, timestep, prepared, rope, timestep_r=None) -> torch.Tensor:
        """The whole step from prepared inputs, the conditioning vector complete (:meth:`condition_embedding`)."""
        self.check_timestep_r(model, timestep_r)
        inputs = self.block_inputs(prepared)
        temb = self.condition_embedding(model, self.time_embedding(model, timestep), inputs)
        video = self.embed_video(model, latents)
        context = self.embed_context(model, timestep, prepared)
        for block in self.blocks(model):
            video, context = self.run_block(block, video, context, temb, inputs, rope)
        return self.unpatchify(self.output_tokens(model, video, temb), latents.shape)


#: The HunyuanVideo adapter (found for HunyuanVideoTransformer3DModel by :func:`hyv_lib.models.registry.adapter_for`).
HUNYUAN_VIDEO = HunyuanVideoAdapter()
