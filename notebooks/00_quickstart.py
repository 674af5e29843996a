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
# # 0. Quickstart: the three-stage pipeline
#
# HunyuanVideo-1.5 turns a prompt into a video in three stages, each of which writes a file the next one reads:
#
# 1. **Text encoders** (Qwen2.5-VL + {term}`ByT5`) turn the prompt and the negative prompt into
#    `stage1_embeddings.safetensors`.
# 2. **The {term}`DiT`** (`HunyuanVideo15Transformer3DModel`) denoises Gaussian latents for a number of
#    {term}`flow-matching <flow matching>` steps, with classifier-free guidance ({term}`CFG`), into
#    `stage2_latents.safetensors`.
# 3. **The {term}`VAE`** (`AutoencoderKLHunyuanVideo15`) decodes the latents into frames, written as `output_video.mp4`.
#
# :::{figure} ../book/figures/00_three_stages.svg
# :name: fig-00-three-stages
# The three stages and the files between them, with the real 720p model's shapes. Each stage reads only the
# previous stage's file and `generation_config.json`, so each can run in its own process, on its own machine.
# :::
#
# Splitting the pipeline at these files is what lets each stage run where it fits best: the Qwen2.5-VL-7B text
# encoder on a host CPU, the 8.3-billion-parameter DiT (chapter 1 counts them) on a TPU slice or GPU box, the VAE
# wherever memory allows. This notebook runs all three with `hyv_lib` and looks at every hand-off.
#
# On a laptop CPU it uses **{term}`hyv-tiny`** ({term}`preset` `tiny_trained`): the real diffusers and transformers classes at a
# tiny size, trained on a CPU to draw one colored shape moving on a plain background, from the caption alone or
# from a caption and a first frame (chapter 6 runs image to video; this notebook runs text to video).
# Its weights ship with `hyv_lib`, so the video below is a real generation you can check against the prompt,
# and the files and code paths are exactly those of the real model. On a machine with the real weights, set
# `HYV_PRESET=720p_t2v` and `HYV_MODEL_PATH=<diffusers folder>` and run the same notebook with your own prompt.
#
# Symbols, units and terms are those of the {doc}`../book/notation` page: $H \times W$ is a size in pixels,
# $h \times w$ in latents, $F$ counts video frames and $T$ latent frames, and memory is in GiB ($2^{30}$ bytes).

# %% tags=["parameters"]
import os

# tiny_trained | tiny | 480p_t2v | 720p_t2v; real presets need a diffusers-format folder (or hub id)
PRESET = os.environ.get("HYV_PRESET", "tiny_trained")
MODEL_PATH = os.environ.get("HYV_MODEL_PATH") or None
# hyv-tiny knows "a {color} {shape} moving {direction} on a {background} background" (chapter 7)
PROMPT = os.environ.get("HYV_PROMPT", "a blue circle moving left on a gray background")
OUTPUT_DIR = os.environ.get("HYV_OUTPUT_DIR", "stage_outputs/quickstart")
# None = the preset's default; set small values to smoke-test real weights on a CPU
HEIGHT = int(os.environ.get("HYV_HEIGHT", 0)) or None
WIDTH = int(os.environ.get("HYV_WIDTH", 0)) or None
VIDEO_LENGTH = int(os.environ.get("HYV_VIDEO_LENGTH", 0)) or None
STEPS = int(os.environ.get("HYV_STEPS", 0)) or None
ATTENTION = os.environ.get("HYV_ATTENTION", "auto")  # exact masked attention; "diffusers" = the stock dense mask
RUNTIME = os.environ.get("HYV_RUNTIME", "torch")     # torch | tpu (the DiT jitted by JAX: the TPU on a TPU VM)
MESH = os.environ.get("HYV_MESH") or None            # with RUNTIME=jax, e.g. data=2,tensor=4 on a v6e-8

# %% [markdown]
# ## The preset
#
# A preset fixes every shape: how many text tokens, the latent channels, the compression of the VAE, the
# default resolution bucket, steps, flow shift and guidance scale. `python -m hyv_lib info --preset NAME --json`
# prints the same data.

# %%
import time
import warnings

