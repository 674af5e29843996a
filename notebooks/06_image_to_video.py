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
# # 6. Image to video
#
# Text to video invents the first frame. Image to video ({term}`I2V`) is given it: the caption says what happens next,
# and the model must start from the picture. HunyuanVideo-1.5 ships image-to-video checkpoints for which `hyv_lib` has
# the {term}`presets <preset>` `480p_i2v` and `720p_i2v`, their {term}`CFG-distilled` versions `480p_i2v_distilled`
# and `720p_i2v_distilled` (guidance off, 50 steps; chapter 8) and `480p_i2v_step_distilled` (8 steps, guidance off).
# They are the same 8.3B {term}`DiT` with the same 54 blocks as text to video. What changes is what goes in: the first
# frame enters the model twice, as {term}`SigLIP` tokens in the joint attention sequence and as {term}`VAE` latents
# stacked onto the noisy latents' channels, with a mask channel that marks the frame as given (the figure below).
#
# :::{figure} ../book/figures/06_image_to_video_conditioning.svg
# :name: fig-06-image-to-video-conditioning
#
# The conditioning path of `720p_i2v`. Stage 1 crops the image to the preset's {term}`bucket` nearest its aspect ratio
# (which fixes the video's size) and encodes it twice: SigLIP gives 729 tokens of width 1152 (`image_embeds`),
# the VAE encoder one latent frame (`cond_latents`). In stage 2 the DiT's `image_embedder` turns the tokens into
# the 729 image slots of the joint sequence, which text to video also carries but masks out. The latents go into
# latent frame 0 of 32 condition channels, next to the 32 noisy channels and a mask channel that is 1 on frame 0:
# 65 input channels, the same count in both tasks.
# :::
#
# This chapter:
#
# 1. draws a first frame and follows it through stage 1 into the two places the DiT reads it;
# 2. animates it live with {term}`hyv-tiny`, which was trained for both tasks (chapter 7), and reads the motion back;
# 3. gives the same frame two captions that move it two ways, and measures where it went;
# 4. computes the stage-1 file of `720p_i2v` from the preset;
# 5. asks the planner what image to video costs compared with text to video;
# 6. derives the {term}`step-distilled` variant's schedule, with the extra timestep its {term}`MeanFlow` model
#    reads.

# %% tags=["parameters"]
import os

# An image-to-video preset runs live: tiny_trained (hyv-tiny, both tasks), tiny (random weights), 480p_i2v, 720p_i2v,
# 480p_i2v_distilled, 720p_i2v_distilled or 480p_i2v_step_distilled (real presets need HYV_MODEL_PATH). A
# text-to-video preset (480p_t2v, 720p_t2v, 480p_t2v_distilled) takes no image: the live part then runs hyv-tiny
# and says so, and the tables use the preset's I2V sibling.
PRESET = os.environ.get("HYV_PRESET", "tiny_trained")
MODEL_PATH = os.environ.get("HYV_MODEL_PATH") or None
# The drawn first frame: COLOR SHAPE BACKGROUND in hyv-tiny's words (hyv_lib.base.presets.tiny_vocabulary())
FRAME = os.environ.get("HYV_FRAME", "yellow circle gray")
DIRECTIONS = os.environ.get("HYV_DIRECTIONS", "left,right").split(",")  # one caption per direction, same frame
SEEDS = int(os.environ.get("HYV_SEEDS", "4"))  # seeds per caption in the two-caption experiment
# The drawn frame's size (None: the preset's default). The video's size is the frame's bucket, not these.
HEIGHT = int(os.environ.get("HYV_HEIGHT", 0)) or None
WIDTH = int(os.environ.get("HYV_WIDTH", 0)) or None
VIDEO_LENGTH = int(os.environ.get("HYV_VIDEO_LENGTH", 0)) or None  # None: the preset's default
STEPS = int(os.environ.get("HYV_STEPS", 0)) or None
RUNTIME = os.environ.get("HYV_RUNTIME", "torch")  # torch | jax
MESH = os.environ.get("HYV_MESH") or None  # with RUNTIME=jax, e.g. tensor=8 (data=2 needs CFG on)
ATTENTION = os.environ.get("HYV_ATTENTION", "auto")

# %%
import time
import warnings

warnings.filterwarnings("ignore", message="IProgress not found")

import matplotlib.pyplot as plt
import numpy as np
import torch
from diffusers import FlowMatchEulerDiscreteScheduler

