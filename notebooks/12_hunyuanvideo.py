# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 12. A third model: HunyuanVideo (13B)
#
# Chapter 10 added a second model and asked what carried over. This chapter adds a third, the first HunyuanVideo
# (Tencent, December 2024; Kong et al. 2024 in {doc}`../book/references`), the "13B" {term}`DiT` (12.8 billion
# parameters, counted below) that HunyuanVideo-1.5 succeeded, in the diffusers format of
# `hunyuanvideo-community/HunyuanVideo`. It is a useful third case because it is like neither of the first two: its
# blocks come in two kinds, its guidance is an input of the network rather than a second sample, and its text comes
# from a Llama and a CLIP.
#
# :::{figure} ../book/figures/12_hunyuanvideo_13b.svg
# :name: fig-12-hunyuanvideo-13b
#
# HunyuanVideo's DiT. The video latents (patch 1 x 2 x 2) and the Llama's hidden states (through the token refiner)
# enter 20 dual-stream blocks, where each stream has its own weights and one attention runs over both; then 40
# single-stream blocks run one set of weights over the concatenated tokens, and the final layer reads the video
# tokens back. The timestep, the guidance scale and CLIP's pooled text vector are embedded and summed into one
# vector per sample, which modulates every block.
# :::
#
# This chapter:
#
# 1. **Three models side by side**: the real configs built on the `meta` device, the embedded guidance, the text.
# 2. **What the family needed**: one folder, two registry entries, and two new questions on the model adapter.
# 3. **The tiny model against diffusers**: the adapter's pieces, the torch runtime and the JAX runtime (on one and
#    on 8 emulated devices) against `HunyuanVideoTransformer3DModel`'s forward with a padded text mask, and the
#    sampling loop against `HunyuanVideoPipeline`.
# 4. **A video through the public API**: `hyv_lib.load_pipeline(...).generate(...)`, text to video and image to
#    video (LLaVA reads the first frame; its latents go beside the noise).
# 5. **MindSpeed-MM's LoRA recipe, mapped**: its commands and parallel settings next to `hyv_lib`'s, the recipe run
#    at tiny size.
# 6. **Real size, compiled here**: the 720x1280x129 step compiled for a v6e-8 and a v5p-8, the planner beside it,
#    and what is not built yet.
#
# Everything here runs on a 2-core CPU in about two minutes with the tiny preset `hunyuanvideo_tiny` (the last code
# cell prints the time).

# %% tags=["parameters"]
import os

# The live video uses hunyuanvideo_tiny (random weights); with HYV_PRESET=hunyuanvideo_t2v and HYV_MODEL_PATH=<a
# diffusers HunyuanVideo folder> it generates with the real model instead (HYV_RUNTIME torch or jax, HYV_MESH,
# HYV_HEIGHT x HYV_WIDTH x HYV_VIDEO_LENGTH, HYV_STEPS; default 720x1280x129, 50 steps: a GPU or TPU, not this CPU).
# The comparisons with diffusers and the LoRA recipe always run at tiny size.
PRESET = os.environ.get("HYV_PRESET", "hunyuanvideo_tiny")
MODEL_PATH = os.environ.get("HYV_MODEL_PATH") or None
RUNTIME = os.environ.get("HYV_RUNTIME", "torch")
MESH = os.environ.get("HYV_MESH") or None
HEIGHT = int(os.environ.get("HYV_HEIGHT", 0)) or None
WIDTH = int(os.environ.get("HYV_WIDTH", 0)) or None
VIDEO_LENGTH = int(os.environ.get("HYV_VIDEO_LENGTH", 0)) or None
STEPS = int(os.environ.get("HYV_STEPS", 0)) or None
N_DEVICES = int(os.environ.get("HYV_N_DEVICES", "8"))  # emulated CPU devices for the mesh checks
from hyv_lib.notebook.display import settings_not_used  # noqa: E402

_ = settings_not_used({"HYV_ATTENTION": "the runtimes' default (hyv_lib's masked attention) is what is compared "
                                        "with diffusers' processors"})

# %%
# Emulated devices must be requested before JAX initialises its CPU backend.
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={N_DEVICES}"
import ast
import copy
import glob
import inspect
import json
import logging
import re
import shutil
import tempfile
import time
import warnings

warnings.filterwarnings("ignore", message="IProgress not found")
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
warnings.filterwarnings("ignore", message="os.fork", category=RuntimeWarning)
logging.getLogger("jax").setLevel(logging.ERROR)
CHAPTER_START = time.perf_counter()

import jax
import matplotlib.pyplot as plt
import numpy as np
import torch
from diffusers import HunyuanVideoPipeline
from diffusers.utils import logging as diffusers_logging
from transformers.utils import logging as transformers_logging
from IPython.display import display
from PIL import Image, ImageDraw
from safetensors.torch import load_file

import hyv_lib
import hyv_lib.runtimes as runtimes_package
from hyv_lib.cli.commands import run
from hyv_lib.models.adapter import ModelAdapter
from hyv_lib.models.components import build_tiny_components
from hyv_lib.models.families import FAMILIES, family_for
from hyv_lib.models.hunyuan_video.adapter import HUNYUAN_VIDEO, HunyuanVideoAdapter
from hyv_lib.models.hunyuan_video.components import COMPONENTS
from hyv_lib.models.hunyuan_video.recipe import denoise
from hyv_lib.models.lora import lora_target_names, merge_lora
from hyv_lib.models.registry import ADAPTERS, get_adapter
from hyv_lib.notebook.display import frame_grid, html_table, tensor_rows, video_html
from hyv_lib.parallel.mesh import default_layout
from hyv_lib.planning.costs import step_flops
from hyv_lib.runtimes.step import make_step
from hyv_lib.training.feature_set import FeatureSet

diffusers_logging.set_verbosity_error()
# without torchvision, transformers says once that CLIP's image processor runs its PIL version (the same pixels)
transformers_logging.set_verbosity_error()
torch.manual_seed(0)
print(jax.device_count(), "emulated devices:", jax.devices()[0].platform)

# %% [markdown]
# ## Three models side by side
#
# Each model is a diffusers class described by a `hyv_lib` preset. The transformer configs of `hunyuanvideo_t2v`
# are those diffusers' conversion script (`scripts/convert_hunyuan_video_to_diffusers.py`, its
# `"HYVideo-T/2-cfgdistill"` entry) writes for the checkpoint, and the sampling defaults are
# `HunyuanVideoPipeline.__call__`'s (`hyv_lib/models/hunyuan_video/presets.py` lists the sources line by line). The
# next cell builds each real transformer on the `meta` device (shapes, no memory, as
# `tests/test_hunyuan_video_runtimes.py` does) and counts its parameters, its blocks and what one denoising step
# feeds it at the preset's default size.

# %%
KINDS = {"hunyuanvideo-1.5": "dual-stream", "cogvideox": "joint", "hunyuanvideo": "dual-stream"}
NAMES = {"720p_t2v": "HunyuanVideo-1.5", "cogvideox1.5_5b": "CogVideoX1.5-5B", "hunyuanvideo_t2v": "HunyuanVideo"}
TEXT = {"hunyuanvideo-1.5": "Qwen2.5-VL + ByT5 (+ SigLIP)", "cogvideox": "T5-XXL",
        "hunyuanvideo": "Llama-3 (LLaVA) + CLIP pooled"}
real_models = {}


