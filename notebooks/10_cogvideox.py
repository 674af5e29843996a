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
# # 10. Another model: CogVideoX1.5 on TPU
#
# Every chapter so far ran one model. This one runs a second, CogVideoX1.5-5B (Zhipu AI and Tsinghua University's
# 5.6-billion-parameter video {term}`DiT`, `zai-org/CogVideoX1.5-5B`), on the same runtimes, meshes, caches, compile
# path and planner, and asks two questions: *what carried over unchanged*, and *what had to change*. The only other
# public TPU port of it is gpu-tpu-pedia's (a single author's scripts); maxdiffusion has none.
#
# 1. **The two models side by side**: the shapes that differ, read from the presets and the diffusers classes.
# 2. **What carried over**: the model adapter, the one place that knows a model; no runtime imports one.
# 3. **What had to change**: a fixed 226-token {term}`T5` context with no padding mask, 3D {term}`RoPE` with a
#    temporal patch, a head dimension of 64 on the {term}`MXU`, and another {term}`VAE`.
# 4. **The tiny model, live**: the diffusers classes at tiny widths with seeded weights, checked against diffusers'
#    forward on 1 and 8 emulated devices, then the pipeline against diffusers' `CogVideoXPipeline`, and a video.
# 5. **Real size, compiled here**: the 5.6B step compiled for a v6e-8 with the two layouts gpu-tpu-pedia timed, and
#    what the compiled programs say about its 1.58x.
#
# :::{figure} ../book/figures/10_cogvideox_vs_hunyuanvideo.svg
# :name: fig-10-cogvideox-vs-hunyuanvideo
#
# The two models side by side. HunyuanVideo-1.5's blocks keep video and text in two streams with their own
# weights, meeting only in the attention; CogVideoX1.5's blocks run one joint [text ; video] sequence through one
# set of weights. CogVideoX's context is always 226 T5 tokens with no mask; its latents are frames first, and 81
# frames make 21 latent frames, padded to 22 for the temporal patch of 2; its heads are 64 wide; it samples with
# DDIM and v-prediction. Everything in the gray box serves both models unchanged; the model-specific code is one
# adapter and one family folder.
# :::
#
# The chapter runs on a 2-core CPU in under a minute; the real-size numbers come from saved compiler reports and one
# GPU run.

# %% tags=["parameters"]
import os

# The live part runs cogvideox_tiny (random weights); with HYV_PRESET=cogvideox1.5_5b and HYV_MODEL_PATH=<a diffusers
# CogVideoX1.5-5B folder> it generates with the real model instead (HYV_RUNTIME jax or torch, HYV_MESH, HYV_HEIGHT x
# HYV_WIDTH x HYV_VIDEO_LENGTH, HYV_STEPS; default 768x1360x81, 50 steps: a TPU or GPU, not this CPU).
PRESET = os.environ.get("HYV_PRESET", "cogvideox_tiny")
MODEL_PATH = os.environ.get("HYV_MODEL_PATH") or None
RUNTIME = os.environ.get("HYV_RUNTIME", "jax")
MESH = os.environ.get("HYV_MESH") or None
HEIGHT = int(os.environ.get("HYV_HEIGHT", 0)) or None
WIDTH = int(os.environ.get("HYV_WIDTH", 0)) or None
VIDEO_LENGTH = int(os.environ.get("HYV_VIDEO_LENGTH", 0)) or None
STEPS = int(os.environ.get("HYV_STEPS", 0)) or None
N_DEVICES = int(os.environ.get("HYV_N_DEVICES", "8"))  # emulated CPU devices for the mesh checks
from hyv_lib.notebook.display import settings_not_used  # noqa: E402

_ = settings_not_used({"HYV_ATTENTION": "the runtimes' default (Splash on a TPU, XLA's kernel on the emulated CPU "
                                        "devices, SDPA on torch) is what is compared with diffusers"})

# %%
# Emulated devices must be requested before JAX initialises its CPU backend.
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={N_DEVICES}"
import ast
import copy
import glob
import io
import json
import logging
import shutil
import tempfile
import warnings

warnings.filterwarnings("ignore", message="IProgress not found")
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
warnings.filterwarnings("ignore", message="os.fork", category=RuntimeWarning)
logging.getLogger("jax").setLevel(logging.ERROR)

import jax
import matplotlib.pyplot as plt
import torch
from diffusers import CogVideoXPipeline
from diffusers.utils import logging as diffusers_logging
from IPython.display import Image, display
from safetensors import safe_open