# diffusers imports tqdm.auto, which warns that ipywidgets is absent; text bars are fine here.
warnings.filterwarnings("ignore", message="IProgress not found")

import hyv_lib
from hyv_lib.models.components import quiet_loading  # no weight-loading progress bars in the output
from hyv_lib.notebook.display import file_rows, frame_grid, html_table, tensor_rows, video_html
from hyv_lib.pipeline.stages import stage1, stage2, stage3
from hyv_lib.runtimes.names import vae_runtime_for

preset = hyv_lib.get_preset(PRESET)
real = hyv_lib.get_preset("720p_t2v")
keys = ["text_len", "text_dim", "byt5_len", "byt5_dim", "latent_channels",
        "spatial_compression", "temporal_compression", "default_height", "default_width",
        "default_video_length", "default_steps", "flow_shift", "guidance_scale"]
html_table([{"setting": k, PRESET: preset.to_json()[k], "720p_t2v": real.to_json()[k]}
            for k in keys])

# %% [markdown]
# ## Stage 1: text encoders
#
# The MLLM branch wraps the prompt in Qwen2.5-VL's chat template with a long system prompt, runs the text
# model, keeps `hidden_states[-3]` and crops the template tokens away, padding to a fixed length with a mask.
# The ByT5 branch encodes only text inside quotes (glyphs to render); a prompt without quotes gives zeros and
# an all-zero mask. Both prompts of classifier-free guidance are encoded: the negative one (empty here) and
# the positive one.

# %%
t0 = time.perf_counter()
with quiet_loading():
    stage1(preset=PRESET, model_path=MODEL_PATH, prompt=PROMPT, output_dir=OUTPUT_DIR)
print(f"stage 1: {time.perf_counter() - t0:.1f} s")
stage1_file = os.path.join(OUTPUT_DIR, "stage1_embeddings.safetensors")
html_table(file_rows(stage1_file))

# %% [markdown]
# The masks count the valid tokens. Everything after them is padding that attention must ignore;
# how to do that exactly and cheaply on every platform is the subject of chapter 2.

# %%
from safetensors.torch import load_file

embeds = load_file(stage1_file)
for name in sorted(k for k in embeds if "mask" in k):
    mask = embeds[name]
    print(f"{name:30s} {int(mask.sum()):5d} valid of {mask.shape[1]}")

# %% [markdown]
# The same file for the real 720p model is far larger. This table is computed from the preset, not
# typed in: the shapes are `[1, text_len, text_dim]` and `[1, byt5_len, byt5_dim]`, stored in bf16 (the masks
# as int64).

# %%
real_dtypes = {k: "int64" if "mask" in k else "bfloat16" for k in real.stage1_shapes()}
html_table(tensor_rows(real.stage1_shapes(), real_dtypes))

# %% [markdown]
# ## Stage 2: denoising
#
# Stage 2 draws Gaussian latents from the seed and integrates the flow-matching ODE from $\sigma=1$ (noise) to
# $\sigma=0$ (data) with Euler steps. The DiT predicts a velocity $v_\theta$; classifier-free guidance
# combines the predictions for the negative and positive prompt, which run as **one batch of 2**:
#
# $$
# v = v_\text{neg} + g\,(v_\text{pos} - v_\text{neg}), \qquad x_{i+1} = x_i + (\sigma_{i+1} - \sigma_i)\, v .
# $$
#
# The sigmas are `linspace(1, 0, N+1)` warped by the flow shift $s$: $\sigma' = s\sigma / (1 + (s-1)\sigma)$,
# which spends more steps at high noise. The loop calls the transformer through one small interface, a
# *transformer step*, so chapters 1, 3 and 4 can swap in a jitted JAX step, a sharded one or a cached one without
# touching the loop.

# %%
t0 = time.perf_counter()
with quiet_loading():
    latents = stage2(input_dir=OUTPUT_DIR, height=HEIGHT, width=WIDTH, video_length=VIDEO_LENGTH,
                     runtime=RUNTIME, mesh=MESH, num_inference_steps=STEPS, seed=42,
                     attention=ATTENTION, quiet=True)