def describe(name):
    """One column: the preset's real transformer, built on the meta device, and one step at its default size."""
    preset = hyv_lib.get_preset(name)
    adapter, config = get_adapter(preset.model), preset.transformer
    with torch.device("meta"):
        model = adapter.build(config)
    real_models[name] = model
    kwargs = adapter.example_inputs(preset, preset.default_height, preset.default_width, preset.default_video_length,
                                    dtype=torch.float32)
    video = adapter.video_token_count(model, tuple(kwargs["hidden_states"].shape))
    context = adapter.context_tokens(preset)
    first = len(model.transformer_blocks)
    single = len(getattr(model, "single_transformer_blocks", None) or [])
    patch = f"{config.get('patch_size_t') or 1} x {config['patch_size']} x {config['patch_size']}"
    return {"parameters": f"{sum(p.numel() for p in model.parameters()):,}",
            "blocks": f"{first} {KINDS[preset.model]}" + (f" + {single} single-stream" if single else ""),
            "heads x head_dim (width)": f"{config['num_attention_heads']} x {config['attention_head_dim']} "
                                        f"({config['num_attention_heads'] * config['attention_head_dim']:,})",
            "VAE (t, h/w) x patch": f"{preset.temporal_compression}x, {preset.spatial_compression}x; {patch}",
            "text": f"{TEXT[preset.model]}, {context:,} tokens",
            "guidance": (f"embedded {preset.guidance_scale:g}" if preset.guidance_embedded
                         else f"CFG {preset.guidance_scale:g}"),
            "samples per step": preset.samples_per_step,
            "default video": f"{preset.default_height}x{preset.default_width}x{preset.default_video_length}",
            "video tokens": f"{video:,}",
            "token rows per step": f"{preset.samples_per_step * (video + context):,}"}


t0 = time.perf_counter()
side = {NAMES[name]: describe(name) for name in NAMES}
display(html_table([{"": key, **{model: column[key] for model, column in side.items()}}
                    for key in next(iter(side.values()))]))
print(f"three meta-device builds: {time.perf_counter() - t0:.1f} s")

# %% [markdown]
# HunyuanVideo is the largest of the three (first row), and the only one with two kinds of block. Its first 20
# blocks are *dual-stream*: the video tokens and the text tokens keep their own weights (own modulation, own Q/K/V,
# own MLP) and meet only in one joint attention, as all 54 of HunyuanVideo-1.5's blocks do. Its last 40 are
# *single-stream*: one set of weights over the concatenated [video ; text] sequence, the attention and the MLP side
# by side. CogVideoX's 42 *joint* blocks sit in between: one sequence through shared projections, but a separate
# modulation per stream.
#
# Per frame the token grids are the same at 720x1280: HunyuanVideo's 8x VAE with a 2x2 patch gives 45 x 80 tokens a
# frame, as 1.5's 16x VAE with no patch does. Its default video is longer (129 frames, 33 latent frames), so one
# sample has more video tokens than 1.5's; yet a step feeds the DiT about half the token rows (last row), because
# HunyuanVideo runs one sample per step where the other two run a CFG pair. The next cell splits the 13B by block
# kind.

# %%
real = real_models["hunyuanvideo_t2v"]
count = lambda module: sum(p.numel() for p in module.parameters())  # noqa: E731
dual_each, single_each = count(real.transformer_blocks[0]), count(real.single_transformer_blocks[0])
rest = count(real) - len(real.transformer_blocks) * dual_each - len(real.single_transformer_blocks) * single_each
print(f"one dual-stream block:   {dual_each:,} parameters x {len(real.transformer_blocks)} = "
      f"{len(real.transformer_blocks) * dual_each:,}")
print(f"one single-stream block: {single_each:,} parameters x {len(real.single_transformer_blocks)} = "
      f"{len(real.single_transformer_blocks) * single_each:,}")
print(f"everything else:         {rest:,} (of which the token refiner {count(real.context_embedder):,})")
print(f"a dual-stream block holds {dual_each / single_each:.2f}x the weights of a single-stream one")

# %% [markdown]
# ### Embedded guidance: one sample per step
#
# The text-to-video checkpoint is *guidance-distilled* ("cfgdistill" in the conversion script's config name): it
# was trained to produce, from one forward pass, what classifier-free guidance at a given scale produces from two.
# The scale is an input: `HunyuanVideoPipeline` multiplies it by 1000 and passes it as `guidance`, which a
# guidance embedder (a second {term}`timestep embedding`) turns into a vector that is added to the timestep's and
# modulates every block. There is no negative prompt in the loop and no CFG pair, so `Preset.guidance_embedded`
# makes `preset.samples_per_step` 1, and everything that sizes a step (the sampling loop, the default mesh, the
# planner) reads that.

# %%
display(html_table([{"preset": p.name, "guidance_scale": p.guidance_scale, "guidance_embedded": p.guidance_embedded,
                     "samples_per_step": p.samples_per_step,
                     "default mesh on 8 devices": ",".join(f"{k}={v}" for k, v in default_layout(
                         8, p.transformer["num_attention_heads"], batch=p.samples_per_step).items() if v > 1)}
                    for p in map(hyv_lib.get_preset, ("720p_t2v", "hunyuanvideo_t2v", "hunyuanvideo_i2v",
                                                      "hunyuanvideo_tiny"))]))

# %% [markdown]
# With one sample per step a `data` axis has nothing to split, so the default layout puts all 8 devices on `tensor`
# (24 heads split 8 ways), where HunyuanVideo-1.5 puts its CFG pair on `data=2`. The image-to-video checkpoint
# (`hunyuanvideo_i2v`, 33 input channels: the noise, the first frame's latents and a mask) has no guidance
# embedding; its pipeline's example runs it with guidance 1, which is also one sample per step.
#
# ### Llama and CLIP text
#
# Stage 1 runs two encoders. The prompt goes into a fixed chat template and through a Llama-3 8B (the language model
# of `llava-llama-3-8b`); the recipe reads the third-last layer's hidden states, crops the template's first 95
# tokens away and keeps 256 text tokens with a padding mask. A CLIP text model reads the prompt alone and contributes
# its *pooled* vector, which modulates the blocks as the guidance does. The Llama tokens go through a {term}`token
# refiner` (two transformer blocks that read the mask) before the DiT attends to them. The next cell runs stage
# 1 of the tiny model, whose byte-level tokenizers make every character a token, and puts the real preset's shapes
# beside it.

# %%
tiny = hyv_lib.get_preset("hunyuanvideo_tiny")
pipe_api = hyv_lib.load_pipeline("hunyuanvideo_tiny", progress=False)
stage1 = pipe_api.encode("a cat playing piano", "")
t2v = hyv_lib.get_preset("hunyuanvideo_t2v")
real_shapes = {"prompt_embeds": [1, t2v.text_len, t2v.text_dim], "prompt_embeds_mask": [1, t2v.text_len],
               "pooled_prompt_embeds": [1, t2v.transformer["pooled_projection_dim"]]}
rows = tensor_rows({k: tuple(v.shape) for k, v in stage1.items()},
                   {k: str(v.dtype).replace("torch.", "") for k, v in stage1.items()})
display(html_table([{"stage-1 tensor": r["name"], "tiny shape": r["shape"], "dtype": r["dtype"],
                     "hunyuanvideo_t2v shape": real_shapes[r["name"].removeprefix("negative_")]} for r in rows]))
print(f"'a cat playing piano': {int(stage1['prompt_embeds_mask'].sum())} of {tiny.text_len} Llama tokens valid; "
      f"the family's stage-1 names: {family_for(tiny).text_names}")