import hyv_lib
from hyv_lib.base.presets import bucket_size
from hyv_lib.models.families import PRESETS
from hyv_lib.models.hunyuan_video15.adapter import context_layout
from hyv_lib.notebook.display import frame_grid, html_table, tensor_rows, token_layout_figure
from hyv_lib.pipeline.image import crop_to_bucket, image_bucket
from hyv_lib.models.flow_matching import condition_channels
from hyv_lib.models.hunyuan_video15.sampling import sampling_schedule
from hyv_lib.planning.costs import step_flops, token_counts
from hyv_lib.planning.planner import device_plan
from hyv_lib.tiny import data, quality

requested = hyv_lib.get_preset(PRESET)
if "i2v" in requested.tasks:
    live, model_path, runtime, mesh = requested, MODEL_PATH, RUNTIME, MESH
else:  # a text-to-video checkpoint has no image path: animate the frame with hyv-tiny instead
    live, model_path, runtime, mesh = hyv_lib.get_preset("tiny_trained"), None, "torch", None
    print(f"{requested.name} is a text-to-video checkpoint (tasks {requested.tasks}): the live part runs on hyv-tiny "
          f"(tiny_trained, torch runtime){'; HYV_MODEL_PATH is not used there' if MODEL_PATH else ''}")
# The real preset the tables describe: the requested one if it is an I2V preset, else its I2V sibling (720p by default)
table_name = requested.name.replace("_t2v", "_i2v") if not requested.is_tiny else "720p_i2v"
table = hyv_lib.get_preset(table_name)
t2v_twin = hyv_lib.get_preset(table_name.split("_")[0] + "_t2v")
if live.is_tiny:
    torch.set_num_threads(1)  # tiny ops gain nothing from a second thread, and one thread is steady on a shared CPU
pipe = hyv_lib.load_pipeline(live.name, model_path=model_path, runtime=runtime, mesh=mesh, attention=ATTENTION,
                             progress=False)
print(f"live model: {live.name} ({', '.join(live.tasks)}); tables: {table.name} against {t2v_twin.name}")
if live.name == "tiny":
    print("Random weights: the videos below are noise, and the directions read from them mean nothing.")

# %% [markdown]
# ## A first frame, and where it goes
#
# `hyv_lib.tiny.data.draw_frame` draws a frame the way hyv-tiny's training clips were drawn: one shape on a plain
# background, here in the middle of the frame so that it is free to move either way. Any PNG or JPEG works the
# same (`generate --image_path`, or `pipe.generate(prompt, image=...)` with a path or a PIL image). The image is
# first cropped to a *bucket*: of the preset's sizes (all multiples of 16, about `target_size`² pixels), the one
# nearest the image's aspect ratio. It is resized to cover the bucket and centre-cropped, as diffusers'
# `HunyuanVideo15ImageToVideoPipeline` does, so the image, not `--height`/`--width`, decides the video's size.

# %%
color, shape, background = FRAME.split()
frame = data.draw_frame(color, shape, background, height=HEIGHT or live.default_height,
                        width=WIDTH or live.default_width)
bucket = image_bucket(live, frame)
cropped = crop_to_bucket(live, frame)
print(f"drawn frame {frame.size[0]}x{frame.size[1]} (width x height) -> {live.name}'s bucket {bucket[1]}x{bucket[0]}")
fig, ax = plt.subplots(figsize=(3.5, 2.3))
ax.imshow(cropped)
ax.set(title=f"first frame: a {color} {shape} on {background}", xticks=[], yticks=[])
plt.show()

# %% [markdown]
# Stage 1 encodes it twice, next to the prompt and the negative prompt: SigLIP's last hidden state
# (`image_embeds`, one token per patch) and the VAE encoder's latent mode times the VAE's scaling factor
# (`cond_latents`, one latent frame). `pipe.encode` is stage 1 without the file; `stage1 --image_path` writes the same
# tensors into `stage1_embeddings.safetensors`. `Preset.stage1_shapes(image_size=bucket)` predicts the file from
# the preset, which the last line checks (a real-layout test checkpoint has tiny encoder widths, the last axis of
# the three embeddings, so those are left out of the check).

# %%
caption = f"a {color} {shape} moving {DIRECTIONS[0]} on a {background} background"
embeds = pipe.encode(caption, image=cropped)
html_table(tensor_rows({k: tuple(v.shape) for k, v in embeds.items()},
                       {k: str(v.dtype).removeprefix("torch.") for k, v in embeds.items()}))