config = hyv_lib.pipeline.stage_io.read_config(OUTPUT_DIR)
print(f"stage 2: {config['num_inference_steps']} steps in {time.perf_counter() - t0:.1f} s")
html_table(file_rows(os.path.join(OUTPUT_DIR, "stage2_latents.safetensors")))

# %% [markdown]
# ### How big is the hand-off at 720p?
#
# The latent is 16x smaller than the video in height and width and 4x shorter in time, plus the first frame,
# which the causal VAE encodes alone (hence frame counts of the form $4n+1$). For $F$ frames of $H \times W$ pixels,
# the latent has $T = \tfrac{F-1}{4}+1$ frames of $h \times w = \tfrac{H}{16} \times \tfrac{W}{16}$:
#
# $$
# \text{latents} = [1,\ 32,\ T,\ h,\ w], \qquad N_v = T \cdot h \cdot w \ \text{video tokens}
# $$
#
# since the DiT's patch is $1\times1\times1$: one token per latent pixel, with 32 channels. At 720p and 121 frames,
# $T = \tfrac{120}{4}+1 = 31$, $h = \tfrac{720}{16} = 45$ and $w = \tfrac{1280}{16} = 80$, so the latents are
# $[1, 32, 31, 45, 80]$ and the DiT attends over $N_v = 31 \cdot 45 \cdot 80 = 111{,}600$ video tokens. Stored in fp32,
# `stage2_latents.safetensors` holds $32 \cdot 111{,}600 \cdot 4 = 14{,}284{,}800$ bytes (13.6 MiB) plus a
# small header. The decoded video, as raw uint8 RGB frames, is $121 \cdot 720 \cdot 1280 \cdot 3 = 334{,}540{,}800$
# bytes (319 MiB), 23.4 times more: each latent pixel stands for $4 \cdot 16 \cdot 16 \cdot 3 = 3{,}072$ bytes of
# pixels against $32 \cdot 4 = 128$ bytes of latents (24x), and the first frame, decoded alone, trims that by
# $121/124$. The same numbers from the preset, and this run's file against the same formula:

# %%
import math

from hyv_lib.models.hunyuan_video15.layout import video_tokens

H, W, F = 720, 1280, 121
shape = real.latent_shape(H, W, F)
latent_bytes = math.prod(shape) * 4  # fp32
frame_bytes = F * H * W * 3  # uint8 RGB
print(f"720p_t2v, {F} frames of {H}x{W}: latents {list(shape)}, {video_tokens(real, H, W, F):,} video tokens")
print(f"  stage2_latents.safetensors: {latent_bytes:,} bytes of fp32 latents ({latent_bytes / 2**20:.1f} MiB)")
print(f"  decoded uint8 frames:       {frame_bytes:,} bytes ({frame_bytes / 2**20:.0f} MiB), "
      f"{frame_bytes / latent_bytes:.1f}x the latents")
stage2_file = os.path.join(OUTPUT_DIR, "stage2_latents.safetensors")
ours = math.prod(latents.shape) * 4
print(f"this run: latents {list(latents.shape)}, file {os.path.getsize(stage2_file):,} bytes = {ours:,} bytes "
      f"of latents + {os.path.getsize(stage2_file) - ours} bytes of header")

# %% [markdown]
# :::{admonition} Takeaway
# :class: tip
# The hand-offs are small: the 720p/121-frame latents are 13.6 MiB, cheap to write, read or send to another
# machine, so splitting the pipeline at the files costs little. What is large is the DiT's work on them:
# 111,600 video tokens, plus the text context, in every attention of every step.
# :::
#
# Below, left: the 50-step sigma schedule at flow shifts 1, 5 and 9 (the 480p and 720p presets use 5 and 9; this
# run's shift and step count are in the preset table at the top); right: the spread of the latents this run
# produced.

# %%
import matplotlib.pyplot as plt
import numpy as np
from diffusers import FlowMatchEulerDiscreteScheduler

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3))
for shift in (1.0, 5.0, 9.0):
    sched = FlowMatchEulerDiscreteScheduler(shift=shift)
    sched.set_timesteps(sigmas=np.linspace(1, 0, 51)[:-1])
    ax1.plot(sched.sigmas.numpy(), label=f"shift {shift:g}")