import hyv_lib
import hyv_lib.runtimes as runtimes_package
from hyv_lib.cli.commands import run
from hyv_lib.models.cogvideox.adapter import latent_frames, rotary_tables, video_tokens
from hyv_lib.models.cogvideox.recipe import denoise_cogvideox, make_scheduler
from hyv_lib.models.components import build_tiny_components
from hyv_lib.models.families import FAMILIES
from hyv_lib.models.registry import ADAPTERS, get_adapter
from hyv_lib.notebook.display import frame_grid, html_table
from hyv_lib.pipeline.text import encode_pair
from hyv_lib.pipeline.video_io import read_mp4
from hyv_lib.planning.costs import step_flops
from hyv_lib.planning.hardware import CHIPS
from hyv_lib.runtimes.step import make_step

diffusers_logging.set_verbosity_error()
torch.manual_seed(0)
print(jax.device_count(), "emulated devices:", jax.devices()[0].platform)

# %% [markdown]
# ## The two models side by side
#
# Both are diffusers classes (`HunyuanVideo15Transformer3DModel`, `CogVideoXTransformer3DModel`) described by a
# `hyv_lib` preset: the config the diffusers conversion script writes for the checkpoint, and the pipeline settings.
# The next cell builds each real transformer on the `meta` device (shapes, no memory) and counts what a step sees at
# 720x1280.

# %%
hunyuan, cogvideox = hyv_lib.get_preset("720p_t2v"), hyv_lib.get_preset("cogvideox1.5_5b")


def describe(preset, frames):
    """One column of the comparison: the preset's transformer and its tokens at 720x1280 x ``frames``."""
    config = preset.transformer
    with torch.device("meta"):
        params = sum(p.numel() for p in get_adapter(preset.model).build(config).parameters())
    flops = step_flops(preset, 720, 1280, frames)
    return {"blocks": config["num_layers"],
            "heads x head_dim": f"{config['num_attention_heads']} x {config['attention_head_dim']}",
            "width": config["num_attention_heads"] * config["attention_head_dim"],
            "parameters": f"{params / 1e9:.2f} B",
            "patch (t x h x w)": f"{config.get('patch_size_t') or 1} x {config['patch_size']} x {config['patch_size']}",
            "VAE compression (t, h/w)": f"{preset.temporal_compression}x, {preset.spatial_compression}x",
            "text encoder, context tokens": ("Qwen2.5-VL + ByT5 (+ SigLIP), 1,985 padded" if preset.model != "cogvideox"
                                             else "T5-XXL, 226 (pads attended, no mask)"),
            f"video tokens at 720x1280": f"{flops['tokens']['video']:,} ({frames} frames)",
            "PFLOP per CFG step": f"{flops['total'] / 1e15:.1f}",
            "attention share": f"{flops['attention_share']:.0%}",
            "sampler": "flow matching, Euler" if preset.model != "cogvideox" else "DDIM, v-prediction"}


side = {"HunyuanVideo-1.5 (720p_t2v)": describe(hunyuan, 121), "CogVideoX1.5-5B": describe(cogvideox, 81)}
display(html_table([{"": key, **{name: column[key] for name, column in side.items()}}
                    for key in next(iter(side.values()))]))

# %% [markdown]
# CogVideoX is the smaller program. It has two thirds of the parameters. Per frame it has the same token grid at
# 720x1280 (an 8x VAE with a 2x2 patch gives 45 x 80, as HunyuanVideo's 16x VAE with a 1x1 patch does), but its
# temporal patch of 2 makes one token frame per 8 video frames instead of 4, and its default video is 81 frames
# instead of 121: 35% of the video tokens and a fifth of the FLOPs per step (the table's last rows). Its blocks are
# also simpler: one joint attention over [text ; video] with shared projections, where HunyuanVideo's blocks keep
# two streams with their own weights.
#
# ## What carried over: the adapter is the only place that knows a model
#
# `hyv_lib`'s runtimes (the torch one, the JAX/torchax one with its meshes, Ulysses, FSDP2, DeepCache, MagCache), the
# compile-for-TPU path and the planner are written against `hyv_lib.models.adapter.ModelAdapter`: *prepare* the
# prompt-only inputs once, embed the timestep, the video and the context, run each block, apply the output head,
# unpatchify, and name the weight-placement rules. A second model is a second adapter. The next cell prints both and
# reads every runtime module's imports for a model module.