# %%
predicted = live.stage1_shapes(image_size=bucket)


def layout_part(shape):
    return shape[:-1] if len(shape) == 3 else shape  # an embedding's width is the encoder's


agree = set(embeds) == set(predicted) and all(layout_part(tuple(embeds[k].shape)) == layout_part(predicted[k])
                                              for k in predicted)
print(f"{len(embeds)} tensors ({len(embeds) - 8} of them the image's); shapes as "
      f"{live.name}.stage1_shapes(image_size={bucket}) predicts: {agree}")

# %% [markdown]
# ### Into the joint sequence
#
# In stage 2 the DiT's `image_embedder` projects the SigLIP tokens to the model width and they take the image slots of
# the {term}`context <context tokens>`, in front of the {term}`ByT5` and text tokens. Text to video fills the same
# slots with zeros, which diffusers' forward detects (`torch.all(image_embeds == 0)`) and masks out.
# `hyv_lib.models.hunyuan_video15.adapter.context_layout` makes the same decision outside the {term}`jitted <jit>` step and returns
# the {term}`valid-first` order of the context. Below, one sample's sequence for each task (the prompt's own masks;
# pale tokens are padding):

# %%
config = pipe.components["transformer"].config
_, _, frames_lat, h_lat, w_lat = live.latent_shape(*bucket, VIDEO_LENGTH or live.default_video_length)
video_tokens = frames_lat * h_lat * w_lat
valid = {}
for task, image in (("t2v", torch.zeros_like(embeds["image_embeds"])), ("i2v", embeds["image_embeds"])):
    layout = context_layout(config, embeds["prompt_embeds"], embeds["prompt_embeds_mask"], embeds["prompt_embeds_2"],
                            embeds["prompt_embeds_mask_2"], image)
    image_mask = np.full(image.shape[1], layout.image_scale == 1.0)
    parts = {"image": image_mask, "ByT5": embeds["prompt_embeds_mask_2"][0].numpy(),
             "text": embeds["prompt_embeds_mask"][0].numpy()}
    valid[task] = int(layout.context_mask[0].sum())
    token_layout_figure(video_tokens, parts, order=layout.order[0].numpy(),
                        title=f"{task}: {video_tokens} video + {layout.context_mask.shape[1]} context tokens, "
                              f"{valid[task]} of them valid")
    plt.show()
print(f"valid context tokens: t2v {valid['t2v']}, i2v {valid['i2v']} (+{valid['i2v'] - valid['t2v']} = the "
      f"{live.image_tokens} image tokens); the sequence is {video_tokens + layout.context_mask.shape[1]} tokens in both")

# %% [markdown]
# ### Into the input channels
#
# The second copy of the frame goes in beside the noise. The DiT's `in_channels` is $2c + 1$ (65 for $c = 32$):
# the $c$ noisy latent channels, $c$ condition channels and one mask channel, concatenated on the channel axis at
# every step. `hyv_lib.models.flow_matching.condition_channels` builds the last $c + 1$ as diffusers' I2V pipeline does: the
# frame's latents in latent frame 0, zeros after it, and a mask that is 1 on frame 0 only. Text to video passes the
# same channels, all zero. Here they are for this video (the condition's first channel, and the mask):

# %%
noise_shape = (1, config.out_channels, frames_lat, h_lat, w_lat)
condition = condition_channels(torch.zeros(noise_shape), embeds["cond_latents"])
fig, axes = plt.subplots(2, frames_lat, figsize=(2.2 * frames_lat, 3.0), squeeze=False)
for t in range(frames_lat):
    axes[0, t].imshow(condition[0, 0, t], cmap="RdBu_r", vmin=-3, vmax=3)
    axes[1, t].imshow(condition[0, -1, t], cmap="Greens", vmin=0, vmax=1)
    axes[0, t].set_title(f"latent frame {t}", fontsize=9)
axes[0, 0].set_ylabel("condition ch 0", fontsize=9)
axes[1, 0].set_ylabel("mask", fontsize=9)
for ax in axes.flat:
    ax.set(xticks=[], yticks=[])
fig.suptitle(f"the last {config.out_channels + 1} of the DiT's {config.in_channels} input channels: condition and mask",
             fontsize=10)