# %% [markdown]
# Six tensors, three per prompt. Stage 1 always encodes the prompt and the negative prompt, but this loop reads only
# the prompt's: the guidance is embedded, there is no negative branch. The 19 characters of the prompt and the
# template's end-of-turn token are the 20 valid tokens; the rest of the 32 are padding, which the blocks mask as
# keys.
#
# ## What the family needed
#
# A model is a *family*: one folder under `hyv_lib/models/`, behind `hyv_lib.models.family.ModelFamily`, with its
# presets, components, stage-1 recipe, denoising loop and model adapter (chapter 10 describes the structure). The
# next cell lists HunyuanVideo's folder, the modules of the other two families it imports, and reads the registry
# lines that name it.

# %%
folder = os.path.join(os.path.dirname(hyv_lib.__file__), "models", "hunyuan_video")
rows, borrowed = [], set()
for name in sorted(os.listdir(folder)):
    if not name.endswith(".py"):
        continue
    tree = ast.parse(open(os.path.join(folder, name)).read())
    borrowed |= {node.module.lstrip(".") for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                 and node.module and node.module.lstrip(".").startswith(("hunyuan_video15", "cogvideox"))}
    rows.append({"file": f"hyv_lib/models/hunyuan_video/{name}",
                 "lines": sum(1 for _ in open(os.path.join(folder, name))),
                 "what it holds": ast.get_docstring(tree).split("\n")[0]})
display(html_table(rows))
print(f"{sum(r['lines'] for r in rows)} lines in all; borrowed from the other families: {', '.join(sorted(borrowed))}")
for module in ("families", "registry"):
    source = open(os.path.join(os.path.dirname(hyv_lib.__file__), "models", f"{module}.py")).read()
    for node in ast.parse(source).body:  # each top-level statement that names the new family or adapter
        segment = ast.get_source_segment(source, node)
        if re.search(r"\bHUNYUAN_VIDEO(_FAMILY)?\b", segment):
            print(f"hyv_lib/models/{module}.py:{node.lineno}: {' '.join(segment.split())}")
print("registered families:", ", ".join(f"{name} ({type(family).__name__})" for name, family in FAMILIES.items()))

# %% [markdown]
# The attention processor reuses HunyuanVideo-1.5's self-attention processor (for the token refiner) and
# CogVideoX's view of a block with shared projections (for the single-stream blocks, which the processor then
# treats as dual-stream blocks whose two streams happen to share weights). Registering the family is an import and
# an entry in each of the two registries, the lines printed above; nothing outside `hyv_lib/models/` names the model
# (`tests/test_model_families.py` checks that).
#
# ### Two new questions on the adapter
#
# The runtimes drive a model through its adapter piece by piece: embed the timestep, the video and the context, run
# each block, apply the head. For HunyuanVideo-1.5 and CogVideoX the vector that modulates every block is the
# timestep embedding alone. HunyuanVideo's is the sum of three embeddings: the timestep's, the guidance scale's and
# the pooled CLIP vector's (diffusers' `CombinedTimestepGuidanceTextProjEmbeddings`). So `ModelAdapter` gained
#
# * `condition_embedding(model, temb, inputs)`: the whole modulation vector from the timestep's (by default the
#   timestep's itself). Every runtime that runs the pieces calls it after `time_embedding`; without it the JAX
#   runtime, Ulysses and the cached steps of DeepCache would all modulate the blocks with the timestep alone.
# * `condition_inputs(model, **forward_kwargs)`: what `condition_embedding` reads, taken from a forward's keyword
#   arguments, for the one runtime that runs diffusers' own forward and records only what enters a block (the
#   torch DeepCache: its cached steps must rebuild the vector from the pooled text and the guidance of the call).
#
# The next cell asks which adapters answer either question differently from the default, which runtime modules ask
# them, and what the tiny model computes if the pieces leave the guidance and pooled text out.

# %%
display(html_table([{"adapter": a.name,
                     "condition_embedding": "own" if type(a).condition_embedding is not ModelAdapter.condition_embedding
                     else "default (the timestep's)",
                     "condition_inputs": "own" if type(a).condition_inputs is not ModelAdapter.condition_inputs
                     else "default (none)"} for a in ADAPTERS.values()]))
callers = {os.path.basename(path): [q for q in ("condition_embedding", "condition_inputs") if q in open(path).read()]
           for path in sorted(glob.glob(os.path.join(os.path.dirname(runtimes_package.__file__), "*.py")))}
print("runtime modules asking:", "; ".join(f"{m} ({', '.join(q)})" for m, q in callers.items() if q))

components = build_tiny_components(tiny)
model = components["transformer"]
g = torch.Generator().manual_seed(0)
L = tiny.text_len
kwargs = dict(hidden_states=torch.randn(2, 16, 3, 12, 20, generator=g),  # [B, C, T, H, W]: 3 x 6 x 10 = 180 tokens
              timestep=torch.tensor([999.0, 400.0]),
              encoder_hidden_states=torch.randn(2, L, tiny.text_dim, generator=g),
              encoder_attention_mask=(torch.arange(L)[None] < torch.tensor([20, 5])[:, None]).float(),  # padded
              pooled_projections=torch.randn(2, tiny.transformer["pooled_projection_dim"], generator=g),
              guidance=torch.tensor([6000.0, 6000.0]))
with torch.no_grad():
    expected = model(**kwargs, return_dict=False)[0]  # diffusers' forward: the oracle


def pieces(adapter, module, inputs):
    """ModelAdapter.forward from prepare's tensors and the RoPE tables: the pieces as the runtimes drive them."""
    prepared = adapter.prepare(module, **{k: inputs[k] for k in adapter.conditioning})
    with torch.no_grad():
        return adapter.forward(module, inputs["hidden_states"], inputs["timestep"], prepared,
                               adapter.rope(module, inputs["hidden_states"].shape))


class TimestepOnly(HunyuanVideoAdapter):
    """The adapter as it would be without the new question: the timestep's embedding modulates the blocks."""

    def condition_embedding(self, model, temb, inputs):
        return temb


with_it, without = pieces(HUNYUAN_VIDEO, model, kwargs), pieces(TimestepOnly(), model, kwargs)
print(f"tiny model, max |pieces - diffusers' forward|: {(with_it - expected).abs().max():.1e} with condition_embedding,"
      f" {(without - expected).abs().max():.2f} with the "
      f"timestep alone (outputs up to {expected.abs().max():.2f})")

# %% [markdown]
# Only the new adapter answers either question differently from the default, and four runtime modules ask (the
# torch DeepCache both). Without the guidance and pooled text in the modulation the tiny model's output is off by
# 0.25 where it reaches 2.35 (the last line): tens of thousands of times the runtimes' differences in the next
# section, so no tolerance there could hide a runtime that forgot it.
#
# Two smaller changes came with the family: `Preset.guidance_embedded` (above), and the model family's training
# questions (`training_inputs`, `text_names`, `text_widths`), which the training loop now asks instead of assuming
# HunyuanVideo-1.5's batch.
#
# ## The tiny model against diffusers
#
# `hunyuanvideo_tiny` is HunyuanVideo's classes (`HunyuanVideoTransformer3DModel` with 2 dual- and 2
# single-stream blocks of 8 heads of 8, `AutoencoderKLHunyuanVideo`, a 3-layer Llama and a 2-layer CLIP) with
# seeded random weights and the real layout: the 1 x 2 x 2 patch, the padded text with its mask, the embedded
# guidance, the template crop. Its videos are noise; what it checks is that every runtime computes what diffusers
# computes. The inputs are the two samples above: 20 and 5 valid text tokens of 32. The first row sets every padded
# text token of the first sample to 100 and expects no change (a masked key contributes nothing); the others
# compare each way of running the model with diffusers' eager fp32 forward.

