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
# # 5. End-to-end 720p generation
#
# The earlier chapters took the pipeline apart. This one runs it whole at the real output size: 1280×720 pixels,
# through all three stages. On this CPU that means the real latent layout ($h \times w$ = 45 × 80 latents per
# latent frame) and the real {term}`VAE` tiling, with fewer frames ($F$ = 9 instead of 121) and a tiny model that
# was taught to draw at this size, hyv-tiny-720p (preset `tiny_trained_720p`; what it is and how well it draws:
# below; symbols: {doc}`../book/notation`). The latents and the VAE's work are the real size's; the {term}`DiT`'s
# are not: it groups 5 × 5 latents into one token, so it attends over 25 times fewer video tokens than the 8.3B
# model would at the same size (printed below), and its cost per step says nothing about the real model's. On a
# TPU VM or a GPU box, the same notebook runs the 8.3B model: set `HYV_PRESET=720p_t2v`, `HYV_MODEL_PATH` and, for
# the TPU mesh, `HYV_RUNTIME=jax HYV_MESH=data=2,tensor=4` (see {doc}`../book/runbook`).
#
# We measure, per stage, the wall time and the peak memory. Stage 3, the VAE decode, gets a closer look: at
# 720p and 121 frames the decoder cannot run on the whole video at once, so diffusers decodes it in overlapping
# spatial tiles (the figure below). The tiles are spatial only: each one spans every frame of the video. We derive
# why one piece does not fit and what one tile needs, compare tiles against one piece on the tiny model, and end
# with the per-chip plan for a v6e-8.
#
# :::{figure} ../book/figures/05_tiled_vae_decode.svg
# :name: fig-05-tiled-vae-decode
#
# The tiled VAE decode of `AutoencoderKLHunyuanVideo15` at 720p. The latent grid (45 × 80) is cut into tiles of
# 16 × 16 latents (256 px at 16× compression) every 12 latents, so neighbours overlap by 4 latents; each tile
# is decoded alone, over all frames (there is no tiling in time), into 256 × 256 pixels. In the output, each tile keeps 192 px, and its first
# 64 px are blended linearly with the neighbour above or to the left. Bottom: the largest tensors of a one-piece
# decode against one tile's, in fp32, and what one tile's whole decode needs in bf16 by the TPU compiler, beside one
# accelerator's memory (all derived or read in this chapter).
# :::

# %% tags=["parameters"]
import os

PRESET = os.environ.get("HYV_PRESET", "tiny_trained_720p")
MODEL_PATH = os.environ.get("HYV_MODEL_PATH") or None
PROMPT = os.environ.get("HYV_PROMPT", "a red circle moving left on a black background")  # held out: never trained on
HEIGHT = int(os.environ.get("HYV_HEIGHT", "720"))
WIDTH = int(os.environ.get("HYV_WIDTH", "1280"))
VIDEO_LENGTH = int(os.environ.get("HYV_VIDEO_LENGTH", "9"))  # the real model's default is 121
STEPS = int(os.environ.get("HYV_STEPS", "0")) or None        # None: the preset's default (50 for real presets)
RUNTIME = os.environ.get("HYV_RUNTIME", "torch")              # torch | jax (| ulysses under torchrun)
MESH = os.environ.get("HYV_MESH") or None                     # e.g. data=2,tensor=4 on a v6e-8, with RUNTIME=jax
ATTENTION = os.environ.get("HYV_ATTENTION", "auto")            # exact by default; flash on a GPU, splash on a TPU
ENABLE_CACHE = os.environ.get("HYV_ENABLE_CACHE", "0") == "1"
# Decode once more without tiles, for comparison: on by default for the tiny presets only. With real weights at
# 720p a one-piece decode needs far more memory than one accelerator has (derived below); opt in with care.
COMPARE_UNTILED = os.environ.get("HYV_COMPARE_UNTILED", "1" if PRESET.startswith("tiny") else "0") == "1"
OUTPUT_DIR = os.environ.get("HYV_OUTPUT_DIR", "stage_outputs/end_to_end_720p")

# %%
import time
import warnings

warnings.filterwarnings("ignore", message="IProgress not found")

import matplotlib.pyplot as plt
import numpy as np
import torch
from diffusers import AutoencoderKLHunyuanVideo15
from IPython.display import display

import hyv_lib
from hyv_lib.base.memory import PeakMemory
from hyv_lib.models.components import load_components, quiet_loading
from hyv_lib.notebook.display import frame_grid, html_table, video_html
from hyv_lib.pipeline.stage_io import read_config
from hyv_lib.pipeline.stages import generate
from hyv_lib.planning.hardware import get_chip, layout_label
from hyv_lib.planning.planner import plan_table
from hyv_lib.runtimes.vae import decode_latents, to_uint8_frames
from hyv_lib.tiny import quality