fig.tight_layout()
plt.show()
print(f"DiT input: {config.out_channels} noisy + {config.out_channels} condition + 1 mask = {config.in_channels} "
      f"channels; non-zero condition values outside latent frame 0: {int(condition[:, :-1, 1:].count_nonzero())}")

# %% [markdown]
# ## Image to video, live
#
# `pipe.generate(caption, image=frame)` runs the three stages in memory. The first frame of the result should be the
# drawn frame, up to what the VAE loses (a lossy round trip); after it, the shape should move as the caption says.
# `hyv_lib.tiny.quality` reads both back: {term}`PSNR` of the first frame against the cropped image, and the direction
# from the track of the shape's centroid (`quality.centroid_track`, the foreground being every pixel far from the
# border's median colour).

# %%
t0 = time.perf_counter()
video = pipe.generate(caption, image=frame, video_length=VIDEO_LENGTH, num_inference_steps=STEPS, seed=0,
                      progress=False)
seconds = time.perf_counter() - t0
reading = quality.read_video(video.frames)
first_psnr = quality.first_frame_psnr(video.frames, np.asarray(cropped))
print(f"{caption!r}: {video.frames.shape[0]} frames of {video.frames.shape[2]}x{video.frames.shape[1]}, "
      f"{video.config['num_inference_steps']} steps, CFG {video.config['guidance_scale']}, {seconds:.1f} s")
print(f"first frame vs the image: {first_psnr:.1f} dB PSNR; read back: {reading.color} shape on {reading.background}, "
      f"moving {reading.direction} ({reading.travel_px:.1f} px)")
frame_grid(video.frames, columns=5, title=f"{live.name}, image to video: {caption!r}", scale=1.6)
plt.show()

# %% [markdown]
# ## One frame, two captions
#
# The image fixes where the video starts; the caption decides where it goes. The same frame with each caption of
# `DIRECTIONS`, over several seeds (the starting noise), and the direction each video is read to move in:

# %%
captions = [f"a {color} {shape} moving {d} on a {background} background" for d in DIRECTIONS]
rows, tracks, first_videos = [], {}, {}
for direction, text in zip(DIRECTIONS, captions):
    for seed in range(SEEDS):
        if (text, seed) == (caption, 0):
            out = video.frames  # the video above: the same caption, frame and seed
        else:
            out = pipe.generate(text, image=frame, video_length=VIDEO_LENGTH, num_inference_steps=STEPS, seed=seed,
                                progress=False).frames
        r = quality.read_video(out)
        tracks[direction, seed] = quality.centroid_track(out)
        first_videos.setdefault(direction, out)
        rows.append({"caption says": direction, "seed": seed, "video moves": r.direction or "-",
                     "travel, px": round(r.travel_px, 1),
                     "first-frame PSNR, dB": round(quality.first_frame_psnr(out, np.asarray(cropped)), 1)})
html_table(rows)

# %%
matches = sum(r["caption says"] == r["video moves"] for r in rows)
travel = [r["travel, px"] for r in rows]
psnrs = [r["first-frame PSNR, dB"] for r in rows]
print(f"{matches} of {len(rows)} videos move as their caption says ({SEEDS} seed(s) x {len(DIRECTIONS)} captions, "
      f"one first frame); travel {min(travel)}-{max(travel)} px over {video.frames.shape[0]} frames; first frame "
      f"{min(psnrs)}-{max(psnrs)} dB")
if live.is_tiny:  # hyv-tiny's training clips (hyv_lib.tiny.data.render_clip), at the frame's height
    slow, fast = (v * frame.size[1] * (data.FRAMES - 1) for v in data.SPEED)
    print(f"hyv-tiny's training clips travel {slow:.0f}-{fast:.0f} px over {data.FRAMES} frames (data.SPEED)")
if live.bundled_path and model_path is None:  # the shipped hyv-tiny: what its gate script measured
    import json

    gates = json.load(open(os.path.join(live.bundled_path, "gates.json")))["i2v"]
    print(f"hyv-tiny's image-to-video gates (tools/hyv_tiny_gates.py, {len(gates['first_frame_psnr_db']['per_prompt'])} "
          f"held-out captions, each from its own clip's first frame): direction right in "
          f"{gates['rates']['direction']:.1%}, first frame {gates['first_frame_psnr_db']['mean']} dB on average")