# %%
padded = dict(kwargs, encoder_hidden_states=kwargs["encoder_hidden_states"].clone())
padded["encoder_hidden_states"][0, 20:] = 100.0
rows = [("padded text tokens set to 100", "adapter pieces, diffusers' attention", pieces(HUNYUAN_VIDEO, model, padded)),
        ("", "adapter pieces, diffusers' attention", pieces(HUNYUAN_VIDEO, model, kwargs))]
ours = copy.deepcopy(model)
step = make_step(ours, "torch", attention="auto")  # installs hyv_lib's masked attention on `ours`
with torch.no_grad():
    rows.append(("", "torch runtime (hyv_lib's attention)", step(**kwargs)))
rows.append(("", "adapter pieces, hyv_lib's attention", pieces(HUNYUAN_VIDEO, ours, kwargs)))
t0 = time.perf_counter()
rows.append(("", "JaxTransformer, 1 device", hyv_lib.JaxTransformer(copy.deepcopy(model))(**kwargs)))
for mesh, sharding in (("tensor=8", "tp"), ("tensor=2,sequence=4", "tp_replicated_out"),
                       ("data=2,sequence=4", "fsdp")):
    if jax.device_count() >= 8:
        runtime = hyv_lib.JaxTransformer(copy.deepcopy(model), mesh=mesh, sharding=sharding)
        rows.append(("", f"JaxTransformer, {mesh}, rules {sharding}", runtime(**kwargs)))
display(html_table([{"input": note or "as given", "runs as": how,
                     "max |difference| vs diffusers": f"{(got - expected).abs().max():.1e}"}
                    for note, how, got in rows]))
print(f"outputs up to {expected.abs().max():.2f}; the JAX rows took {time.perf_counter() - t0:.0f} s (compiling)")

# %% [markdown]
# The pieces with diffusers' own attention processors reproduce its forward exactly, padded tokens or not: the
# adapter restates the glue and nothing else. hyv_lib's attention (SDPA over each sample's valid keys only) differs
# in the last bits of fp32, and the JAX runtime stays within a few millionths on one device and on every layout of
# the 8 emulated devices: the heads split 8 ways, a sequence axis (video tokens split between blocks, heads inside
# attention), and FSDP. The
# test suite checks the same with its tolerance of 1e-5 (`tests/test_hunyuan_video_family.py`,
# `tests/test_hunyuan_video_runtimes.py`; between them they also run Ulysses and FSDP2 on two processes, DeepCache
# and MagCache).
#
# Then the loop. `HunyuanVideoPipeline(output_type="latent")` and the family's `denoise` (its flow-matching
# schedule, the embedded guidance, one transformer call per step, on the torch runtime with hyv_lib's attention)
# start from the same latents and the same stage-1 tensors.

# %%
pipe = HunyuanVideoPipeline(**{name: components[name] for name in COMPONENTS})
pipe.set_progress_bar_config(disable=True)
start = torch.randn(tiny.latent_shape(96, 160, 9), generator=torch.Generator().manual_seed(1))
theirs = pipe(prompt_embeds=stage1["prompt_embeds"], pooled_prompt_embeds=stage1["pooled_prompt_embeds"],
              prompt_attention_mask=stage1["prompt_embeds_mask"], height=96, width=160, num_frames=9,
              num_inference_steps=tiny.default_steps, guidance_scale=tiny.guidance_scale, latents=start.clone(),
              output_type="latent").frames
conditioning = {"encoder_hidden_states": stage1["prompt_embeds"], "pooled_projections": stage1["pooled_prompt_embeds"],
                "encoder_attention_mask": stage1["prompt_embeds_mask"].float()}
mine = denoise(make_step(copy.deepcopy(model), "torch", attention="auto"), start.clone(), conditioning,
               type(components["scheduler"]).from_config(components["scheduler"].config),
               num_inference_steps=tiny.default_steps, guidance_scale=tiny.guidance_scale, guidance_embeds=True,
               progress=False)
print(f"{tiny.default_steps} steps, latents {list(start.shape)}, embedded guidance {tiny.guidance_scale:g}: "
      f"max |hyv_lib - HunyuanVideoPipeline| = {(mine - theirs).abs().max():.1e} (latents up to "
      f"{theirs.abs().max():.2f})")

# %% [markdown]
# ## A video through the public API
#
# The same model through the entry point a user calls: `hyv_lib.load_pipeline(PRESET)` loads the components once and
# `generate` runs stage 1, the loop and the VAE decode in memory. With the tiny preset its latents are also compared
# with `HunyuanVideoPipeline` run from the same seed (the pipeline draws its noise from a CPU generator; so does
# hyv_lib).

# %%
t0 = time.perf_counter()
api = pipe_api if PRESET == "hunyuanvideo_tiny" and not MODEL_PATH and RUNTIME == "torch" and not MESH else \
    hyv_lib.load_pipeline(PRESET, model_path=MODEL_PATH, runtime=RUNTIME, mesh=MESH, progress=False)
load_s = time.perf_counter() - t0
video = api.generate("a cat playing piano", height=HEIGHT, width=WIDTH, video_length=VIDEO_LENGTH,
                     num_inference_steps=STEPS, progress=False)
c = video.config
print(f"{c['preset']} on {c['runtime']}: {video.frames.shape[0]} frames of {video.frames.shape[1]}x"
      f"{video.frames.shape[2]}, {c['num_inference_steps']} steps, embedded guidance {c['guidance_scale']:g}, "
      f"seed {c['seed']}")
print(("load: the pipeline loaded for stage 1 above" if api is pipe_api else f"load {load_s:.1f} s")
      + f"; generate {c['time_s']:.2f} s: "
      f"stage 1 {c['stage1_encode_time_s']:.2f} s, denoising {c['denoise_time_s']:.2f} s, the rest (VAE decode) "
      f"{c['time_s'] - c['stage1_encode_time_s'] - c['denoise_time_s']:.2f} s")
if hyv_lib.get_preset(PRESET).name == "hunyuanvideo_tiny" and not MODEL_PATH:
    embeds = api.encode("a cat playing piano", "")
    reference = pipe(prompt_embeds=embeds["prompt_embeds"], pooled_prompt_embeds=embeds["pooled_prompt_embeds"],
                     prompt_attention_mask=embeds["prompt_embeds_mask"], height=c["height"], width=c["width"],
                     num_frames=c["video_length"], num_inference_steps=c["num_inference_steps"],
                     guidance_scale=c["guidance_scale"], generator=torch.Generator().manual_seed(c["seed"]),
                     output_type="latent").frames
    print(f"max |generate's latents - HunyuanVideoPipeline's from seed {c['seed']}| = "
          f"{(video.latents - reference).abs().max():.1e}")

# %%
figure = frame_grid(video.frames, columns=5, title=f"{PRESET}: 'a cat playing piano'"
                    + (" (random weights: noise)" if hyv_lib.get_preset(PRESET).is_tiny else ""))
plt.show()
scratch = tempfile.mkdtemp(prefix="hunyuanvideo_")
mp4 = video.save(os.path.join(scratch, "a_cat_playing_piano.mp4"))
display(video_html(mp4, width=320, media_dir="../_static/videos"))  # linked: the page refers to a copy of the file
shutil.rmtree(scratch, ignore_errors=True)  # the page has its copy; the scratch folder goes