ax1.set(xlabel="step (of 50)", ylabel="sigma (1 = noise, 0 = data)", title="Shifted sigma schedules")
ax1.legend()
ax2.hist(latents.flatten().numpy(), bins=60)
ax2.set(title=f"stage-2 latents after {config['num_inference_steps']} steps", xlabel="latent value",
        ylabel=f"count (of {latents.numel():,} values)")
fig.tight_layout()

# %% [markdown]
# ## Stage 3: VAE decode
#
# The VAE decodes the latents to pixels in $[-1, 1]$, which become uint8 frames and an H.264 mp4. Spatial
# tiling (on by default) decodes overlapping 256-pixel tiles and blends them, which bounds the decoder's memory
# at 720p; a video no larger than 256 pixels a side, like hyv-tiny's, is a single tile.

# %%
t0 = time.perf_counter()
with quiet_loading():
    frames = stage3(input_dir=OUTPUT_DIR, runtime=vae_runtime_for(RUNTIME))  # JAX's device after the jax runtime
print(f"stage 3: {time.perf_counter() - t0:.1f} s, "
      f"frames {tuple(frames.shape)} {frames.dtype}")
fig = frame_grid(frames.numpy(), columns=5, title=f"{PRESET}: {PROMPT!r}")

# %%
video_html(os.path.join(OUTPUT_DIR, "output_video.mp4"), media_dir="../_static/videos")  # linked, not inlined

# %% [markdown]
# Every stage also extends `generation_config.json`, so a folder of stage files always says how it
# was made, including the time and peak memory (RSS) of each stage. The file stores absolute paths; the table
# shows only their last part.

# %%
config = hyv_lib.pipeline.stage_io.read_config(OUTPUT_DIR)


def shown(value):
    return os.path.basename(value) if isinstance(value, str) and os.path.isabs(value) else value


html_table([{"key": k, "value": shown(config[k])} for k in sorted(config)])

# %% [markdown]
# ## The same in memory
#
# A program that makes many videos keeps the models loaded: `hyv_lib.load_pipeline` loads every component once,
# and each `generate` runs the same three stages in memory and returns the frames, the latents and the settings
# (nothing is written until `video.save(path)`). Same preset, prompt and seed, same frames:

# %%
pipe = hyv_lib.load_pipeline(PRESET, model_path=MODEL_PATH, runtime=RUNTIME, mesh=MESH, attention=ATTENTION,
                             progress=False)
t0 = time.perf_counter()
video = pipe.generate(PROMPT, seed=42, height=HEIGHT, width=WIDTH, video_length=VIDEO_LENGTH,
                      num_inference_steps=STEPS, progress=False)
print(f"generate: {time.perf_counter() - t0:.1f} s, frames {video.frames.shape} {video.frames.dtype}")
print("equal to stage 3's frames:", np.array_equal(video.frames, frames.numpy()))
del pipe  # the real models are large: free them before anything else runs