fig, axes = plt.subplots(1, 2, figsize=(10, 3))
for (direction, seed), track in tracks.items():
    style = dict(color=f"C{DIRECTIONS.index(direction)}", alpha=0.8, label=direction if seed == 0 else None)
    axes[0].plot(track[:, 0], "o-", ms=3, **style)
    axes[1].plot(track[:, 1], "o-", ms=3, **style)
axes[0].set(xlabel="frame", ylabel="x (px)", title="shape centroid, x (grows to the right)")
axes[1].set(xlabel="frame", ylabel="y (px)", title="shape centroid, y (grows downwards)")
axes[0].legend(title="caption")
fig.tight_layout()
plt.show()
for direction in DIRECTIONS:
    frame_grid(first_videos[direction], columns=5, title=f"seed 0, 'moving {direction}'", scale=1.6)
    plt.show()

# %% [markdown]
# Each line is one video's centroid, frame by frame: all start from the same place, the drawn shape, and fan out
# by caption. In the default run (hyv-tiny, a yellow circle on gray, left and right over 4 seeds) every video
# moves the way its caption says, about 20 to 25 px over 9 frames (a little more than its training clips travel,
# the line before the last; the reading follows the blob's centre, smear included), and the first frame comes back
# at about 31 to 32 dB. The gate script measured the same behaviour on held-out captions (the last line; chapter 7
# explains the gates).
#
# ### Where the caption loses
#
# The caption decides only within what training showed. Here the same circle is drawn at the top edge, its top a
# few pixels below the border, and captioned *up*, next to the middle frame with the same caption (the same
# seeds):

# %%
width_px, height_px = frame.size
top_frame = data.draw_frame(color, shape, background, center=(width_px / 2, 0.22 * height_px), height=height_px,
                            width=width_px)
up_caption = f"a {color} {shape} moving up on a {background} background"
edge_rows, edge_videos = [], {}
for start, image in (("middle", frame), ("top edge", top_frame)):
    for seed in range(SEEDS):
        out = edge_videos[start, seed] = pipe.generate(up_caption, image=image, video_length=VIDEO_LENGTH,
                                                       num_inference_steps=STEPS, seed=seed, progress=False).frames
        track = quality.centroid_track(out)
        edge_rows.append({"first frame": start, "seed": seed, "video moves": quality.read_video(out).direction or "-",
                          "dx, px": round(float(track[-1, 0] - track[0, 0]), 1),
                          "dy, px (up is negative)": round(float(track[-1, 1] - track[0, 1]), 1)})
html_table(edge_rows)

# %%
for start in ("middle", "top edge"):
    moves = [r["video moves"] for r in edge_rows if r["first frame"] == start]
    dy = [r["dy, px (up is negative)"] for r in edge_rows if r["first frame"] == start]
    print(f"{start}, captioned up: {moves.count('up')} of {len(moves)} move up; read as {', '.join(moves)}; "
          f"dy {min(dy)} to {max(dy)} px")
frame_grid(edge_videos["top edge", 0], columns=5, title=f"top edge, {up_caption!r}, seed 0", scale=1.6)
plt.show()

# %% [markdown]
# In the default run every middle frame moves up and no top-edge frame does: there the circle stays against the
# top edge and drifts a few pixels sideways (the dx column); in the strip of seed 0 it swells against the border
# and leaves coloured smears below it, a model pushed outside what it was trained on. Exercise 3 asks why.
#
# Without the image, the same caption is text to video: the model invents the first frame (hyv-tiny does both
# tasks; a real I2V checkpoint refuses to run without an image):

# %%
if "t2v" in live.tasks:
    text_only = pipe.generate(caption, video_length=VIDEO_LENGTH, num_inference_steps=STEPS, seed=0,
                              progress=False).frames
    text_psnr = quality.first_frame_psnr(text_only, np.asarray(cropped))
    print(f"{caption!r} without the image: first frame vs the drawn one {text_psnr:.1f} dB, "
          f"{first_psnr - text_psnr:.1f} dB below the image-to-video run's {first_psnr:.1f} dB; read back: "
          f"{quality.read_video(text_only).color} shape moving {quality.read_video(text_only).direction}")
    frame_grid(text_only, columns=5, title="text to video, same caption and seed", scale=1.6)
    plt.show()
else:
    print(f"{live.name} is an image-to-video checkpoint only: no text-to-video run to compare")