# %% [markdown]
# ### Image to video
#
# The image-to-video checkpoint (`hunyuanvideo_i2v`, diffusers' conversion hunyuanvideo-community/HunyuanVideo-I2V-33ch)
# reads the first frame twice. Its text encoder is LLaVA: a CLIP vision tower turns the frame into 576 image tokens
# placed in the Llama's context before the prompt, and every second one is kept (288), so the prompt's hidden states
# have seen the picture. And the frame's VAE latents go in beside the noise on the channel axis: 16 noise + 16 image
# + 1 mask channel are the checkpoint's 33 input channels. The family's stage 1 calls
# `HunyuanVideoImageToVideoPipeline`'s own methods for both (`hyv_lib/models/hunyuan_video/first_frame.py`); like
# the pipeline, the video drops its first 4 decoded frames (129 frames give 125). At tiny size
# (`hunyuanvideo_i2v_tiny`: a LLaVA whose vision tower sees 32 x 32 pixels in 8-pixel patches), the stage-1 tensors
# against the pipeline's `encode_prompt`, then a video through `load_pipeline(...).generate(image=...)`:

# %%
from diffusers import HunyuanVideoImageToVideoPipeline

from hyv_lib.models.hunyuan_video import first_frame
from hyv_lib.models.hunyuan_video.components import I2V_COMPONENTS
from hyv_lib.models.hunyuan_video.presets import i2v_text_tokens, llava_image_tokens

i2v = hyv_lib.get_preset("hunyuanvideo_i2v_tiny")
i2v_api = hyv_lib.load_pipeline(i2v.name, progress=False)
picture = Image.new("RGB", (160, 96), (128, 128, 128))  # a gray frame with a red disc left of centre
ImageDraw.Draw(picture).ellipse((40, 32, 72, 64), fill=(220, 30, 30))
first = family_for(i2v).crop_image(i2v, picture)  # the bucket's crop, as stage 1 makes it
i2v_prompt = "a red circle moving left"  # shorter than the tiny window: the mask pads
ours = family_for(i2v).encode_texts(i2v_api.components, i2v, [i2v_prompt], images=[first])
pipe_i2v = HunyuanVideoImageToVideoPipeline(**{name: i2v_api.components[name] for name in I2V_COMPONENTS})
with torch.no_grad():
    embeds, pooled, mask = pipe_i2v.encode_prompt(
        image=first, prompt=i2v_prompt, device=torch.device("cpu"), max_sequence_length=i2v_text_tokens(i2v),
        prompt_template=first_frame.prompt_template(i2v, i2v_api.components["tokenizer"]))
kept = llava_image_tokens(i2v) // 2
print(f"stage 1 of {i2v.name}: {llava_image_tokens(i2v)} image tokens, {kept} kept; text states "
      f"{list(ours['prompt_embeds'].shape)}, {int(mask.sum())} of {i2v.text_len} valid ({kept} image + "
      f"{int(mask.sum()) - kept} text)")
print(f"max |hyv_lib - HunyuanVideoImageToVideoPipeline.encode_prompt|: text "
      f"{(ours['prompt_embeds'] - embeds).abs().max():.1e}, pooled "
      f"{(ours['pooled_prompt_embeds'] - pooled).abs().max():.1e}, masks equal: "
      f"{torch.equal(ours['prompt_embeds_mask'], mask.long())}")
clip = i2v_api.generate(i2v_prompt, image=picture, video_length=9, progress=False)
print(f"generate(image=...): {clip.config['task']}, {clip.frames.shape[1]}x{clip.frames.shape[2]} (the frame's "
      f"bucket), {clip.latents.shape[2]} latent frames decoded to 9, {clip.frames.shape[0]} kept")

# %% [markdown]
# ## MindSpeed-MM's LoRA recipe, mapped
#
# MindSpeed-MM, Huawei's multimodal training suite, documents HunyuanVideo's training in its guide
# (`examples/hunyuanvideo/README.md`, <https://gitcode.com/Ascend/MindSpeed-MM>; chapter 9 reads it for
# HunyuanVideo-1.5). Its image-to-video LoRA fine-tuning is three steps: extract the features of a `data.json` of
# clips once (VAE latents and text embeddings), run `examples/hunyuanvideo/i2v/pretrain_hunyuanvideo_lora.sh`
# on the converted I2V checkpoint, and merge the saved LoRA into the base weights with
# `merge_base_lora_weight.py --lora-target-modules linear fc1 fc2 img_attn_qkv img_attn_proj txt_attn_qkv
# txt_attn_proj linear1_qkv linear1_mlp linear2 proj_out --lora-alpha 64 --lora-r 64`. Those module names are the
# official checkpoint's: `img_*`/`txt_*` and `fc1`/`fc2` are the dual-stream blocks' two streams and MLPs,
# `linear1`/`linear2` the single-stream blocks' fused layers.
#
# | step | MindSpeed-MM's guide | `hyv_lib` |
# |---|---|---|
# | data | `data.json`: `{"path", "cap", "num_frames", "fps", "resolution"}` per clip | the same file |
# | features, once | `feature_extraction.sh` (VAE latents, text embeddings) | `extract_features --data_json ...` |
# | LoRA training | `pretrain_hunyuanvideo_lora.sh`, rank 64, alpha 64, the modules above | `train --lora_rank 64 --lora_alpha 64 --lora_targets attn,mlp,single` |
# | use it | `merge_base_lora_weight.py` writes merged weights | `generate --lora DIR` merges before placing the weights (or `merge_lora` writes a merged folder) |
#
# `hyv_lib` names layers by diffusers' modules, so its LoRA groups for this model are `attn` (every block's attention
# projections), `mlp` (every block's feed-forward layers) and `single` (every linear layer of the single-stream
# blocks, the fused `linear1`/`linear2` of the official names). The list's other two names, `linear` and
# `proj_out`, depend on MindSpeed-MM's own module names; `hyv_lib` has no group for the blocks' modulation layers,
# which `linear` may match. The file it writes is in diffusers' format: `HunyuanVideoPipeline.load_lora_weights`
# reads it.
#
# MindSpeed-MM fine-tunes the *image-to-video* checkpoint; `hyv_lib` trains either. For an I2V preset,
# `extract_features` writes what the I2V pipeline computes for each clip's first frame: LLaVA's text states read
# with that frame (so two clips with one caption get different text), CLIP's pooled vector, and the frame's VAE
# latents (`cond_latents`); `train --task i2v` feeds the 33-channel input (noisy latents, the frame's latents in
# latent frame 0, a mask) as the pipeline's loop builds it. At tiny size the features and the batch equal
# `HunyuanVideoImageToVideoPipeline`'s own with difference 0, and the loss equals diffusers' eager forward's
# (`tests/test_hunyuan_video_i2v_training.py`). At real
# size the commands are (the model folder is `HYV_MODEL_PATH` when set):

# %%
real_path = MODEL_PATH or "/path/to/HunyuanVideo"  # a diffusers-format folder (hunyuanvideo-community/HunyuanVideo)
print("\n".join([
    f"python -m hyv_lib extract_features --data_json dataset/data.json --preset hunyuanvideo_t2v --model_path "
    f"{real_path} --fps 24 --frames random --output_dir features",
    f"python -m hyv_lib train --features features --preset hunyuanvideo_t2v --model_path {real_path} --lora_rank 64 "
    "--lora_alpha 64 --lora_targets attn,mlp,single --steps 2000 --learning_rate 1e-4 --output_dir lora",
    f"python -m hyv_lib generate --preset hunyuanvideo_t2v --model_path {real_path} --prompt \"...\" --lora lora "
    "--output_dir video"]))