torch.set_num_threads(os.cpu_count() or 1)
preset = hyv_lib.get_preset(PRESET)
latent = preset.latent_shape(HEIGHT, WIDTH, VIDEO_LENGTH)
patch = preset.transformer.get("patch_size", 1)  # latents per token side: 1 in every HunyuanVideo-1.5 checkpoint
tokens = latent[2] * (latent[3] // patch) * (latent[4] // patch)
print(f"{PRESET}: {WIDTH}x{HEIGHT}, {VIDEO_LENGTH} frames -> latents {latent}; {patch} x {patch} latents per token: "
      f"{tokens:,} video tokens per sample ({latent[3] // patch} x {latent[4] // patch} per latent frame)")
if patch > 1:
    print(f"with 1 x 1 latent per token, as in every HunyuanVideo-1.5 checkpoint: {latent[2] * latent[3] * latent[4]:,} "
          f"video tokens per sample, {patch * patch}x as many")

# %% [markdown]
# ## The three stages
#
# `generate` runs stage 1 (text encoders), stage 2 (the {term}`DiT`'s denoising loop) and stage 3 (VAE decode, tiled)
# into one folder. Every stage appends its settings, its time and its memory to `generation_config.json`. A sampler
# thread records the peak resident memory (RSS) of the process while the stage's main work runs
# (`hyv_lib.base.memory.PeakMemory`), along with how far it rose above the RSS at the start.

# %%
start = time.perf_counter()
with quiet_loading():  # no weight-loading progress bars
    frames = generate(preset=PRESET, model_path=MODEL_PATH, prompt=PROMPT, output_dir=OUTPUT_DIR,
                      height=HEIGHT, width=WIDTH, video_length=VIDEO_LENGTH, num_inference_steps=STEPS,
                      runtime=RUNTIME, mesh=MESH, enable_cache=ENABLE_CACHE, attention=ATTENTION, quiet=True)
total = time.perf_counter() - start
config = read_config(OUTPUT_DIR)
html_table([{"stage": name, "time, s": config[f"stage{i}_time_s"],
             "peak RSS, MiB": config[f"stage{i}_peak_rss_mib"], "RSS growth, MiB": config[f"stage{i}_rss_growth_mib"]}
            for i, name in ((1, "1: text encoders"), (2, f"2: {config['num_inference_steps']} denoising steps"),
                            (3, "3: VAE decode (tiled)"))])

# %%
print(f"end to end: {total:.1f} s; video {tuple(frames.shape)} (frames, height, width, RGB)")
frame_grid(frames.numpy(), columns=5, title=f"{PRESET} at {WIDTH}x{HEIGHT}: {PROMPT!r}", scale=2.0)
plt.show()
reading = quality.read_video(frames.numpy())
print(f"read from the frames: a {reading.color} shape moving {reading.direction} ({reading.travel_px:.0f} px) on a "
      f"{reading.background} background; the prompt: {PROMPT!r}")

# %%
mp4 = os.path.join(OUTPUT_DIR, "output_video.mp4")
if PRESET == "tiny":  # random weights: noise, which H.264 cannot compress; the book does not publish it
    print(f"{mp4}: {os.path.getsize(mp4) / 2**20:.1f} MiB of H.264 noise, not embedded (the frames are above)")
else:
    print(f"{mp4}: {os.path.getsize(mp4) / 2**10:.0f} KiB")
    display(video_html(mp4, width=640, media_dir="../_static/videos"))  # linked: the page refers to a copy of the file

# %% [markdown]
# ## The model: hyv-tiny-720p
#
# hyv-tiny, the model chapter 7 trains, learned at 64 × 112 pixels: a 4 × 7 latent grid, where a shape is about
# one latent wide. Asked for 1280 × 720 (45 × 80 latents, shapes 12 to 18 latents wide) it paints the background
# and no shape. Two parts of it stood in the way, and `tools/train_hyv_tiny_720p.py` fixes each:
#
# * **The VAE's decoder.** Decoding the latents of a real 720p clip gave a wrong background and a dark ring with no
#   colour where the shape was: the decoder had never seen a latent deep inside a large flat shape. The fine-tune
#   trains the decoder alone on 128 × 128-pixel crops of 720p latents (and of 288 × 512 and 64 × 112 ones) against
#   the rendered pixels. The encoder is frozen, so every latent, and everything the DiT learns from them, is
#   hyv-tiny's.
# * **The {term}`DiT`.** A first fine-tune of hyv-tiny's 3-block, 64-wide DiT on the full 45 × 80 grid ran 1,570
#   steps (2.3 hours here) and still drew dozens of latent-sized speckles at 720p; after 1,000 of them the
#   foreground colour read right for 1 of 8 held-out captions
#   (`benchmarks/results/hyv_tiny_720p_full_grid_eval_2026-11-27_cpu.json`). So hyv-tiny-720p's DiT groups 5 × 5
#   latents into one token (diffusers' `patch_size=5`; every HunyuanVideo-1.5 checkpoint uses 1): a 720p latent
#   frame is 9 × 16 tokens, a scale between the 64 × 112 and 288 × 512 grids hyv-tiny and its first fine-tune drew
#   well at. It starts as hyv-tiny (patch embedding averaged over the patch, output layer copied to each position)
#   and is fine-tuned on one 720p clip per training caption.
#
# The text encoders are hyv-tiny's, unchanged; the new DiT and VAE are stored beside hyv-tiny's weights
# (`transformer_720p`, `vae_720p`), and the preset maps them in (`Preset.bundled_subfolders`). The cell below reads
# what `tools/eval_hyv_tiny_720p.py` measured on captions never trained on at any size, and decodes the latents of
# the first frame of one held-out 720p clip with both decoders:

# %%
import json

from hyv_lib.tiny import data, train

if PRESET == "tiny_trained_720p":
    with open(os.path.join(preset.bundled_path, "gates_720p.json")) as f:
        gates = json.load(f)
    psnr_db, rates = gates["vae_psnr_db"], gates["rates"]
    print(f"VAE, encode -> tiled decode of {gates['vae_clips']} held-out 720p clips: hyv-tiny's decoder "
          f"{psnr_db['hyv_tiny_decoder']} dB, hyv-tiny-720p's {psnr_db['this_decoder']} dB PSNR")
    print(f"DiT, {gates['held_out_prompts']} held-out captions at 720x1280 ({gates['num_inference_steps']} steps, "
          f"guidance {gates['guidance_scale']}): colour read right {rates['color']:.0%}, direction "
          f"{rates['direction']:.0%}, background {rates['background']:.0%}")
    _, held_out = data.split_combos()
    clip = data.render_clip(held_out[0], seed=gates["seed"], height=720, width=1280)
    with quiet_loading():
        decoders = {"hyv-tiny's decoder": load_components(hyv_lib.get_preset("tiny_trained"), None, ["vae"])["vae"],
                    "hyv-tiny-720p's decoder": load_components(preset, MODEL_PATH, ["vae"])["vae"]}
    # The first frame alone: the VAE is causal in time (its first latent frame encodes frame 0 only and decodes to
    # frame 0 only), so this is the clip's frame 0 as a whole-clip round trip draws it (measured: within one level
    # of 255) in about a quarter of the time (18 s against 78 s for one decoder here).
    first = clip[:, :1]
    clip_latents = train.encode_latents(decoders["hyv-tiny's decoder"], torch.from_numpy(first)[None], progress=False)
    panels = {"rendered clip": to_uint8_frames(first).numpy()} | {
        name: decode_latents(d, clip_latents).numpy() for name, d in decoders.items()}
    fig, axes = plt.subplots(len(panels), 1, figsize=(8.8, 5.2 * len(panels)))
    for ax, (name, video) in zip(axes, panels.items()):
        ax.imshow(video[0])
        ax.set(title=f"{name}, frame 0", xticks=[], yticks=[])
    fig.suptitle(f"{held_out[0].caption!r} (held out), 1280x720", y=1.0)
    plt.tight_layout()
    plt.show()

# %% [markdown]
# On captions it never saw, hyv-tiny-720p draws one shape of the right colour on the right background most of the
# time (87% and 100% of the 15); the direction of its motion is right less than half the time (47%). The shape is
# a blob, blocky at the 80-pixel token grid, and backgrounds carry speckles: the video above is one of its cleaner
# kinds (a bright shape on black); on gray or purple the speckles are dense (try
# `HYV_PROMPT="a green circle moving left on a gray background"`). Our guess, not tested: a 64-wide token that must
# predict 5 × 5 × 16 = 400 latent values cannot cancel all of the noise it starts from. The decoder's fine-tune is
# a partial fix, as the figure shows: where hyv-tiny's decoder draws a dark ring on a purple field, the new one
# draws the red disc, but the black background far from the shape still comes out wrong (dark green), so the round
# trip of a real clip gains only 1.9 dB (12.44 to 14.32 dB). What the DiT generates decodes with the right
# background in all 15 videos. None of this is the 8.3B model's quality: it is a small model drawing at the real
# size, so that the pipeline's output here can be checked against its prompt.
#
# ## VAE decoding in tiles
#
# diffusers' `AutoencoderKLHunyuanVideo15` decodes in spatial tiles when tiling is on (`hyv_lib` turns it on;
# `--disable_tiling` turns it off) and the latent is larger than one tile. The tile size and overlap are attributes
# of the VAE; here they are, read from the installed diffusers, with the tiles they give for this latent:

# %%
with quiet_loading():  # no weight-loading progress bars
    vae = load_components(preset, MODEL_PATH, ["vae"])["vae"]  # the one stage 3 decoded with
tile, overlap = vae.tile_latent_min_height, vae.tile_overlap_factor
stride = int(tile * (1 - overlap))
row_starts, col_starts = range(0, latent[3], stride), range(0, latent[4], stride)
print(f"tile {vae.tile_sample_min_height} px = {tile} latents, overlap factor {overlap}: a new tile every {stride} "
      f"latents, neighbours share {tile - stride} latents; blend {int(vae.tile_sample_min_height * overlap)} px, "
      f"keep {vae.tile_sample_min_height - int(vae.tile_sample_min_height * overlap)} px per tile")
print(f"latent {latent[3]} x {latent[4]}: {len(row_starts)} row(s) x {len(col_starts)} column(s) = "
      f"{len(row_starts) * len(col_starts)} tile(s), each decoded over all {VIDEO_LENGTH} frames")

# %% [markdown]
# ### Why one piece does not fit at 720p and 121 frames
#
# The decoder narrows as it upsamples: its five stages run at 1024, 1024, 512, 256 and 128 channels (the VAE
# config's `block_out_channels` `[128, 256, 512, 1024, 1024]`, read backwards), doubling height and width four
# times (16×) and the frames twice ($T$ = 31 latent frames become $F = 1 + 4 \cdot 30 = 121$). The largest tensors
# are the last stage's, $c = 128$ channels at full size (and, just as large, the 512-channel output of the last
# upsampler's convolution, just before it moves channels into pixels). In fp32, the default `--vae_dtype`
# ($x = 4$ bytes):
#
# $$c \cdot F \cdot H \cdot W \cdot x = 128 \cdot 121 \cdot 720 \cdot 1280 \cdot 4\,\text{B}
# = 5.71 \times 10^{10}\,\text{B} \approx 53.2\ \text{GiB}$$
#
# (26.6 GiB in bf16). One resnet block holds several tensors of that size at once: its input for the residual,
# the padded copy its causal convolution makes, and the convolution's output. A TPU v6e chip has 32 GiB of
# {term}`HBM` and an H100 79.6 GiB (what the card reports, 81,559 MiB, of its 80 GiB of HBM3). There is a second
# large item: the mid block's self-attention runs over all $T h w = 31 \cdot 45 \cdot 80 = 111{,}600$ latent
# positions, and diffusers' decoder builds a dense causal mask for it of $111{,}600^2 \cdot 4\,\text{B} \approx 46.4$ GiB (`hyv_lib`'s torch
# decode runs that attention frame by frame instead, with no such mask:
# `hyv_lib.models.patches.frame_causal_attention`). One 256 × 256 tile still spans all 121 frames,
# so its largest tensor is $128 \cdot 121 \cdot 256 \cdot 256 \cdot 4\,\text{B} \approx 3.8$ GiB, $720 \cdot 1280 / 256^2
# \approx 14$ times less, and its mask covers only $31 \cdot 16 \cdot 16 = 7{,}936$ positions.
#
# The cell below checks this against diffusers' own decoder: it builds the real 720p VAE config from
# `hyv_lib.models.hunyuan_video15.presets` on PyTorch's `meta` device (shapes only, no weights, no memory), runs the decoder on a
# 720p/121f latent and on one tile, and records the largest tensor any decoder module returns.

# %%
real = hyv_lib.get_preset("720p_t2v")
with torch.device("meta"):
    real_vae = AutoencoderKLHunyuanVideo15(**real.vae)


def decoder_sizes(vae, latent_shape):
    """The size of the largest tensors decoder modules return (elements, their distinct shapes), and the number of
    positions the mid block attends over."""
    outputs, attended = [], []
    hooks = [m.register_forward_hook(lambda m, args, out: outputs.append((out.numel(), tuple(out.shape))))
             for m in vae.decoder.modules() if m is not vae.decoder]
    attention = vae.decoder.mid_block.attentions[0]
    hooks.append(attention.register_forward_pre_hook(lambda m, args: attended.append(np.prod(args[0].shape[2:]))))
    try:
        with torch.no_grad():
            vae.decoder(torch.empty(latent_shape, device="meta"))
    finally:
        for hook in hooks:
            hook.remove()
    largest = max(n for n, _ in outputs)
    return (largest, sorted({shape for n, shape in outputs if n == largest})), int(attended[0])


full_latent = real.latent_shape(720, 1280, 121)
tile_latent = full_latent[:3] + (tile, tile)
fp32, bf16, gib = 4, 2, 2**30
(full_n, full_shape), full_tokens = decoder_sizes(real_vae, full_latent)
(tile_n, tile_shape), tile_tokens = decoder_sizes(real_vae, tile_latent)
formula = 128 * 121 * 720 * 1280 * fp32
print(f"formula: 128 x 121 x 720 x 1280 x 4 B = {formula:.3e} B = {formula / gib:.1f} GiB")
print(f"one piece, latent {full_latent}: largest decoder tensors {full_shape} = {full_n * fp32 / gib:.1f} GiB in fp32, "
      f"{full_n * bf16 / gib:.1f} GiB in bf16; mid-block mask over {full_tokens:,} positions: "
      f"{full_tokens**2 * fp32 / gib:.1f} GiB")
print(f"one tile,  latent {tile_latent}: largest decoder tensors {tile_shape} = {tile_n * fp32 / gib:.1f} GiB in fp32; "
      f"mid-block mask over {tile_tokens:,} positions: {tile_tokens**2 * fp32 / gib:.2f} GiB")
for chip in ("v5e", "v6e", "H100"):
    spec = get_chip(chip)
    print(f"{spec.name}: {spec.hbm_bytes / gib:.1f} GiB of memory")

# %% [markdown]
# The decoder agrees with the formula: 53.2 GiB for its largest tensor in one piece, 3.8 GiB in a tile.
#
# The largest tensor is not the whole story, though. A tile's decode holds several tensors of that size at once,
# plus the decoder's weights, and it spans all 121 frames, because diffusers' tiles are spatial only. What one tile
# needs on an accelerator is what a compiler says about the whole program. `hyv_lib.planning.vae_compile.compile_decode`
# compiles the jitted decoder of the largest tile for a v6e chip on a machine without a TPU (as chapter 3 does for
# the DiT) and reads the compiler's memory analysis; it takes tens of minutes on this CPU, so the chapter reads the
# saved report, the same one the {doc}`../book/runbook` quotes for stage 3. It is for bf16:

# %%
with open(os.path.join(os.path.dirname(hyv_lib.__file__), "compiled", "tpu_vae_decode.json")) as f:
    tile_report = json.load(f)["720p_t2v/v6e:2x4/121f"]  # saved by compile_decode("720p_t2v", "v6e:2x4")
b = tile_report["per_device_bytes"]
print(f"one {tile_report['tile_pixels'][0]} x {tile_report['tile_pixels'][1]} px tile, latent "
      f"{tile_report['tile_latents']} (all {tile_report['size']['video_length']} frames), {tile_report['dtype']}, "
      f"compiled for a {tile_report['device_kind']}: {b['total'] / gib:.1f} GiB per device = "
      f"{b['arguments'] / gib:.1f} GiB of weights and latents + {b['temporaries'] / gib:.1f} GiB of temporaries + "
      f"{b['outputs'] / gib:.2f} GiB of output + {b['code'] / gib:.2f} GiB of code")
print(f"the temporaries are {b['temporaries'] / (tile_n * bf16):.1f}x the tile's largest tensor in bf16 "
      f"({tile_n * bf16 / gib:.1f} GiB); usable HBM per device {tile_report['hbm_available_per_device'] / gib:.2f} GiB, "
      f"fits: {tile_report['fits']}")

# %% [markdown]
# So one bf16 tile needs 25.2 GiB per device, most of it temporaries: about twelve tensors the size of the tile's
# largest alive at the peak. That fits a v6e chip's 31.25 GiB, not a v5e's 16 GiB. Only the temporaries grow with
# the video's length; the 1.6 GiB of weights do not.
#
# :::{admonition} Takeaway
# :class: tip
# Decoding 720p/121f in one piece needs a single 53.2 GiB tensor (128 ch × 121 × 720 × 1280 in fp32), several of
# them at once, and, in diffusers' decoder, a 46.4 GiB attention mask in the mid block: more than a 32 GiB v6e chip
# and, together, more than an H100's 79.6 GiB. A 256 px tile cuts the largest tensor to 3.8 GiB in fp32 (1.9 GiB
# in bf16), but a tile spans all 121 frames, and its whole decode in bf16, compiled for a v6e chip, needs 25.2 GiB
# per device. That is why `hyv_lib` decodes in tiles by default, why a tile fits a v6e chip but not a v5e, and why this notebook never
# decodes real 720p weights in one piece unless asked to.
# :::
#
# ## Tiles against one piece
#
# At the tiny model's widths a one-piece decode fits easily, so we can compare. Stage 3 above decoded in tiles
# (its memory is in `generation_config.json`); below, the same latents are decoded once more in tiles and once in
# one piece, each timed alone (`HYV_COMPARE_UNTILED`, on by default for the tiny presets only), and we compare time,
# memory and pixels. The time of stage 3 also covers loading the VAE and writing the mp4; the two rows below it are
# the decode alone.

# %%
from safetensors.torch import load_file

latents = load_file(os.path.join(OUTPUT_DIR, "stage2_latents.safetensors"))["latents"]
rows = [{"decode": "tiled (stage 3)", "time, s": config["stage3_time_s"],
         "RSS growth, MiB": config["stage3_rss_growth_mib"], "peak RSS, MiB": config["stage3_peak_rss_mib"]}]
seconds = {}
if COMPARE_UNTILED:
    for name, tiling in (("tiled", True), ("one piece", False)):
        with PeakMemory() as memory:
            t0 = time.perf_counter()
            decoded = decode_latents(vae, latents, tiling=tiling).numpy()
            seconds[name] = time.perf_counter() - t0
        rows.append({"decode": f"{name} (decode only)", "time, s": round(seconds[name], 1),
                     "RSS growth, MiB": round(memory.growth_bytes / 2**20, 1),
                     "peak RSS, MiB": round(memory.peak_bytes / 2**20, 1)})
    one_piece = decoded
else:
    print("HYV_COMPARE_UNTILED=0: no one-piece decode (the default for real presets)")
display(html_table(rows))
# The pixels the tiles decode per frame: every tile is up to 256 px, cut short by the frame's edge (exercise 4)
tile_px, stride_px = vae.tile_sample_min_height, stride * (vae.tile_sample_min_height // tile)
decoded_px = (sum(min(tile_px, HEIGHT - r) for r in range(0, HEIGHT, stride_px))
              * sum(min(tile_px, WIDTH - c) for c in range(0, WIDTH, stride_px)))
print(f"the tiles decode {decoded_px:,} pixels per frame for the {HEIGHT * WIDTH:,} kept: "
      f"{decoded_px / (HEIGHT * WIDTH):.2f}x")
if seconds:
    ratio = seconds["tiled"] / seconds["one piece"]
    print(f"decode time, tiled / one piece: {seconds['tiled']:.1f} s / {seconds['one piece']:.1f} s = {ratio:.2f}x, "
          f"{'more' if ratio > decoded_px / (HEIGHT * WIDTH) else 'less'} than the ratio of pixels")

# %%
if COMPARE_UNTILED:
    tiled = frames.numpy()
    difference = np.abs(tiled.astype(int) - one_piece.astype(int))
    # The blend bands: the first 64 px of every tile after the first, in each direction
    blend, keep = int(vae.tile_sample_min_height * overlap), vae.tile_sample_min_height - int(
        vae.tile_sample_min_height * overlap)
    band = np.zeros(difference.shape[1:3], bool)
    for start in range(keep, HEIGHT, keep):
        band[start:start + blend, :] = True
    for start in range(keep, WIDTH, keep):
        band[:, start:start + blend] = True
    print(f"tiled vs one piece: PSNR {quality.psnr(tiled, one_piece, 255):.1f} dB, max |difference| "
          f"{difference.max()} (of 255); mean |difference| in the blend bands {difference[:, band].mean():.2f}, "
          f"elsewhere {difference[:, ~band].mean():.2f} ({band.mean():.0%} of the pixels are in the bands)")
    fig, ax = plt.subplots(figsize=(8.8, 4.5))
    image = ax.imshow(difference[len(difference) // 2].max(axis=-1), cmap="magma")
    fig.colorbar(image, ax=ax, fraction=0.03, pad=0.02, label="|difference|, largest of R, G, B (of 255)")
    for start in range(keep, HEIGHT, keep):  # where each blend band begins: the tile seams
        ax.axhline(start - 0.5, color="w", lw=0.5, ls=":")
    for start in range(keep, WIDTH, keep):
        ax.axvline(start - 0.5, color="w", lw=0.5, ls=":")
    ax.set(title="|tiled - one piece|, middle frame (dotted: where the tile seams' blend bands begin)",
           xticks=[], yticks=[])
    plt.show()

# %% [markdown]
# On the tiny model the two decodes differ by a level or two of 255 on average, a little more in the blend bands
# than elsewhere (the printed means). The map shows where: the largest differences sit on and around the shape,
# not along the seams, because each tile's decoder (its mid block's attention, its convolutions' borders) sees only
# that tile, and the shape is where the decoded values change most. Tiling trades this small difference, and time,
# for bounded memory: the one-piece decode's memory grows with the whole frame, the tiled decode's with one tile
# (plus the decoded tiles it keeps until it blends them, and the output). How much time, the two lines under the
# table say: the tiles decode 1.65 times the pixels they keep (their overlaps more than once: exercise 4), and the
# tiled decode took the printed multiple of the one-piece decode's time, which the line compares with the pixel
# ratio. The two need not agree: the time per pixel of a 256 px tile is not that of the whole frame. Where the time
# ratio is the larger, our guess, not measured here, is that the decoder's layers use this CPU's cores less well on
# 28 small tensors than on one large one.
#
# ## The files
#
# The three hand-off files, and what they weigh at this size:

# %%
html_table([{"file": name, "MiB": round(os.path.getsize(os.path.join(OUTPUT_DIR, name)) / 2**20, 2)}
            for name in ("stage1_embeddings.safetensors", "stage2_latents.safetensors", "output_video.mp4")])

# %% [markdown]
# ## At real size: the v6e-8 plan
#
# With the real 720p model, the same notebook's stage 2 runs on the TPU {term}`mesh` (`HYV_RUNTIME=jax
# HYV_MESH=data=2,tensor=4`). The planner (`hyv_lib.planning`, chapter 3) gives what one {term}`CFG` step needs per
# chip at 121 frames, on two layouts with the same rule set ({term}`tp_replicated_out`): `hyv_lib`'s default mesh,
# `data=2,tensor=4`, and `tensor=8`, the only mesh the published TPU runs used (gpu-tpu-pedia's script builds `(tp, dp, sp) = (8, 1,
# 1)` for every run, with the row-parallel weights replicated as `tp_replicated_out` does). The memory is the TPU
# compiler's where that layout was compiled for a v6e-8 on a CPU (`python -m hyv_lib compile`, chapter 3), the
# planner's otherwise (the `memory from` column). The lower bounds assume peak FLOP/s, full HBM bandwidth and half the
# bidirectional {term}`ICI` bandwidth. The last column is a cited measurement with the {term}`MFU` it implies, on the
# row of the layout it was measured on only: the fastest time gpu-tpu-pedia published for that layout, its v6e-8 run
# with a custom exp2 {term}`Splash` kernel, 5.81 s/step (the stock-Splash baseline on the same layout is 7.29 s/step;
# a single author's reports, not reproduced here; see {ref}`references-baselines`). No one has published a time for
# the default layout, so its row has none:

# %%
rows = []
for r in plan_table(presets=("720p_t2v",), chips=("v6e",), rules="tp_replicated_out"):
    whose = "hyv_lib default" if r["layout"] == "default" else "cited run"
    rows.append({"preset": r["preset"], "chips": f"{r['n_chips']}x {r['chip']}",
                 "layout": f"{layout_label(r['mesh'])} ({whose})",
                 "PFLOP/step": round(r["pflop_per_step"], 2),
                 "weights GiB/chip": round(r["weights_gb_per_device"] * 1e9 / gib, 2),  # the planner's rows are in 1e9 B
                 "rest GiB/chip": round(r["activations_gb_per_device"] * 1e9 / gib, 2), "memory from": r["memory_source"],
                 "fits": r["fits"],
                 "bound s/step": round(r["bound_s"], 2), "limit": r["limit"],
                 "cited s/step (MFU)": f"{r['cited_s']} ({r['cited_mfu']:.0%})" if r["cited_s"] else "-"})
html_table(rows)

# %%
for r in plan_table(presets=("720p_t2v",), chips=("v6e",), rules="tp_replicated_out"):
    if r["cited_s"]:
        print(f"{layout_label(r['mesh'])}: cited {r['cited_s']} s/step = {r['cited_mfu']:.1%} MFU ({r['cited_source']})")

# %% [markdown]
# Both layouts run the same FLOPs per step (the PFLOP column); they split them differently. On `tensor=8` each chip
# holds both CFG samples, so its activations (`rest`) are larger, and the split weights are cut eight ways instead of
# four, so its weights are smaller. The cited time sits well above the compute bound of its own row: chapter 8 takes
# that gap apart. What `hyv_lib`'s default layout would take on a v6e-8 is not measured here or anywhere we cite.

# %% [markdown]
# ## Summary
#
# * The whole pipeline runs at 1280×720 on this CPU, and hyv-tiny-720p draws there what it is asked for, roughly:
#   on 15 held-out captions the colour is right 87% of the time, the background always, the direction 47%. Its
#   latent layout (45 × 80 per frame) and the VAE tiling of stage 3 are the real ones; its DiT is not: it groups
#   5 × 5 latents per token (the 8.3B model: 1 × 1), so it attends over 432 video tokens per sample instead of
#   10,800, and the frames are fewer, the widths and depths small. Its stage 2 time is no guide to the real model's.
# * `generation_config.json` records every stage's time and peak memory, so a run documents its own cost.
# * At 720p and 121 frames a one-piece decode needs a 53.2 GiB tensor in fp32 (and, in diffusers' decoder, a 46.4 GiB
#   mask in the mid block). A 256 px tile spans all 121 frames: its largest tensor is 3.8 GiB in fp32, and its whole
#   decode in bf16 needs 25.2 GiB per device by the TPU compiler, which fits a v6e chip but not a v5e. Tiled
#   decoding is the default, and its output differs from the one-piece decode by a level or two of 255 on average
#   (measured above on the tiny model).
# * The same notebook is the real-model runbook: set the preset, the weights and the runtime.
#
# ## Exercises
#
# Marked ★ (easy) to ★★★ (hard), and *open* where no one has the answer yet ({ref}`notation-exercises`).
#
# 1. ★★ Where does stage 2's memory go at 720p and 121 frames on the real model, and which setting moves it?
# 2. ★ Why does `generate --height 720 --width 1280` need both flags, and what does `--aspect_ratio 9:16` give at
#    720p in diffusers' buckets?
# 3. ★★ Predict the RSS growth of a one-piece decode at twice the frames, then measure it with `HYV_VIDEO_LENGTH=17`.
# 4. ★★ How many tiles does the decoder cut a 720p latent into, and how many pixels does it decode per frame in all,
#    compared with the 1280 × 720 it outputs?
# 5. ★ At 480p (848 × 480, 121 frames), how large is the decoder's largest tensor in fp32 and in bf16, and how many
#    tiles does the tiled decode use?
# 6. ★★★ *Open.* Diffusers tiles the decode in space only, so a 720p/121f tile needs 25.2 GiB in bf16 and does not
#    fit a 16 GiB v5e chip. Can the decoder run over chunks of latent frames instead, carrying what its causal
#    convolutions and the mid block's causal attention need from earlier frames, so that memory stops growing with
#    the video's length, and are the frames then identical to the spatially tiled decode?
# 7. ★ Why does `tiny_trained_720p` refuse `--height 480 --width 848`, and which sizes near 480p would it take?
#    Would it draw well at them?
#
# :::{admonition} Answers
# :class: dropdown
# 1. Weights (15.5 GiB in bf16 replicated, `param_bytes("720p_t2v", "bf16")`; less when sharded: chapter
#    3's rule sets) and attention activations over 113,585 joint tokens. The mesh and rule set move the weights;
#    Splash's blocked kernel keeps attention at O(S) memory instead of a dense mask of 24 GiB for the CFG batch
#    (12 GiB per sample, `hyv_lib.models.hunyuan_video15.layout.dense_mask_bytes`).
# 2. One of them alone is ambiguous, so `hyv_lib` asks for both (or neither, and then the bucket of
#    `--aspect_ratio` decides). For 9:16 at 720p, diffusers' bucket list and nearest-ratio match give 1264x720
#    (height x width): `hyv_lib.base.presets.bucket_size(hyv_lib.get_preset("720p_t2v"), "9:16")`.
# 3. Roughly twice: the decoder's activations scale with the number of frames (17 frames -> 5 latent frames
#    instead of 3, decoded to 17 frames instead of 9).
# 4. Rows start every 12 latents over 45 (0, 12, 24, 36) and columns over 80 (0, 12, ..., 72): 4 × 7 = 28 tiles.
#    The tiles are 16 latents (256 px) high, except the last row (45 − 36 = 9 latents, 144 px), and 16 wide, except
#    the last column (80 − 72 = 8 latents, 128 px). So the decoder produces (3 · 256 + 144) × (6 · 256 + 128) =
#    912 × 1664 pixels per frame, 1.65 times the 720 × 1280 it keeps (the ratio printed beside the timings): the
#    overlaps are decoded twice (four times where four tiles meet). That is the extra work in pixels, not the extra
#    time: the timings above give a different ratio, since the time per pixel is not the same for a small tile as for
#    the whole frame.
# 5. 128 · 121 · 480 · 848 · 4 B ≈ 2.52 × 10¹⁰ B ≈ 23.5 GiB in fp32, 11.7 GiB in bf16. The latent is 30 × 53:
#    rows at 0, 12, 24 and columns at 0, 12, 24, 36, 48 give 3 × 5 = 15 tiles.
# 6. *Where to start.* The convolutions are causal in time, so a chunk needs only the last few frames of the previous chunk's inputs
#    (a cache per convolution, as other causal video VAEs keep); the mid block's attention is block-causal over latent
#    frames, so a chunk needs the keys and values of every earlier frame, or an approximation. Check exactness first on
#    the tiny preset against `decode_latents(vae, latents, tiling=True)`, then measure the peak with
#    `hyv_lib.planning.vae_compile.compile_decode` at a few frame counts.
# 7. Its DiT takes 5 × 5 latents per token and the VAE compresses 16×, so height and width must be multiples of
#    16 · 5 = 80 pixels (`preset.pixel_stride`); 848 is not. 480 × 800 or 480 × 880 would run, but it was fine-tuned
#    at 720 × 1280 only (a 9 × 16 token grid), so nothing says it draws well at a 6 × 10 grid: measure it with
#    `hyv_lib.tiny.quality.read_video` on a few held-out captions before trusting it.
# :::