# %% [markdown]
# In the default run the text-only video draws what the caption describes, a yellow circle on gray moving left,
# but from a first frame of its own: a smaller, rougher shape, about 10 dB further from the drawn frame than the
# image-to-video run's. The image is what pins the start.
#
# ## The stage-1 file at real size
#
# At real size the image adds two tensors to the eight text tensors of chapter 0. The table below is computed
# from the preset (`720p_i2v` unless `HYV_PRESET` names another real one) for a 16:9 first frame, in the preset's bf16 (masks are int64, and stage 1 keeps `cond_latents` in
# fp32, as diffusers' VAE returns them):

# %%
real_bucket = bucket_size(table, "16:9")
shapes = table.stage1_shapes(image_size=real_bucket)
dtypes = {k: "float32" if k == "cond_latents" else "int64" if "mask" in k else "bfloat16" for k in shapes}
file_rows_real = tensor_rows(shapes, dtypes)
html_table(file_rows_real)

# %%
image_mib = sum(r["MiB"] for r in file_rows_real if r["name"] in ("image_embeds", "cond_latents"))
text_mib = sum(r["MiB"] for r in file_rows_real) - image_mib
print(f"{table.name}, {real_bucket[1]}x{real_bucket[0]} first frame: the image tensors add {image_mib:.2f} MiB to "
      f"the {text_mib:.2f} MiB of text tensors (+{image_mib / text_mib:.0%})")

# %% [markdown]
# ## What image to video costs
#
# The DiT runs the same shapes for both tasks: the 65 input channels exist in text to video too (zeros), and so do
# the 729 image slots of the context, as the sequences above showed. So the planner (`hyv_lib.planning`, chapters 3 and
# 8) counts the same work for one denoising step of either task (at the preset's 16:9 size, 1280 × 720 for
# `720p_i2v`, and 121 frames), and the same memory per device on a {term}`v6e-8 <slice>` {term}`mesh`
# (`data=2,tensor=4`, {term}`tp_replicated_out`; the planner's own estimate for both, to compare like with like).
# The difference appears only for a kernel that skips padded tokens ({term}`varlen` {term}`FlashAttention` on a
# GPU): there text to video attends over the valid prompt tokens alone, and image to video over 729 more. For a
# short prompt without quoted text, take 120 valid text tokens, as chapter 8 does:

# %%
(H, W), F = real_bucket, 121
PROMPT_TOKENS = 120  # valid context tokens of a short prompt without quoted text (the assumption of chapter 8)
rows, flops = [], {}
for name, valid_context in ((t2v_twin.name, PROMPT_TOKENS), (table.name, PROMPT_TOKENS + table.image_tokens)):
    tokens = token_counts(name, H, W, F)
    every = step_flops(name, H, W, F)
    varlen = step_flops(name, H, W, F, valid_context=valid_context)
    plan = device_plan(name, H, W, F, {"data": 2, "tensor": 4}, "tp_replicated_out")
    flops[name] = (every["total"], varlen["total"])
    rows.append({"preset": name, "joint tokens S": f"{tokens['joint']:,}",
                 "PFLOP/step, all context (Splash, segment ids)": round(every["total"] / 1e15, 3),
                 "valid context tokens": valid_context,
                 "PFLOP/step, valid only (varlen)": round(varlen["total"] / 1e15, 3),
                 "GiB/device (planner, v6e-8)": round(plan["per_device_bytes"]["total"] / 2**30, 2)})
html_table(rows)

# %%
(t2v_all, t2v_var), (i2v_all, i2v_var) = flops[t2v_twin.name], flops[table.name]
print(f"all context counted: i2v - t2v = {(i2v_all - t2v_all) / 1e12:.1f} TFLOP per step")
print(f"valid tokens only: i2v - t2v = {(i2v_var - t2v_var) / 1e12:.1f} TFLOP per step "
      f"(+{i2v_var / t2v_var - 1:.2%}); i2v valid-only is {1 - i2v_var / i2v_all:.2%} below all-context; "
      f"{tokens['video']:,} video tokens")