layers = lora_target_names(real, "attn,mlp,single")
modules = dict(real.named_modules())
lora_params = sum(64 * (modules[n].in_features + modules[n].out_features) for n in layers)
print(f"\nat real size: {len(layers)} linear layers adapted, a rank-64 LoRA of {lora_params:,} parameters "
      f"({lora_params / count(real):.2%} of the DiT); attn,mlp alone adapts {len(lora_target_names(real, 'attn,mlp'))}")
print("\nthe guide's image-to-video LoRA (its checkpoint: hunyuanvideo-community/HunyuanVideo-I2V-33ch):")
print("\n".join([
    "python -m hyv_lib extract_features --data_json dataset/data.json --preset hunyuanvideo_i2v --model_path "
    "/path/to/HunyuanVideo-I2V --task i2v --fps 24 --frames random --output_dir features_i2v",
    "python -m hyv_lib train --features features_i2v --preset hunyuanvideo_i2v --model_path /path/to/HunyuanVideo-I2V "
    "--task i2v --lora_rank 64 --lora_alpha 64 --lora_targets attn,mlp,single --output_dir lora_i2v",
    "python -m hyv_lib generate --preset hunyuanvideo_i2v --model_path /path/to/HunyuanVideo-I2V --image_path "
    "first.png --prompt \"...\" --lora lora_i2v --output_dir video_i2v"]))

# %% [markdown]
# `single` adds nothing to `attn,mlp` here: the single-stream blocks' Q/K/V are in `attn` and their `proj_mlp` and
# `proj_out` in `mlp`, so the three groups adapt the same layers as two (the flag keeps the official names' third
# group readable). The LoRA is about 2% of the model's weights.
#
# The same three commands at tiny size, on four generated images (a PNG in a `data.json` is a one-frame clip, as
# MindSpeed-MM reads images), with the recipe's rank, alpha and targets and a few optimizer steps. At the tiny width
# of 64 a rank-64 LoRA is not low-rank at all; the run checks the path, not the method.

# %%
work = tempfile.mkdtemp(prefix="hunyuanvideo_lora_")
shapes = [("red", "circle"), ("blue", "square"), ("green", "triangle"), ("yellow", "circle")]
entries, images = [], []
for i, (colour, shape) in enumerate(shapes):
    image = Image.new("RGB", (160, 96), "black")
    draw = ImageDraw.Draw(image)
    {"circle": lambda: draw.ellipse((50, 18, 110, 78), fill=colour),
     "square": lambda: draw.rectangle((50, 18, 110, 78), fill=colour),
     "triangle": lambda: draw.polygon([(80, 14), (115, 80), (45, 80)], fill=colour)}[shape]()
    image.save(os.path.join(work, f"image{i}.png"))
    images.append(np.asarray(image))
    entries.append({"path": f"image{i}.png", "cap": f"a {colour} {shape}"})
json.dump(entries, open(os.path.join(work, "data.json"), "w"))
figure = frame_grid(np.stack(images), columns=4, title="the four training images, 96x160", scale=1.5)
plt.show()

t0 = time.perf_counter()
assert run(["extract_features", "--data_json", os.path.join(work, "data.json"), "--preset", "hunyuanvideo_tiny",
            "--output_dir", os.path.join(work, "features"), "--quiet"]) == 0
features = FeatureSet(os.path.join(work, "features"))
print(f"extract_features: {len(features)} clips in {time.perf_counter() - t0:.1f} s; latents "
      f"{list(features[0]['latents'].shape)} per clip; text tensors {features.text_names}")
t0 = time.perf_counter()
assert run(["train", "--features", os.path.join(work, "features"), "--preset", "hunyuanvideo_tiny",
            "--lora_rank", "64", "--lora_alpha", "64", "--lora_targets", "attn,mlp,single", "--steps", "4",
            "--batch_size", "2", "--learning_rate", "1e-3", "--warmup_steps", "0",
            "--output_dir", os.path.join(work, "lora"), "--quiet"]) == 0
log = [json.loads(line) for line in open(os.path.join(work, "lora", "train_log.jsonl"))]
lora_file = os.path.join(work, "lora", "pytorch_lora_weights.safetensors")
print(f"train: {len(log)} steps of 2 clips in {time.perf_counter() - t0:.1f} s; losses "
      + ", ".join(f"{r['loss']:.3f}" for r in log) + f"; wrote {sorted(os.listdir(os.path.join(work, 'lora')))}")
print(f"the LoRA file: {len(load_file(lora_file))} tensors (A and B of "
      f"{len(lora_target_names(model, 'attn,mlp,single'))} layers: attn {len(lora_target_names(model, 'attn'))}, "
      f"mlp {len(lora_target_names(model, 'mlp'))}, single {len(lora_target_names(model, 'single'))})")

# %% [markdown]
# Four steps on four images teach the model nothing; the losses only show that the step runs. What is checked is
# what the file means. `HunyuanVideoPipeline.load_lora_weights` followed by `fuse_lora` (diffusers' own reading of
# the file) should give the weights `hyv_lib`'s merge gives, and `generate --lora` should run the merged model.

# %%
merged = copy.deepcopy(components["transformer"])
merge_lora(merged, lora_file)
fresh = build_tiny_components(tiny)
lora_pipe = HunyuanVideoPipeline(**{name: fresh[name] for name in COMPONENTS})
lora_pipe.load_lora_weights(os.path.join(work, "lora"))
lora_pipe.fuse_lora()
fused = {n.replace(".base_layer.", "."): p for n, p in lora_pipe.transformer.named_parameters() if "lora_" not in n}
worst = max((p - fused[n]).abs().max().item() for n, p in merged.named_parameters())
moved = max((p - q).abs().max().item() for p, q in zip(merged.parameters(), components["transformer"].parameters()))
print(f"max |hyv_lib's merge - diffusers' fuse_lora| = {worst:.1e}; the LoRA moved a weight by up to {moved:.1e}")
common = ["--preset", "hunyuanvideo_tiny", "--prompt", "a red circle", "--seed", "3", "--quiet"]
assert run(["generate", *common, "--output_dir", os.path.join(work, "base")]) == 0
assert run(["generate", *common, "--lora", os.path.join(work, "lora"),
            "--output_dir", os.path.join(work, "tuned")]) == 0
base, tuned = (load_file(os.path.join(work, d, "stage2_latents.safetensors"))["latents"] for d in ("base", "tuned"))
recorded = json.load(open(os.path.join(work, "tuned", "generation_config.json")))
print(f"generate --lora: rank {recorded['lora_rank']} recorded; max |latents with - without| = "
      f"{(tuned - base).abs().max():.2f}")
shutil.rmtree(work, ignore_errors=True)  # the clips, features, LoRA and both runs: scratch, not kept