# %%
rows = []
for adapter in ADAPTERS.values():
    rows.append({"adapter": adapter.name, "diffusers class": ", ".join(adapter.model_classes),
                 "conditioning keywords": ", ".join(adapter.conditioning),
                 "per-block inputs": ", ".join(adapter.block_keys) or "none",
                 "rule sets": ", ".join(adapter.rule_sets),
                 "timestep dtype": str(adapter.timestep_dtype or "the model's").replace("torch.", "")})
display(html_table(rows))
imports = {}  # runtime module -> the model modules it imports (the structure would say: none)
for path in sorted(glob.glob(os.path.join(os.path.dirname(runtimes_package.__file__), "*.py"))):
    tree = ast.parse(open(path).read())
    found = [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
             and any(model in node.module for model in ("hunyuan", "cogvideox"))]
    if found:
        imports[os.path.basename(path)] = found
print(f"{len(glob.glob(os.path.join(os.path.dirname(runtimes_package.__file__), '*.py')))} runtime modules; "
      f"those importing a model's module: {imports or 'none'}")

# %% [markdown]
# The CogVideoX adapter (`hyv_lib/models/cogvideox/adapter.py`, about 240 lines, and its attention processor, about 100) is
# everything CogVideoX-specific in the runtimes' path. What the runtimes needed from the structure was two small
# generalisations, both on the adapter: how many video tokens a latent shape holds (Ulysses shards them; one per
# latent pixel for HunyuanVideo, one per 2x2x2 patch here), and what dtype the timestep reaches the model in
# (CogVideoX's pipeline passes integer timesteps that diffusers embeds in float32; in bf16, 999 would round to 1000).

# %% [markdown]
# ## One folder per model
#
# The adapter runs the transformer; the rest of what makes a model (its components and how each is built, loaded and
# saved, its text encoder's recipe, its denoising loop and scheduler, the layout its VAE decodes, which settings it
# takes) is its *family*'s, the interface
# `hyv_lib.models.family.ModelFamily`. Each family is one folder under `hyv_lib/models/`, found by a preset's `model`
# in one registry line (`hyv_lib.models.families.FAMILIES`); the stage functions, the in-memory pipeline, the planner
# and the settings checks call it and never name a model (`tests/test_model_families.py` reads every module outside
# `hyv_lib/models/` for a model's name). The next cell lists CogVideoX's folder, what adding it took.

# %%
folder = os.path.join(os.path.dirname(hyv_lib.__file__), "models", "cogvideox")
display(html_table([{"file": f"hyv_lib/models/cogvideox/{name}",
                     "lines": sum(1 for _ in open(os.path.join(folder, name))),
                     "what it holds": ast.get_docstring(ast.parse(open(os.path.join(folder, name)).read())).split("\n")[0]}
                    for name in sorted(os.listdir(folder)) if name.endswith(".py")]))
print("registered families:", ", ".join(f"{name} ({type(family).__name__})" for name, family in FAMILIES.items()))

# %% [markdown]
# ## What had to change
#
# **The context.** HunyuanVideo's 1,985 context tokens are mostly padding, so chapter 2 built segment ids, a
# valid-first order and a key mask. CogVideoX's T5 context is always 226 tokens: the pipeline pads the prompt with
# T5's pad token and the model attends to every one of them, pads included (there is no mask in diffusers' forward).
# So the adapter's attention processor passes no mask, and the same `hyv_lib.kernels.dispatch.attention` call that
# runs Splash with segment ids for HunyuanVideo runs it with one segment here.
#
# **RoPE and the temporal patch.** CogVideoX1.5 patches 2 latent frames into one token, so the pipeline pads the
# latent frames to an even count (81 frames: 21 latent frames, one more in front) and drops the padding after
# denoising. Its rotary tables are cut from a 150 x 150 grid (`sample_height` 300 / patch 2) per token row; the
# pipeline computes them and passes them in, and the adapter computes the same tables from the latent shape so a
# jitted step never needs them as an argument.

