"""A second video transformer, unlike HunyuanVideo-1.5, with its own ModelAdapter: the runtimes' model-agnostic test.

``ToyVideoDiT`` differs from HunyuanVideo-1.5 where a second diffusers model (CogVideoX) does: frames-first latents
[B, F, C, H, W], one text input and no mask, no context reorder, single-stream joint attention over [text ; video]
with F.scaled_dot_product_attention, fused QKV, different parameter names (``layers.N.*``). Its own ``forward`` is
the oracle; the adapter only names its pieces.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

from hyv_lib.models.adapter import ModelAdapter
from hyv_lib.parallel.sharding import tensor_parallel_rule_sets

CONFIG = dict(in_channels=4, text_dim=12, dim=32, heads=4, layers=3, mlp=64)


class ToyBlock(nn.Module):
    def __init__(self, dim: int, heads: int, mlp: int):
        super().__init__()
        self.heads = heads
        self.norm = nn.LayerNorm(dim, elementwise_affine=False)
        self.modulation = nn.Linear(dim, 2 * dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.mlp_in = nn.Linear(dim, mlp)
        self.mlp_out = nn.Linear(mlp, dim)

    def forward(self, video, text, temb, rope):
        n_text = text.shape[1]
        x = torch.cat([text, video], dim=1)  # single stream: [text ; video]
        shift, scale = self.modulation(F.silu(temb))[:, None].chunk(2, dim=-1)
        h = self.norm(x) * (1 + scale) + shift
        b, s, _ = h.shape
        q, k, v = self.qkv(h).reshape(b, s, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        cos, sin = rope  # rotary on the video tokens only
        q, k = (torch.cat([t[:, :, :n_text], rotate(t[:, :, n_text:], cos, sin)], dim=2) for t in (q, k))
        attn = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, s, -1)
        x = x + self.out(attn)
        x = x + self.mlp_out(F.gelu(self.mlp_in(self.norm(x))))
        return x[:, n_text:], x[:, :n_text]  # (video, text), as diffusers' blocks return their two streams


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    turned = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + turned * sin


class ToyVideoDiT(nn.Module):
    def __init__(self, in_channels=4, text_dim=12, dim=32, heads=4, layers=3, mlp=64):
        super().__init__()
        self.config = SimpleNamespace(num_attention_heads=heads, dim=dim)
        self.patch_embed = nn.Linear(in_channels, dim)
        self.text_embed = nn.Linear(text_dim, dim)
        self.time_embed = nn.Sequential(nn.Linear(16, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.layers = nn.ModuleList(ToyBlock(dim, heads, mlp) for _ in range(layers))
        self.norm_out = nn.LayerNorm(dim, elementwise_affine=False)
        self.scale_out = nn.Linear(dim, dim)
        self.proj_out = nn.Linear(dim, in_channels)

    def timestep_features(self, timestep):
        freqs = torch.exp(-math.log(1000.0) * torch.arange(8, dtype=torch.float32) / 8).to(timestep.device)
        angles = timestep.float()[:, None] * freqs[None]
        return torch.cat([angles.cos(), angles.sin()], dim=-1).to(self.patch_embed.weight.dtype)

    def rope_tables(self, frames, height, width):
        head_dim = self.config.dim // self.config.num_attention_heads
        pos = torch.arange(frames * height * width, dtype=torch.float32)
        freqs = 1.0 / (100.0 ** (torch.arange(head_dim // 2, dtype=torch.float32) / (head_dim // 2)))
        angles = torch.cat([pos[:, None] * freqs[None]] * 2, dim=-1)
        return angles.cos(), angles.sin()

    def forward(self, hidden_states, timestep, encoder_hidden_states, return_dict=True):
        b, f, c, h, w = hidden_states.shape
        temb = self.time_embed(self.timestep_features(timestep.reshape(-1).expand(b)))
        video = self.patch_embed(hidden_states.permute(0, 1, 3, 4, 2).reshape(b, f * h * w, c))
        text = self.text_embed(encoder_hidden_states)
        rope = self.rope_tables(f, h, w)
        for layer in self.layers:
            video, text = layer(video, text, temb, rope)
        out = self.proj_out(self.norm_out(video) * (1 + self.scale_out(temb)[:, None]))
        out = out.reshape(b, f, h, w, c).permute(0, 1, 4, 2, 3)
        return (out,) if not return_dict else SimpleNamespace(sample=out)


class ToyAdapter(ModelAdapter):
    name = "toy"
    model_classes = ("ToyVideoDiT",)
    conditioning = ("encoder_hidden_states",)
    rule_sets = tensor_parallel_rule_sets(r"layers\.\d+\.", column={"qkv": r"(qkv|mlp_in)\.(weight|bias)"},
                                          row={"out": r"(out|mlp_out)\.weight"})
    block_prefix = "layers."

    def build(self, config):
        return ToyVideoDiT(**config)

    def blocks(self, model):
        return model.layers

    def use_attention(self, model, backend="auto", **options):
        if backend != "auto" or options:
            raise ValueError("the toy model runs its own F.scaled_dot_product_attention: attention='auto' only")
        return 0

    def prepare(self, model, encoder_hidden_states):
        return {"text": encoder_hidden_states.to(next(model.parameters()).dtype)}

    def time_embedding(self, model, timestep, timestep_r=None):
        return model.time_embed(model.timestep_features(timestep))

    def embed_video(self, model, latents, start=0, stop=None):
        b, f, c, h, w = latents.shape
        tokens = latents.permute(0, 1, 3, 4, 2).reshape(b, f * h * w, c)
        if stop is not None:
            tokens = F.pad(tokens, (0, 0, 0, max(0, stop - tokens.shape[1])))
        return model.patch_embed(tokens[:, start:stop])

    def embed_context(self, model, timestep, prepared):
        return model.text_embed(prepared["text"])

    def run_block(self, block, video, context, temb, inputs, rope):
        return block(video, context, temb, rope)

    def block_call(self, args, kwargs):
        video, text, temb, rope = args
        return video, text, temb, {}, rope

    def rope(self, model, latent_shape):
        _, f, _, h, w = latent_shape
        return model.rope_tables(f, h, w)

    def output_tokens(self, model, video, temb):
        return model.proj_out(model.norm_out(video) * (1 + model.scale_out(temb)[:, None]))

    def unpatchify(self, tokens, latent_shape):
        b, f, c, h, w = latent_shape
        return tokens.reshape(b, f, h, w, c).permute(0, 1, 4, 2, 3)


TOY = ToyAdapter()


def toy_model(seed: int = 0) -> ToyVideoDiT:
    torch.manual_seed(seed)
    return ToyVideoDiT(**CONFIG).eval().requires_grad_(False)


def toy_inputs(seed: int, batch: int = 2, frames: int = 2, height: int = 3, width: int = 4, text: int = 5) -> dict:
    g = torch.Generator().manual_seed(seed)
    return dict(hidden_states=torch.randn(batch, frames, CONFIG["in_channels"], height, width, generator=g),
                timestep=torch.tensor([700.0, 300.0][:batch]),
                encoder_hidden_states=torch.randn(batch, text, CONFIG["text_dim"], generator=g))