# %% [markdown]
# ### The parallel settings
#
# MindSpeed-MM's guide sizes a run with four settings, each with its `hyv_lib` counterpart. Two rules carry over
# exactly: the heads must divide by the product of the tensor and sequence splits (MindSpeed-MM: `TP * CP` must
# divide the 24 heads; `hyv_lib`: `tensor x sequence`, which both `JaxTransformer` and `JaxTrainStep` check), and
# ZeRO-style weight sharding replaces tensor-parallel weights rather than adding to them (in `hyv_lib` a rule set is
# one or the other).
#
# | MindSpeed-MM | what it does there | `hyv_lib` |
# |---|---|---|
# | `TP` (Megatron tensor parallel) | splits each block's weights; `TP * CP` must divide the heads | the `tensor` mesh axis with the `tp` or `tp_replicated_out` {term}`rule set` (sampling, `--runtime jax`); in `train`, `tensor` splits the heads while FSDP holds the weights |
# | `CP` (Ulysses sequence parallel) | splits the video tokens; all-to-all to heads inside attention | the `sequence` mesh axis (tokens split between blocks, heads split inside attention: {term}`Ulysses` within the mesh); `--runtime ulysses` under `torchrun` for sampling with torch |
# | `--sequence-parallel` (TP-SP) | also splits LayerNorm and Dropout activations along the sequence under TP | no separate switch: on a mesh the activations between blocks stay split over `sequence` |
# | `--layerzero` (ZeRO-3 per layer) | shards the weights, gathers a layer as it runs; only with `TP=1` | {term}`FSDP`: `train --runtime jax --mesh ...` (weights, fp32 masters and AdamW moments over every device, each block gathered as it runs), FSDP2 under `torchrun` on `--runtime torch`, `--sharding fsdp` / `--shard_weights fsdp` for sampling |
# | selective recomputation, attention activations offloaded | recompute some blocks, move attention activations to the host | every block rematerialised ({term}`remat`, on by default); no activation offload |
#
# The guide also says its HunyuanVideo I2V task supports neither CP nor TP-SP yet. The next cell applies the
# shared head rule to 8 devices, and shows what `hyv_lib` lays out when no mesh is given.

# %%
heads = t2v.transformer["num_attention_heads"]
valid = [(tp, cp) for tp in (1, 2, 4, 8) for cp in (1, 2, 4, 8) if tp * cp <= 8 and heads % (tp * cp) == 0]
print(f"{heads} heads; (TP, CP) = (tensor, sequence) pairs on at most 8 devices that divide them: "
      + ", ".join(f"({tp}, {cp})" for tp, cp in valid))
for devices in (8, 16):
    sampling, training = default_layout(devices, heads, batch=1), default_layout(devices, heads, "fsdp", batch=1)
    print(f"{devices} devices, no mesh given: sampling {sampling}, FSDP rules {training}")

# %% [markdown]
# Every power-of-two split up to 8 divides 24, so on 8 devices the head rule costs nothing; on 16 it does, and the
# default layout leaves 4 devices idle (24 heads do not split 16 ways) rather than guess.
#
# ## Real size, compiled here
#
# `python -m hyv_lib compile --preset hunyuanvideo_t2v` builds the 12.8B transformer on the `meta` device, places its
# abstract weights with the adapter's rules on a mesh of a *deviceless* TPU slice, and hands one denoising step (one
# sample: the guidance is embedded) at 720x1280x129 to the TPU compiler. `benchmarks/hunyuanvideo_compile.py` ran it
# for a v6e-8 and a v5p-8 and saved the compiler's reports; the planner (`hyv_lib.planning.planner.device_plan`, which
# now counts the single-stream blocks) is beside each row. The next cell reads them.

# %%
reports = sorted(glob.glob("../benchmarks/results/hunyuanvideo_compile_*.json"))
runs = json.load(open(reports[-1]))["runs"] if reports else {}
print(f"{os.path.basename(reports[-1]) if reports else 'no saved compiles'}: {len(runs)} configurations "
      "(python benchmarks/hunyuanvideo_compile.py)")
from hyv_lib.planning.planner import device_plan  # noqa: E402
from hyv_lib.planning.train_check import model_of_compiled  # noqa: E402

flops = step_flops(t2v, 720, 1280, 129)
print(f"one step at 720x1280x129: {flops['tokens']['joint']:,} tokens, {flops['total'] / 1e15:.2f} PFLOP, "
      f"{flops['attention_share']:.0%} of it attention")
rows, train_rows, failed = [], [], []
for name, r in sorted(runs.items()):
    kind, slice_, mesh, rules = name.split("/")
    if "error" in r:
        failed.append(f"{name}: stopped after {r['wall_seconds']:.0f} s without a report (the benchmark's markdown "
                      "says why)")
        continue
    sent = sum(op["sent_bytes"] for op in r["collective_ops"])
    compiled = {"slice": slice_, "mesh": mesh, **({} if kind == "lora" else {"rules": rules}),
                "fits": "yes" if r["fits"] else "no",
                "GiB per device": f"{r['per_device_bytes']['total'] / 2**30:.2f}",
                "of usable GiB": f"{r['hbm_available_per_device'] / 2**30:.2f}"}
    if kind == "lora":  # the train step: the training memory model beside it (hyv_lib.planning.train_memory)
        model = model_of_compiled(r)
        train_rows.append({**compiled, "planner GiB": f"{model['model_total'] / 2**30:.2f}",
                           "state GiB: planner / compiler": f"{model['model_state'] / 2**30:.2f} / "
                                                            f"{model['compiled_arguments'] / 2**30:.2f}",
                           "matmul TFLOP / device": f"{r['matmul_flops_per_device'] / 1e12:.1f}",
                           "GB sent / device": f"{sent / 1e9:.1f}", "compile s": f"{r['compile_seconds']:.0f}"})
        continue
    plan = device_plan(t2v, 720, 1280, 129, r["mesh"], r["sharding"])
    rows.append({**compiled, "planner GiB": f"{plan['per_device_bytes']['total'] / 2**30:.2f}",
                 "matmul TFLOP / device": f"{r['matmul_flops_per_device'] / 1e12:.1f}",
                 "planner": f"{plan['flops']['linear'] / 1e12:.1f}",
                 "GB sent / device": f"{sent / 1e9:.1f}", "planner GB": f"{plan['sent_bytes'] / 1e9:.1f}"})
print("one denoising step:")
display(html_table(rows))
print("the LoRA train step (rank 64 on attn,mlp,single; FSDP over every device; remat per block; batch 1):")
display(html_table(train_rows))
for line in failed:
    print("not compiled:", line)

# %% [markdown]
# Every step layout fits, on both slices, and so does the LoRA train step of the guide's recipe (rank 64 on
# `attn,mlp,single`, 440 layers), with FSDP over every device and each block recomputed in the backward pass. The
# train step runs the 20 dual- and the 40 single-stream blocks as two `lax.scan` loops over their stacked weights
# (`JaxTrainStep(scan_blocks=True)`, the default; tested against diffusers' autograd at tiny size in
# `tests/test_hunyuan_video_training.py`): the compiler sees two blocks, not 60. Unrolled, the same program was killed
# for memory on this 23 GiB machine after 976 s of compiling (an earlier session's run).
#
# The planner agrees with the compiler on every step row: its matmul FLOPs and bytes sent match (the `planner`
# columns), and its memory is within 9% of the compiler's total less the generated code (whose size the benchmark's
# markdown lists). It models what XLA does around the single-stream blocks (`hyv_lib.planning.layout`): on a
# `sequence` axis, extra all-to-alls of the joint sequence; under `fsdp` with a `tensor` axis, Q/K/V computed on their
# shards rather than gathered. For the train step the memory model counts the state (weights, fp32 masters, AdamW
# moments) to within 1% but gives 70-74% of the compiled total: the single-stream blocks' recomputed activations are
# modelled as a dual-stream block's.
#
# One finding is this model's own. On any tensor axis the 40 single-stream blocks add all-to-alls that the
# dual-stream blocks do not: their `proj_out` reads the attention output and the MLP output concatenated (3,072 +
# 12,288 features), and a tensor split of that input is `t` contiguous chunks, not each device's heads followed by
# its MLP columns, so XLA re-shards the pieces (the benchmark's markdown,
# `benchmarks/results/hunyuanvideo_compile_2026-11-28_cpu_libtpu.md`, lists them: about a quarter of the bytes each
# v6e device sends at the default layout). Splitting `proj_out` into its attention and MLP column blocks, two
# row-parallel matmuls summed, should avoid them; the rule sets do not do it yet.
#
# ## Not here yet
#
# The GPU step (`python benchmarks/gpu_check.py --sections hunyuanvideo`, one CFG-free step against diffusers' stock
# forward) waits for a GPU session. The single-stream blocks' split `proj_out` (above) is not tried.