# %% [markdown]
# So image to video costs the DiT nothing extra under the book's exact kernels ({term}`Splash` with
# {term}`segment ids`, the {term}`XLA` kernel, a dense mask): they compute the 729 masked image slots of text to video
# anyway, and image to video only makes them count. A kernel that skips padding sees the difference, about 1% of a
# step (printed above), because the 729 tokens are a small addition to the video tokens every query attends to
# (111,600 at 720p). Per video there is also stage 1's extra work: SigLIP over one 384 × 384 image and the VAE encoder
# over one frame, once, not per step. The planner leaves them out.
#
# :::{admonition} Takeaway
# :class: tip
# Image to video changes *what* enters the DiT, not *how much*: 729 SigLIP tokens become valid in a joint sequence
# that always had room for them, and 33 input channels that are zeros in text to video now hold the first frame and
# its mask. The planner counts the same FLOPs and memory per step as for text to video (the TPU compile grid of
# chapter 8, made for text to video, compiles the same shapes); only a padding-skipping kernel charges for the
# 729 tokens.
# :::
#
# ## The step-distilled variant
#
# `480p_i2v_step_distilled` samples in 8 steps (the official README also recommends 12) with guidance off: {term}`CFG`
# 1, so each step is one forward of one sample instead of a pair. Its transformer has `use_meanflow=True`: besides the
# timestep $t$ of the current noise level, each call receives `timestep_r`, the timestep $r$ the step goes to. A
# MeanFlow model (Geng et al., 2025) learns the *average* velocity over $[r, t]$ rather than the velocity at $t$, so a
# long {term}`Euler step <flow matching>` from $t$ to $r$ stays on course.
# `hyv_lib.models.hunyuan_video15.sampling.sampling_schedule` gives the loop's timesteps for the preset's {term}`shift <flow shift>`
# (7) and the $r$ of each step, the next timestep and 0 after the last, as diffusers' I2V pipeline passes it:

# %%
distilled = PRESETS["480p_i2v_step_distilled"]
timesteps, timestep_r = sampling_schedule(FlowMatchEulerDiscreteScheduler(shift=distilled.flow_shift),
                                          distilled.default_steps)
html_table([{"step": i, "sigma": round(float(t) / 1000, 4), "timestep t": round(float(t), 2),
             "timestep_r": round(float(r), 2), "t - r": round(float(t - r), 2)}
            for i, (t, r) in enumerate(zip(timesteps, timestep_r))])

# %%
fig, ax = plt.subplots(figsize=(7, 3.2))
for preset in (PRESETS["480p_i2v"], PRESETS["720p_i2v"], distilled):
    ts, _ = sampling_schedule(FlowMatchEulerDiscreteScheduler(shift=preset.flow_shift), preset.default_steps)
    n = len(ts)
    ax.step(np.arange(n + 1) / n, np.append(ts.numpy() / 1000, 0), where="post", marker="o" if n < 20 else None,
            ms=4, label=f"{preset.name}: {n} steps, shift {preset.flow_shift:g}")
ax.set(xlabel="fraction of the loop", ylabel="sigma (noise level)", title="Sampling schedules of the I2V presets")
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()
full = 50 * step_flops("480p_i2v", 480, 848, 121)["total"]
fast = distilled.default_steps * step_flops(distilled, 480, 848, 121, batch=1)["total"]
print(f"DiT work per 480p video, 121 frames: 480p_i2v 50 steps x CFG pair = {full / 1e15:.0f} PFLOP; "
      f"step-distilled {distilled.default_steps} steps x 1 sample = {fast / 1e15:.1f} PFLOP ({full / fast:.1f}x less)")