# %% [markdown]
# The same run is one command line:
#
# ```bash
# python -m hyv_lib generate --preset tiny_trained --prompt "a blue circle moving left on a gray background" --output_dir out
# ```
#
# or three, one per stage (`stage1`, `stage2`, `stage3`) with the flags of the gpu-tpu-pedia staged scripts
# ({doc}`../book/references`).
#
# ## Summary
#
# - HunyuanVideo-1.5 is three models in a row; `hyv_lib` runs them as three stages with safetensors hand-offs.
# - Stage 1 follows diffusers' text recipe exactly (chat template, `hidden_states[-3]`, crop, ByT5 for quoted
#   text); the masks mark valid tokens, valid first.
# - Stage 2 is a flow-matching Euler loop with CFG as one batch of 2; it calls the DiT through a single
#   *transformer step* interface that chapters 1, 3 and 4 reimplement for TPU and GPU.
# - At 720p/121f the latents are [1, 32, 31, 45, 80]: 111,600 video tokens and a 13.6 MiB fp32 hand-off, 23.4x
#   smaller than the decoded frames.
# - Stage 3 decodes with VAE tiling and writes an mp4.
# - `hyv_lib.load_pipeline(...).generate(...)` runs the same stages in memory, models loaded once.
# - hyv-tiny runs the real classes on a CPU in seconds and draws what its prompt says (its gates: color and
#   direction right for about nine in ten held-out captions, not every one); the 720p shapes come from the same
#   preset code.
#
# ## Exercises
#
# Marked ★ (easy) to ★★★ (hard), and *open* where no one has the answer yet ({ref}`notation-exercises`).
#
# 1. ★ Run stage 2 twice with the same seed and compare the latents with `torch.equal`. Then add
#    `warmup_steps=2`. What do you expect, and why does it matter for TPU benchmarking?
# 2. ★ Put a quoted word in the prompt (for example `a sign that says "OPEN"`) and look at
#    `prompt_embeds_mask_2`. Then remove the quotes. What changes?
# 3. ★★ The 480p model (preset `480p_t2v`) makes 121 frames at its default 16:9 size. Compute with
#    `preset.default_height`, `preset.default_width` and `preset.latent_shape` its latent shape, its number of
#    video tokens and the bytes of latents in `stage2_latents.safetensors`. How many times fewer tokens than 720p?
# 4. ★ Attention runs over the video tokens plus the 1985 context tokens (729 image + 256 ByT5 + 1000 text). How many
#    bytes would a dense boolean mask `[2, 1, S, S]` take for the CFG batch at 720p/121f? Check with
#    `hyv_lib.models.hunyuan_video15.layout.dense_mask_bytes`.
# 5. **Open.** The stage files let each stage run in its own process, so a TPU VM could encode the next prompt on
#    its host CPU (stage 1) while the chips denoise this one (stage 2), and decode the previous one meanwhile. For a
#    batch of 720p prompts, how much of the wall time would that overlap save, and what limits it: host cores, host
#    memory for the text encoder beside the stage-2 process, or the VAE's use of the chips? Nobody has measured it
#    for this model.
#
# :::{admonition} Answers
# :class: dropdown
# 1. Both comparisons are `True`. The same seed draws the same noise from a CPU generator, and the loop is
#    deterministic on CPU. Warmup steps call the transformer on the first input and throw the result away without
#    touching the scheduler, so they cannot shift the schedule. This matters because the first jitted call on TPU
#    compiles. A warmup that also advanced the scheduler's step index would make the timed run start a step or two
#    late.
# 2. With quotes, ByT5 encodes `Text "OPEN". `, and the mask counts its bytes plus the end token. Without quotes,
#    the ByT5 embeddings are all zeros and the mask is all zeros, so the DiT sees no glyph tokens.
# 3. The default size, diffusers' 16:9 bucket for 480p, is 480 x 848 (both multiples of 16), so the latents are
#    `(1, 32, 31, 30, 53)`: $31 \cdot 30 \cdot 53 = 49{,}290$ video tokens and $32 \cdot 49{,}290 \cdot 4 = 6{,}309{,}120$
#    bytes (6.0 MiB) of fp32 latents. That is $111{,}600 / 49{,}290 = 2.26$ times fewer tokens than 720p, and since
#    attention is quadratic in the joint sequence ($S$ = 51,275 against 113,585 with the 1985 context tokens of
#    exercise 4), $(113{,}585 / 51{,}275)^2 = 4.9$ times less attention work per step.
# 4. $S = 111{,}600 + 1{,}985 = 113{,}585$, and $2 \cdot S^2 = 25{,}803{,}104{,}450$ bytes, 24.0 GiB: more than a
#    16 GiB TPU v5e chip holds, for a mask that is rebuilt in every block. Chapter 2 gets the same exact result
#    without ever building it.
# 5. Where to start: `generation_config.json` records each stage's time and peak memory, so one real run gives
#    the three stage times; if stage 2 dominates, overlap can hide at most the other two.
#    `hyv_lib.pipeline.batch.BatchRunner` runs prompts one after another with the models loaded once: a version
#    that hands stage 1 to a second process (or thread) and queues its embeddings would measure the overlap
#    directly. On a CPU, hyv-tiny's stages are all short, so the question needs the real model.
# :::