# %%
config = cogvideox.transformer
for h, w in ((768, 1360), (720, 1280)):
    frames = latent_frames(config, 81)
    grid = video_tokens((2, frames, 16, h // 8, w // 8), config)
    cos, _ = rotary_tables(config, (2, frames, 16, h // 8, w // 8))
    print(f"{h}x{w}x81: {(81 - 1) // 4 + 1} latent frames -> {frames} padded; token grid {grid[0]} x {grid[1]} x "
          f"{grid[2]} = {grid[0] * grid[1] * grid[2]:,} video + 226 text tokens; RoPE table {list(cos.shape)}")

# %% [markdown]
# **head_dim 64 on the MXU.** HunyuanVideo's heads are 128 wide, the TPU's lane width; CogVideoX's are 64.
# `hyv_lib`'s Splash wrapper zero-pads a head dimension that is not a multiple of 128 up to one before the kernel
# (zero columns add nothing to $q \cdot k$, and the padded output columns are zeros that are cut off), so one path
# serves every head dimension; `pad_head_dim=False` feeds 64 as is. What the TPU compiler reports for CogVideoX's
# attention at real size (45,106 tokens, 12 heads per device) does not separate the two: Mosaic compiles both, the
# kernel's scoped {term}`VMEM` is the same (a 64-wide tile occupies 128 lanes anyway), q, k, v and the output are laid
# out lane-padded to 128 in HBM either way, and the whole step's per-device bytes and FLOPs are the same
# (`hyv_lib.kernels.splash.PAD_HEAD_DIM` records the numbers). Which one runs faster is a question for a TPU; the
# exercises come back to it.
#
# **The VAE.** CogVideoX's VAE (`AutoencoderKLCogVideoX`, 8x spatial, 4x temporal) decodes in chunks of frames and
# carries a *causal-convolution cache* from one chunk to the next: its decoder takes the cache as a keyword and returns
# `(frames, cache)`. `hyv_lib`'s JAX decoder stand-in (`hyv_lib.runtimes.jax_vae`) passes that keyword through and
# keeps the cache on JAX's device between chunks: the first chunk (no cache yet) and every later chunk compile as two
# programs, and the decode equals diffusers' eager decode to 7e-6 at tiny size (`tests/test_cogvideox_pipeline.py`).
#
# ## The tiny model, live
#
# `cogvideox_tiny` is CogVideoX1.5's classes with 8 heads of 16, 2 blocks, a 2-layer T5 and a small VAE, seeded
# random weights, and the *real* token layout: 226 text tokens, the 2x2x2 patch, the RoPE grid of `sample_height`
# 300. Its videos are noise; what it checks is that every runtime computes what diffusers computes. First the
# transformer: diffusers' eager fp32 forward (given the pipeline's own RoPE tables) against `hyv_lib.JaxTransformer`
# on one device and on three layouts of the 8 emulated devices.

# %%
tiny = hyv_lib.get_preset("cogvideox_tiny")
components = build_tiny_components(tiny)
reference = components["transformer"]
g = torch.Generator().manual_seed(0)
latent_shape = (2, 4, 16, 12, 20)  # [B, F, C, H, W]: 2 x 6 x 10 = 120 video tokens per sample
kwargs = dict(hidden_states=torch.randn(latent_shape, generator=g), timestep=torch.tensor([999, 601]),
              encoder_hidden_states=torch.randn(2, 226, tiny.text_dim, generator=g))
rope = CogVideoXPipeline(**components)._prepare_rotary_positional_embeddings(96, 160, 4, "cpu")
with torch.no_grad():
    expected = reference(**kwargs, image_rotary_emb=rope).sample
rows = []
for mesh, sharding in ((None, None), ("data=2,tensor=4", "tp"), ("tensor=2,sequence=4", "tp_replicated_out"),
                       ("data=2,sequence=4", "fsdp")):
    if mesh is not None and jax.device_count() < 8:
        continue
    runtime = hyv_lib.JaxTransformer(copy.deepcopy(reference), mesh=mesh, sharding=sharding)
    got = runtime(**kwargs, image_rotary_emb=rope)
    rows.append({"runtime": "JaxTransformer", "mesh": mesh or "1 device", "rules": sharding or "",
                 "max |difference| vs diffusers": f"{(got - expected).abs().max():.1e}",
                 "output up to": f"{expected.abs().max():.2f}"})
display(html_table(rows))

# %% [markdown]
# Then the pipeline: `hyv_lib`'s sampling loop (its own torch step, hyv_lib's attention, the adapter's RoPE tables)
# against diffusers' `CogVideoXPipeline`, from the same initial latents and the same T5 embeddings, with the DDIM
# scheduler the checkpoint ships.

# %%
pipe = CogVideoXPipeline(**components)
pipe.set_progress_bar_config(disable=True)
embeds = encode_pair(components, tiny, "a cat playing piano", "blurry")
start = torch.randn(tiny.denoising_shape(96, 160, 9), generator=torch.Generator().manual_seed(1))
theirs = pipe(prompt_embeds=embeds["prompt_embeds"], negative_prompt_embeds=embeds["negative_prompt_embeds"],
              latents=start.clone(), height=96, width=160, num_frames=9, num_inference_steps=8,
              guidance_scale=tiny.guidance_scale, output_type="latent", return_dict=False)[0]
mine = denoise_cogvideox(make_step(copy.deepcopy(reference), "torch"), start.clone(), embeds["prompt_embeds"],
                         embeds["negative_prompt_embeds"], make_scheduler(components["scheduler"].config),
                         num_inference_steps=8, guidance_scale=tiny.guidance_scale,
                         image_rotary_emb=rope, progress=False)
print(f"8 DDIM steps, latents {list(start.shape)}: max |hyv_lib - CogVideoXPipeline| = "
      f"{(mine - theirs).abs().max():.1e} (latents up to {theirs.abs().max():.2f})")

# %% [markdown]
# Last, the command line and its three stages with their files: `generate --preset cogvideox_tiny` writes what each
# stage hands to the next (stage 1: the T5 embeddings of the prompt and of the negative prompt; stage 2: the latents,
# frames first and padded as the pipeline keeps them; stage 3: the mp4).

# %%
out = tempfile.mkdtemp(prefix="cogvideox_")
settings = ["--preset", PRESET, "--output_dir", out, "--runtime", RUNTIME, "--quiet"]
settings += ["--model_path", MODEL_PATH] if MODEL_PATH else []
settings += ["--mesh", MESH] if MESH else []
for flag, value in (("--height", HEIGHT), ("--width", WIDTH), ("--video_length", VIDEO_LENGTH),
                    ("--num_inference_steps", STEPS)):
    settings += [flag, str(value)] if value else []
assert run(["generate", "--prompt", "a cat playing piano", "--negative_prompt", "blurry", *settings]) == 0
for name in sorted(os.listdir(out)):
    path = os.path.join(out, name)
    if name.endswith(".safetensors"):
        with safe_open(path, "pt") as f:
            print(f"{name}: " + ", ".join(f"{k} {list(f.get_slice(k).get_shape())}" for k in f.keys()))
    else:
        print(f"{name}: {os.path.getsize(path):,} bytes")
frames, meta = read_mp4(os.path.join(out, "output_video.mp4"))
print(f"output_video.mp4: {frames.shape[0]} frames of {frames.shape[2]}x{frames.shape[1]} at {meta['fps']} fps")
shutil.rmtree(out, ignore_errors=True)  # a scratch folder: the frames are read, the files listed above

# %% [markdown]
# Three of those frames (first, middle, last). With `cogvideox_tiny`'s random weights they are noise, as they
# should be: no cat and no piano. What the strip does show is the decoder's structure. The noise comes in 8x8-pixel
# squares, 12 x 20 of them in a 96x160 frame: one per latent pixel, which the random VAE decoder upsamples 8 times.
# What this section checks, the stage files and the frame count, is in the lines above; the picture adds only that
# the mp4 decodes. (The strip is a JPEG: a PNG of noise does not compress, and five frames of it weighed about
# 580 kB.) With the real checkpoint the same cell shows five frames of the prompt's video.

# %%
is_tiny = hyv_lib.get_preset(PRESET).is_tiny
figure = frame_grid(frames, columns=3 if is_tiny else 5, scale=1.2,
                    title=f"{PRESET}: 'a cat playing piano'" + (" (random weights: noise)" if is_tiny else ""))
buffer = io.BytesIO()
figure.savefig(buffer, format="jpeg", dpi=100, pil_kwargs={"quality": 70})
plt.close(figure)
display(Image(data=buffer.getvalue(), format="jpeg"))
print(f"the strip above: {len(buffer.getvalue()) / 1e3:.0f} kB as a JPEG")

# %% [markdown]
# ## Real size, compiled here
#
# `python -m hyv_lib compile` builds the 5.57B transformer on the `meta` device, places its abstract weights with the
# adapter's rules on a mesh of a *deviceless* TPU slice, and hands one CFG step to the TPU compiler (chapter 8 does
# the same for HunyuanVideo). `benchmarks/cogvideox_compile.py` ran it for a v6e-8 at the two sizes gpu-tpu-pedia
# timed, with its two layouts (tensor=8, and data=2 x tensor=4: one CFG sample per half of the slice) and with a
# sequence axis, and saved the compiler's reports. The next cell reads them; the last column is gpu-tpu-pedia's time
# for that layout where it published one ({ref}`references-cogvideox`).

# %%
CITED = {("768x1360", "tensor=8"): 1.79, ("768x1360", "data=2,tensor=4"): 1.13}  # gpu-tpu-pedia, v6e-8, stage 2
reports = sorted(glob.glob("../benchmarks/results/cogvideox_compile_*.json"))
runs = json.load(open(reports[-1]))["runs"] if reports else {}
print(f"{os.path.basename(reports[-1]) if reports else 'no saved compiles'}: {len(runs)} compiles "
      "(python benchmarks/cogvideox_compile.py)")
rows = []
for name, r in sorted(runs.items()):
    if "error" in r:
        continue
    size, slice_, mesh, rules = name.split("/")
    sent = sum(op["sent_bytes"] for op in r["collective_ops"])
    kinds = ", ".join(f"{c['kind']} x{c['count']}" for c in r["collectives"])
    cited = CITED.get((size, mesh)) if rules == "tp" and slice_ == "v6e-8" else None
    rows.append({"size x 81": size, "slice": slice_, "mesh": mesh, "rules": rules, "fits": "yes" if r["fits"] else "no",
                 "GiB per device": f"{r['per_device_bytes']['total'] / 2**30:.2f}",
                 "matmul TFLOP per device": f"{r['matmul_flops_per_device'] / 1e12:.1f}",
                 "collectives": kinds, "GB sent per device": f"{sent / 1e9:.1f}",
                 "cited s/step": "" if cited is None else f"{cited:.2f}"})
display(html_table(rows))
issue_row = runs.get("768x1360/v6e-8/data=2,tensor=4/tp_replicated_out")
if issue_row:
    print("python -m hyv_lib compile --preset cogvideox1.5_5b --topology v6e:2x4 --mesh data=2,tensor=4 --height 768 "
          f"--width 1360 --video_length 81 --json: fits={issue_row['fits']}, "
          f"{issue_row['per_device_bytes']['total'] / 2**30:.2f} GiB per device of "
          f"{issue_row['hbm_available_per_device'] / 2**30:.2f}")

# %% [markdown]
# Every layout fits, with most of the memory to spare: 5.57B bf16 parameters are 10.4 GiB in all, a fraction of that
# per device, and the activations of a 45,106-token sequence are small beside HunyuanVideo's 113,585. The
# interesting column is the collectives. Megatron-style rules (`tp`: to_q/k/v and the MLP's first layer split by
# output features, to_out and the MLP's second layer by input features) all-reduce the row-parallel outputs three
# times per block: to_out of the video and of the text tokens, and the MLP of the joint sequence, 126 all-reduces.
# tensor=8 all-reduces both CFG samples over 8 devices; data=2 x tensor=4 one sample over 4. Same matmul work per
# device, same attention work (12 heads of one sample or 6 heads of two), so the two programs differ in one thing:
# the bytes each device puts on the wire.

# %%
t8, d2 = runs.get("768x1360/v6e-8/tensor=8/tp"), runs.get("768x1360/v6e-8/data=2,tensor=4/tp")
if t8 and d2:
    sent = {name: sum(op["sent_bytes"] for op in r["collective_ops"]) for name, r in (("t8", t8), ("d2", d2))}
    slow, fast = CITED[("768x1360", "tensor=8")], CITED[("768x1360", "data=2,tensor=4")]
    bandwidth = (sent["t8"] - sent["d2"]) / (slow - fast)  # t = compute + sent / bandwidth through both points
    compute = fast - sent["d2"] / bandwidth
    work = d2["matmul_flops_per_device"] + step_flops(cogvideox, 768, 1360, 81)["attention"] / 8
    v6e = CHIPS["v6e"]
    egress = v6e.interconnect_bandwidth / 2  # one direction of the chip's published ICI bandwidth
    at_peak = {name: work / v6e.peak_bf16_flops + sent[name] / egress for name in sent}  # compute + wire, no overlap
    print(f"sent per device and step: tensor=8 {sent['t8'] / 1e9:.1f} GB, data=2 x tensor=4 {sent['d2'] / 1e9:.1f} GB "
          f"({sent['t8'] / sent['d2']:.2f}x); work per device {work / 1e12:.0f} TFLOP in both")
    print(f"the one (compute, bandwidth) through both measured times: {compute:.2f} s of compute "
          f"({work / compute / v6e.peak_bf16_flops:.0%} of the v6e's {v6e.peak_bf16_flops / 1e12:.0f} TFLOP/s) "
          "+ sent / "
          f"{bandwidth / 1e9:.0f} GB/s")
    print(f"at the published {egress / 1e9:.0f} GB/s egress the same bytes would cost {sent['d2'] / egress:.2f} vs "
          f"{sent['t8'] / egress:.2f} s: predicted ratio at peak compute "
          f"{at_peak['t8'] / at_peak['d2']:.2f}x, measured "
          f"{slow / fast:.2f}x")

# %% [markdown]
# So the compiled programs explain the *direction* of gpu-tpu-pedia's 1.58x and rule out compute, memory and
# attention as its cause: tensor=8 puts 2.33 times the bytes on the wire for the same work. They explain its *size*
# only if those all-reduces run at about a fifth of the chip's published egress bandwidth and do not overlap the
# matmuls (at the full bandwidth the same bytes predict 1.24x, not 1.58x); XLA's cost model gives no time for these
# v6e programs, and no TPU here can measure the collectives, so that part stays a hypothesis that a profile on a
# v6e-8 would settle.
# (gpu-tpu-pedia's time at 720x1280, 106.47 s on data=2 x tensor=4 ({ref}`references-cogvideox`), is not in the
# table's cited column: it is an end-to-end time, T5, VAE and the first compilation included, not 50 steps. Divided
# by 50 it would make the smaller video slower per step than the larger one, 2.13 against 1.13 s.)
#
# For scale, one GPU on the same step: `benchmarks/gpu_check.py --sections cogvideox` ran CogVideoX1.5-5B's CFG step
# with random bf16 weights on an H200 (`benchmarks/results/gpu_check_2026-11-27_H200_run6_cogvideox.json`).

# %%
gpu_reports = sorted(glob.glob("../benchmarks/results/gpu_check_*cogvideox*.json"))
if gpu_reports:
    section = json.load(open(gpu_reports[-1]))["sections"]["cogvideox"]
    gpu_rows = [{"row": r["name"].replace("cogvideox ", ""), "attention": r["backend"], "s/step": r["s_per_step"],
                 "MFU": r.get("mfu", ""), "peak GiB": r.get("peak_allocated_gib", "")}
                for r in section["rows"] if r.get("status") == "ok"]
    display(html_table(gpu_rows))
    for size, c in section["compare"].items():
        print(f"{size}: hyv_lib vs diffusers' stock processor, max |difference| of the outputs {c['max_abs_diff']}, "
              f"diffusers' time / hyv_lib's {c['speedup']:.3f}")
    print(f"tiny CogVideoX with hyv_lib's attention on the GPU vs diffusers fp32 on the CPU: max |difference| "
          f"{section['tiny']['max_abs_diff']:.1e}")

# %% [markdown]
# One H200 takes 7.57 s for the 768x1360 step, 6.7 times gpu-tpu-pedia's eight v6e chips (1.13 s), at 39.5% of the
# H200's 989 TFLOP/s datasheet peak by `step_flops`' count. hyv_lib's attention processor picks PyTorch's SDPA for
# this unmasked attention, the kernel diffusers' own processor calls: at each size the hyv_lib row and the diffusers
# row give identical outputs and take times within 1% (the two lines under the table). At 720x1280 the step takes
# 6.15 s.

# %% [markdown]
# ## Summary
#
# * A second diffusers video transformer runs on `hyv_lib`'s runtimes, meshes, caches, compile path and planner
#   through one more model adapter (`hyv_lib.models.cogvideox.adapter`, with its attention processor), two presets and the
#   model's own pipeline steps (T5 embeddings, the DDIM loop with its padded latent frame). No runtime module imports
#   a model module; the structure needed two new questions on the adapter, how many video tokens a latent shape
#   holds and what dtype the timestep reaches the model in.
# * At tiny size every runtime computes what diffusers computes: `JaxTransformer` on one device and on three layouts
#   of 8 emulated devices within about 1e-6 of diffusers' fp32 forward, the sampling loop equal to
#   `CogVideoXPipeline` from the same latents, the stage files through the CLI, the VAE decoded on JAX with its
#   causal-convolution cache kept there.
# * What changed is what the model is: a fixed 226-token T5 context attended to in full (no mask, one Splash
#   segment), RoPE tables from the latent shape with the temporal patch's padded frame, a 64-wide head zero-padded to
#   the 128 lanes (the compiler cannot tell the two apart; a TPU can), a VAE that carries state between chunks.
# * At real size every compiled layout fits a v6e-8 with room. tensor=8 and data=2 x tensor=4 do the same work per
#   device; tensor=8 puts 2.33 times the bytes on the wire. That explains the direction of gpu-tpu-pedia's 1.58x;
#   its size fits only if the all-reduces run at about a fifth of the published interconnect bandwidth without
#   overlapping the matmuls, which only a profile on a TPU can confirm.
#
# ## Exercises
#
# Marked ★ (easy) to ★★★ (hard), and *open* where no one has the answer yet ({ref}`notation-exercises`).
#
# 1. ★ How many video tokens does CogVideoX1.5 see at 480x848 and 49 frames? Count the latent frames, the padding
#    and the patches.
# 2. ★ `cogvideox1.5_5b` runs CFG with guidance 6. What would a data axis of 2 do with guidance 1, and what does
#    `hyv_lib` say when asked for it?
# 3. ★★ Splash pads CogVideoX's head dimension from 64 to 128 with zeros. Show that the attention output's first 64
#    columns are unchanged, and name the one constant that must *not* follow the padded width.
# 4. ★★ Per block, tensor=8 all-reduces three activations of both CFG samples over 8 devices. From the shapes in
#    the compile table's program ([2, 45,106, 3,072] bf16 for the MLP's output), compute the bytes a ring all-reduce
#    sends per device for that one tensor, for tensor=8 and for data=2 x tensor=4, and check the 2.33x.
# 5. ★★★ Write an adapter for a third diffusers video transformer (for instance Wan 2.1's `WanTransformer3DModel`):
#    which of `ModelAdapter`'s methods change, where its cross-attention to the text goes, and what the tests
#    should compare against.
# 6. **Open.** On a v6e-8, is Splash faster at head dimension 64 as is, or padded to 128? And do the all-reduces of
#    tensor=8 really run near one link's bandwidth? A start: `pad_head_dim=False` in `attention_options`, and a
#    profile of one block at tensor=4 and tensor=8 (chapter 8's profile walkthrough).
#
# :::{admonition} Answers
# :class: dropdown
# 1. $(49 - 1)/4 + 1 = 13$ latent frames, padded to 14 for the temporal patch of 2: 7 token frames. $480/16 = 30$ by
#    $848/16 = 53$ patches: $7 \times 30 \times 53 = 11{,}130$ video tokens, plus 226 text tokens.
# 2. With guidance 1 each step runs one sample (no negative prompt), so a data axis has nothing to split; `hyv_lib`
#    refuses it before any model loads (`check_data_axis`: "data=2 is of no use with CFG off ... put its devices on
#    tensor instead").
# 3. With $q' = [q, 0]$ and $k' = [k, 0]$, $q' \cdot k' = q \cdot k$, so the logits and the softmax are unchanged;
#    with $v' = [v, 0]$ the output is $[P v, P 0] = [P v, 0]$, and the first 64 columns are the answer. The softmax
#    scale must stay $1/\sqrt{64}$: the padded width is 128, and a kernel that derived the scale from it would
#    compute $1/\sqrt{128}$ (the wrapper folds $1/\sqrt{D}$ into $q$ with the real $D$).
# 4. One tensor is $2 \times 45{,}106 \times 3{,}072 \times 2$ bytes $= 554$ MB. A ring all-reduce over $n$ devices
#    sends $2 (n-1)/n$ of it per device: $2 \times 7/8 \times 554 = 970$ MB at tensor=8. data=2 x tensor=4
#    all-reduces one sample (277 MB) over 4: $2 \times 3/4 \times 277 = 416$ MB. The ratio is
#    $(2 \times 7/8)/(3/4) = 2.33$.
# 5. `prepare` (Wan's text states pass through a projection once per prompt; no valid-first reorder),
#    `embed_video`/`unpatchify` (its 1x2x2 patch), `embed_context` (the text embedder), `run_block` (self-attention
#    over video tokens, then cross-attention to the text: the context is not updated by the blocks, so the pair
#    returned keeps it unchanged), `rope` (its own 3D RoPE), `output_tokens`, the rule sets (the cross-attention's
#    to_k/to_v too), and `video_token_count`. The tests: the composed pieces, `JaxTransformer` on 1 and 8 devices,
#    and the torch step, each against diffusers' eager fp32 forward.
# 6. Open. Compare the kernel's time alone (Splash at the per-device shape, both settings) before the whole step;
#    for the collectives, the profile's all-reduce durations per block give the bandwidth directly, to set beside the
#    bytes in the compile table.
# :::