# %%
print(f"the chapter ran in {time.perf_counter() - CHAPTER_START:.0f} s")

# %% [markdown]
# ## Summary
#
# * HunyuanVideo (13B) is `hyv_lib`'s third family: one folder (`hyv_lib/models/hunyuan_video/`, presets for
#   text-to-video, latent-concat image-to-video and a tiny twin of each), an import and an entry in each registry, and two
#   new questions on the model adapter. Its attention processor reuses the other two families' pieces.
# * What is new is the model: 20 dual-stream blocks then 40 single-stream ones (one set of weights over
#   [video ; text]); a guidance-distilled checkpoint whose guidance scale is an input, so one sample per step
#   (`Preset.guidance_embedded`, `samples_per_step` 1) and a default mesh without a data axis; Llama tokens with a
#   padding mask plus a pooled CLIP vector that modulates the blocks.
# * The modulation is the sum of the timestep, guidance and pooled-text embeddings, so the adapter gained
#   `condition_embedding` (every runtime calls it) and `condition_inputs` (for the runtime that records only block
#   inputs). Leaving them out puts the tiny model's output off by about a tenth of its
#   largest value.
# * At tiny size, with a padded text mask, the adapter's pieces equal diffusers' forward exactly; the torch runtime
#   and the JAX runtime on one and on 8 emulated devices stay within a few millionths; the loop ends within 5e-7 of
#   `HunyuanVideoPipeline`'s latents from the same start, and `load_pipeline(...).generate` within 5e-7 of its
#   latents from the same seed.
# * MindSpeed-MM's rank-64 LoRA recipe maps onto `extract_features` -> `train --lora_rank 64 --lora_alpha 64
#   --lora_targets attn,mlp,single` -> `generate --lora`, and its TP / CP / layerzero onto the `tensor` axis, the
#   `sequence` axis and FSDP, with the same head rule. The trained file is one diffusers reads and fuses into the same
#   weights. It trains both checkpoints: for image to video, the features read each clip's first frame as
#   `HunyuanVideoImageToVideoPipeline` does (equal to it at tiny size, as the I2V generation is).
# * At real size (720x1280x129, one sample, 12.07 PFLOP a step) the compiled step fits a v6e-8 and a v5p-8 in every
#   layout tried; the CLI's default, `tensor=8` with `tp_replicated_out`, takes 20.08 of the 31.25 usable GiB per v6e
#   chip. The single-stream blocks' fused output projection costs all-to-alls on any tensor axis. The rank-64 LoRA
#   train step fits both slices too, its two kinds of blocks as two scans.
#
# ## Exercises
#
# Marked ★ (easy) to ★★★ (hard), and *open* where no one has the answer yet ({ref}`notation-exercises`).
#
# 1. ★ How many video tokens does HunyuanVideo see at 544x960 and 129 frames, and how many token rows does one
#    step feed the DiT?
# 2. ★ With 16 devices and no mesh given, `hyv_lib` samples HunyuanVideo on 12 of them. Why not 16, and what would
#    the default layout do for HunyuanVideo-1.5 (16 heads, CFG) on the same 16?
# 3. ★★ From the config alone (width $d = 3072$, head_dim 128, MLP $4d$, every linear layer with a bias), count the
#    weights of one dual-stream and one single-stream block, and say where the single-stream block saves.
# 4. ★★ A rank-$r$ LoRA on a linear layer with $n_\text{in}$ inputs and $n_\text{out}$ outputs adds
#    $r (n_\text{in} + n_\text{out})$ parameters. Derive the rank-64 count printed for `attn,mlp,single` at real
#    size.
# 5. ★★★ *open* The I2V train step noises latent frame 0 too and counts it in the loss (Tencent's HunyuanVideo-I2V
#    trainer does the same), although the condition channels hold that frame's clean latents and generation drops
#    the first 4 decoded frames. Argue for or against leaving frame 0 out of the loss, and say what you would measure
#    on the tiny model to decide.
#
# :::{admonition} Answers
# :class: dropdown
# 1. $(129 - 1)/4 + 1 = 33$ latent frames; one token per 16 x 16 pixels (8x VAE, 2 x 2 patch): $544/16 = 34$ by
#    $960/16 = 60$, so $33 \times 34 \times 60 = 67{,}320$ video tokens. One sample per step (embedded guidance), plus
#    256 text tokens: $67{,}576$ rows.
# 2. `tensor` x `sequence` must divide the 24 heads, and with one sample per step a `data` axis has nothing to split;
#    the largest divisor of 24 that is at most 16 is 12, so 12 devices work and 4 idle (`default_layout(16, 24,
#    batch=1)` gives `tensor=12`; the jax runtime's log line says why). HunyuanVideo-1.5 puts its CFG pair on `data=2`
#    and its 16 heads on `tensor=8`: all 16 devices.
# 3. Write $L(i, o) = io + o$. Dual-stream: two AdaLN-Zero modulations $2L(d, 6d)$, Q/K/V and outputs of both
#    streams $8L(d, d)$, four RMS QK-norms of $128$, two MLPs $2(L(d, 4d) + L(4d, d))$: $113{,}283{,}072 +
#    75{,}522{,}048 + 512 + 151{,}025{,}664 = 339{,}831{,}296$. Single-stream: one modulation $L(d, 3d)$, Q/K/V
#    $3L(d, d)$, two norms of $128$, `proj_mlp` $L(d, 4d)$, `proj_out` $L(5d, d)$ over [attention ; MLP]:
#    $28{,}320{,}768 + 28{,}320{,}768 + 256 + 37{,}761{,}024 + 47{,}188{,}992 = 141{,}591{,}808$. The single block
#    has one stream's weights instead of two, a modulation of 3 vectors instead of 6, and its attention output
#    projection folded into `proj_out`: 2.40 times fewer weights, as the chapter printed.
# 4. Dual-stream block: 8 attention projections of $d \to d$, $8 \times 64 \times 6{,}144 = 3{,}145{,}728$; four MLP
#    layers ($d \to 4d$ and $4d \to d$ per stream), $4 \times 64 \times 15{,}360 = 3{,}932{,}160$; in all
#    $7{,}077{,}888$. Single-stream block: Q/K/V $3 \times 64 \times 6{,}144 = 1{,}179{,}648$, `proj_mlp`
#    $64 \times 15{,}360 = 983{,}040$, `proj_out` $64 \times (15{,}360 + 3{,}072) = 1{,}179{,}648$; in all
#    $3{,}342{,}336$. $20 \times 7{,}077{,}888 + 40 \times 3{,}342{,}336 = 275{,}251{,}200$ over $20 \times 12 +
#    40 \times 5 = 440$ layers.
# 5. For: given the clean frame in the condition, frame 0's velocity is nearly a copy (the target is noise - x0 with
#    x0 known), so its term teaches copying, which sampling needs only for a frame it then drops; leaving it out puts
#    the whole loss on the frames the user sees. Against: the term is cheap, keeps the model's behaviour on frame 0
#    consistent with the base checkpoint's, and removing it rescales the loss by T / (T - 1), which interacts with the
#    learning rate. To decide: train two LoRAs from the same seeds (frame 0 in and out of the loss) on the same clips
#    and compare held-out I2V videos on frames 1 onward (error against the clips, or a read-back as chapter 9 does),
#    and the loss on frames 1 onward, over several seeds. No one has measured it here.
# :::