# %% [markdown]
# The shift spends the 8 steps at high noise: half of them above $\sigma = 0.9$, and the last step jumps from 0.5
# straight to 0, the longest interval of the schedule. Together with CFG off, the planner's count of DiT work per
# 480p video falls 12.5×, from 50 steps of a pair to 8 steps of one sample. On a mesh, the missing pair changes the
# layout too: with one sample per step there is nothing for a `data` axis to split, so `hyv_lib` refuses
# `data=2` with CFG off and every chip goes on `tensor` (see the runbook's {ref}`runbook-i2v`).
#
# ## Summary
#
# * Image to video gives the DiT a first frame in two places: SigLIP's 729 tokens in the image slots of the joint
#   sequence, and the frame's VAE latents in latent frame 0 of 32 condition channels with a mask channel, concatenated
#   to the noisy latents (65 input channels). Text to video passes the same shapes as zeros, masked out.
# * The frame's bucket, the preset's size nearest its aspect ratio, decides the video's size.
# * hyv-tiny, fine-tuned for both tasks, animates a drawn frame; the caption alone decides the direction, which the
#   live run measured from the shape's centroid track.
# * The stage-1 file of `720p_i2v` gains `image_embeds` [1, 729, 1152] and `cond_latents` [1, 32, 1, 45, 80] for a
#   16:9 frame (`Preset.stage1_shapes(image_size=...)`).
# * A step costs the same as text to video under exact kernels that compute the padded slots; only a kernel that
#   skips padding charges for the 729 now-valid tokens.
# * The step-distilled variant runs 8 steps at shift 7 with CFG off, and its MeanFlow transformer reads the next
#   timestep as `timestep_r` (0 on the last step).
#
# ## Exercises
#
# Marked ★ (easy) to ★★★ (hard), and *open* where no one has the answer yet ({ref}`notation-exercises`).
#
# 1. ★ A 1920 × 1080 photo and a 1280 × 720 one go to `720p_i2v`. What size is each video, and why can `--height`
#    not be given with `--image_path`?
# 2. ★ Why does text to video pass 729 image tokens at all, instead of a sequence 729 tokens shorter?
# 3. ★★ In "Where the caption loses", the circle at the top edge captioned *up* did not move up, while the same
#    caption moved the middle circle up. Why? What would hyv-tiny's training data need for the top-edge frame to
#    move up, and what would that video show? (Hint: `data.render_clip`.)
# 4. ★ How many MiB do the image tensors add to a 480p_i2v stage-1 file for a 16:9 frame?
# 5. ★★ With 12 steps instead of 8, what are the step-distilled variant's first three timesteps, and its last
#    `timestep_r`?
# 6. **Open.** Can the same checkpoint continue a video, given its first *several* frames instead of one? The
#    condition channels have room for every latent frame and the mask channel says which are given, but diffusers'
#    pipeline and `hyv_lib` fill only latent frame 0, and nobody here has tried more.
#
# :::{admonition} Answers
# :class: dropdown
# 1. Both have ratio 16:9, so both get the same bucket, `hyv_lib.pipeline.image.image_bucket(hyv_lib.get_preset("720p_i2v"),
#    image)` = 720 × 1280 (height × width): the photo is resized to cover it and centre-cropped. The condition
#    latents are one latent frame of the bucket's size, and the video's latents must match them, so a different
#    height or width could not hold the frame: `hyv_lib` refuses it with an error naming `--height`.
# 2. One model input layout for both tasks. The checkpoints share the DiT's architecture, and diffusers' forward
#    decides the task from the data (all-zero image embeddings are masked out), so t2v keeps the slots and pays
#    for them in any kernel that computes padded positions. It also keeps the compiled TPU program the same shape.
# 3. hyv-tiny's training clips always start where the whole path fits inside the frame (`data.render_clip`
#    picks the start so that the shape, 2 px of margin included, never leaves it), so an *up* clip never begins
#    near the top: a shape at the top edge captioned *up* is a start the model never saw with that caption, and
#    moving up would take it out of the frame, which no training clip does. The frame wins and the caption
#    loses. To make it move up, the data would need clips whose shape leaves the frame (a start anywhere, the
#    path clipped at the border); the video would then show the circle sliding out through the top edge and an
#    empty background after it, and the reader (`quality.read_video`) would need a rule for a shape that
#    disappears.
# 4. `tensor_rows(PRESETS["480p_i2v"].stage1_shapes(image_size=bucket_size(PRESETS["480p_i2v"], "16:9")), ...)`:
#    the bucket is 480 × 848, so `cond_latents` is [1, 32, 1, 30, 53] in fp32, about 0.19 MiB, and
#    `image_embeds` [1, 729, 1152] in bf16 is 1.60 MiB, as at 720p: about 1.80 MiB in all.
# 5. `sampling_schedule(FlowMatchEulerDiscreteScheduler(shift=7.0), 12)`: sigmas 1, 11/12, 10/12, ...
#    shifted by $7\sigma / (1 + 6\sigma)$ give 1000, 987.18 and 972.22 for the first three; the last timestep is
#    $1000 \cdot (7/12) / (1 + 6/12) = 388.89$, and its `timestep_r` is 0: that step lands on clean latents.
# 6. A start: build the condition with more latent frames given (`hyv_lib.models.flow_matching.condition_channels`
#    shows the layout) and the mask 1 on them, generate with hyv-tiny from the first 5 frames of a held-out clip,
#    and measure with `quality.centroid_track` whether the motion continues at the clip's speed. (Whether SigLIP's
#    tokens of one frame still suffice is a second question.)
# :::
