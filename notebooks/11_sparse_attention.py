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
# # 11. Sparse attention: SSTA on GPU and TPU
#
# At 720p and 121 frames a HunyuanVideo-1.5 step attends over 113,585 tokens, and attention is about 90% of its
# FLOPs. The model's 720p *sparse* checkpoints (`720p_t2v_distilled_sparse`, `720p_i2v_distilled_sparse`) were
# trained with {term}`SSTA`, *selective and sliding tile attention*: each group of 384 tokens attends only some other
# groups. Tencent's own code runs it through a CUDA package that refuses any GPU whose name does not start with
# "NVIDIA H" (Tencent-Hunyuan/HunyuanVideo-1.5 issue #22), and no TPU version of it existed.
#
# :::{figure} ../book/figures/11_ssta_tiles.svg
# :name: fig-11-ssta-tiles
#
# SSTA for one head. Left: the video's latent grid in tiles of 6 x 8 x 8 cells; a query tile (red border) attends
# its 3 x 3 x 3 window of spatial and temporal neighbours (blue), the top-$k$ tiles its importance score selects
# anywhere in the video (orange) and the live text tile (green); the zero tokens that pad the last tiles (hatched)
# count as keys whenever their tile is attended. Right: the same rule as a tile mask of a small grid, one boolean per
# (query tile, key tile); a kernel skips every white block. At 720p/121f the mask has 366 tiles a side and about 16%
# of its pairs attended (measured below).
# :::
#
# This chapter:
#
# 1. **The tile layout**: how the video is cut into tiles and which tiles attend which.
# 2. **One real block mask** at 720p/121f, and the arithmetic of density, padding and FLOPs.
# 3. **Why tiles and not tokens**: what a kernel can skip.
# 4. **Measured on one GPU**: torch's FlexAttention driven by the tile mask, against the dense kernel, per call and
#    for the whole step.
# 5. **Compiled for a TPU**: the block-sparse Pallas kernel through the TPU compiler here, and the planner's step.
# 6. **What it costs in quality** on this book's trained tiny models, and when to use it.
#
# The live parts run on a 2-core CPU in about three minutes; the real-size numbers come from one GPU lease and the
# TPU compiler, both saved in `benchmarks/results/`.

# %% tags=["parameters"]
import os

# The live part generates one video with dense attention and one with SSTA from the same seed: hyv-tiny-720p
# (preset tiny_trained_720p) at 720x1280 here, tiles scaled to its 3 x 9 x 16 token grid. With
# HYV_PRESET=720p_t2v_distilled_sparse and HYV_MODEL_PATH=<its diffusers folder> it runs the real sparse checkpoint
# (official SSTA options; a GPU, not this CPU), HYV_STEPS steps.
PRESET = os.environ.get("HYV_PRESET", "tiny_trained_720p")
MODEL_PATH = os.environ.get("HYV_MODEL_PATH") or None
STEPS = int(os.environ.get("HYV_STEPS", 0)) or None
HEIGHT = int(os.environ.get("HYV_HEIGHT", 0)) or None  # default: the preset's 16:9 size (720x1280 for both)
WIDTH = int(os.environ.get("HYV_WIDTH", 0)) or None
VIDEO_LENGTH = int(os.environ.get("HYV_VIDEO_LENGTH", 0)) or None
PROMPT = os.environ.get("HYV_PROMPT", "a red circle moving left on a black background")
SEED = int(os.environ.get("HYV_SEED", "1"))
from hyv_lib.notebook.display import settings_not_used  # noqa: E402

_ = settings_not_used({"HYV_RUNTIME": "the live comparison runs the torch runtime, the one SSTA's GPU kernel runs on",
                       "HYV_ATTENTION": "the chapter compares dense attention with SSTA itself",
                       "HYV_MESH": "one process on one device; the TPU part reads saved compiler reports"})

# %%
import json
import logging
import math
import warnings
from pathlib import Path

warnings.filterwarnings("ignore", message="IProgress not found")
logging.getLogger("jax").setLevel(logging.ERROR)

import matplotlib.pyplot as plt
import numpy as np
import torch
from IPython.display import display

import hyv_lib
from hyv_lib.kernels.ssta import SstaConfig, TileLayout, density, ssta_mask, tile_order, window_mask
from hyv_lib.notebook.display import frame_grid, html_table
from hyv_lib.planning.costs import step_flops
from hyv_lib.planning.sparse import tile_density
from hyv_lib.planning.ssta_plan import attention_rows

RESULTS = Path("../benchmarks/results")  # this notebook runs in notebooks/
torch.manual_seed(0)
print("official options:", SstaConfig())

# %% [markdown]
# ## The tile layout
#
# The video's latent grid is $T \times h \times w$ cells (one token each: HunyuanVideo-1.5's patch is 1 x 1 x 1). SSTA
# cuts it into *tiles* of $6 \times 8 \times 8$ cells, 384 tokens, padding the grid with zero tokens up to whole tiles,
# and lays the sequence out tile by tile: the tiles in $(t, h, w)$ raster order, the tokens inside each tile in raster
# order too. The text ("context") tokens follow, cut into tiles of 384 as well (the last one filled with copies of
# the last token). Then a *query tile* attends a *key tile* or it does not, and when it does every token of it counts,
# the padding included.
#
# The figure shows one latent frame of a small grid, $10 \times 13$ cells in tiles of $1 \times 4 \times 4$: the number
# in each cell is its position in the tiled sequence, the grey cells are padding.

# %%
small = TileLayout((1, 10, 13), (1, 4, 4), 0)
source, padded = tile_order(small)  # each tiled position's source token, and the padding positions
position = torch.empty(small.padded[1] * small.padded[2], dtype=torch.long)  # padded grid cell -> tiled position
tiles_h, tiles_w = small.tiles[1], small.tiles[2]
for pos in range(small.padded_length):
    tile, within = divmod(pos, small.tile_tokens)
    r = (tile // tiles_w) * 4 + within // 4
    c = (tile % tiles_w) * 4 + within % 4
    position[r * small.padded[2] + c] = pos
position = position.view(small.padded[1], small.padded[2])
is_pad = torch.zeros(small.padded_length, dtype=torch.bool)
is_pad[padded] = True
fig, ax = plt.subplots(figsize=(7, 4.6))
tile_id = position // small.tile_tokens
colours = plt.cm.tab20(tile_id.numpy() % 20)
colours[is_pad[position].numpy()] = (0.85, 0.85, 0.85, 1.0)
ax.imshow(colours)
for r in range(position.shape[0]):
    for c in range(position.shape[1]):
        ax.text(c, r, int(position[r, c]), ha="center", va="center", fontsize=6.5)
ax.set_xticks(np.arange(-0.5, position.shape[1], 4), minor=False)
ax.set_yticks(np.arange(-0.5, position.shape[0], 4), minor=False)
ax.grid(color="black", linewidth=1.5)
ax.set_xticklabels([]), ax.set_yticklabels([])
ax.set_title(f"a 10 x 13 frame in 4 x 4 tiles: {small.video_tiles} tiles, {int(is_pad.sum())} padding tokens (grey)")
plt.show()

# %% [markdown]
# Which tiles attend which:
#
# * **The window.** A query tile attends the $3 \times 3 \times 3$ tiles around it, the window's centre clamped at the
#   grid's edges: a tile in a corner does not see a smaller window but one shifted inwards, always 27 tiles when the
#   grid is at least 3 tiles along each axis.
# * **The top-$k$ tiles.** Per sample, head and query tile, the $k$ key tiles with the highest *importance*: the
#   cosine similarity of the query tile's mean $q$ and the key tile's mean $k$, mapped to $[0, 1]$, times
#   $\lambda = 0.7$, minus $0.3$ times the key tile's mean similarity to all other key tiles (its redundancy). $k = 64$,
#   halved to 32 for videos of at most 31 latent frames (121 frames is 31).
# * **The text.** Every tile attends every text tile and every text tile attends every tile, except text tiles past
#   the last one that holds a valid text token: those attend only themselves, and nobody attends them.
#
# `hyv_lib.ssta_mask` computes the mask at tile level, one boolean per (query tile, key tile); every kernel below
# consumes that one mask. The next cell builds it for one head at the real 720p/121f grid ($31 \times 45 \times 80$
# latent cells) with random $q$ and $k$ (the top-$k$ choice of a real model depends on its activations; the window
# and text parts do not) and a prompt of 172 valid context tokens.

# %%
grid, text_len = (31, 45, 80), 1985
layout = TileLayout(grid, SstaConfig().tile, text_len)
s = math.prod(grid) + text_len
q, k = torch.randn(1, 1, s, 128), torch.randn(1, 1, s, 128)
masks = {kind: ssta_mask(q, k, grid, text_len, torch.tensor([172]), SstaConfig(sparse_type=kind))[0, 0]
         for kind in ("sta", "ssta")}
print(f"grid {grid} -> padded {layout.padded}: {layout.tiles[0]} x {layout.tiles[1]} x {layout.tiles[2]} = "
      f"{layout.video_tiles} video tiles + {layout.text_tiles} text tiles; {layout.padded_length:,} tiled tokens for "
      f"{s:,} real ones ({layout.padded_length / s - 1:.1%} more)")
print(f"tile density: window only {density(masks['sta']):.2%}, window + top-32 {density(masks['ssta']):.2%}")
fig, axes = plt.subplots(1, 2, figsize=(10, 4.8))
for ax, (kind, mask) in zip(axes, masks.items()):
    ax.imshow(mask.numpy(), cmap="Greys", interpolation="nearest")
    ax.set_title(f"{'window only (sta)' if kind == 'sta' else 'window + top-k (ssta)'}: {density(mask):.1%}")
    ax.set_xlabel("key tile"), ax.set_ylabel("query tile")
plt.tight_layout()
plt.show()

# %% [markdown]
# The window is the banded structure: within a band of 60 tiles (one tile-frame of $6 \times 10$ tiles) each query
# tile sees its neighbours in $h$ and $w$, and the three bands around it in $t$. The top-$k$ tiles are the scattered
# points; the last six columns and rows are the text tiles, and of them only the first is alive for a 172-token
# prompt. The window's density is exact (7.80%, as the H200 measured below); the top-$k$ part depends on $q$ and
# $k$, and on random inputs it lands within a few hundredths of a percent of the H200's 15.75%.
#
# ## The arithmetic: density, padding and FLOPs
#
# A dense kernel computes $4 S^2 D$ FLOPs per head for $S$ tokens (two matrix products of $S \times S \times D$). The
# tile kernel computes $4 \cdot 384^2 D$ per attended tile pair, over the *tiled* sequence of $L$ tokens, padding
# included: $\rho L^2 \cdot 4 D$ for a tile density $\rho$. Its FLOPs relative to dense are
#
# $$\frac{\rho L^2}{S^2},$$
#
# so the padding costs twice: the grid's $(L/S)^2$. The planner (`hyv_lib.planning.sparse.tile_density`) computes the
# window and text parts exactly from the layout and bounds the top-$k$ part by counting $k$ extra tiles per row.

# %%
rows = []
for name, (h, w) in (("720p", (720, 1280)), ("480p", (480, 848))):
    g = (31, h // 16, w // 16)
    tiled = TileLayout(g, SstaConfig().tile, text_len)
    est = tile_density(g, text_len, SstaConfig(), text_valid=172)
    real = math.prod(g) + text_len
    rows.append({"size": f"{name}/121f", "grid": " x ".join(map(str, g)), "S": f"{real:,}",
                 "L (tiled)": f"{tiled.padded_length:,}", "(L/S)^2": f"{(tiled.padded_length / real) ** 2:.2f}",
                 "window density": f"{est['window']:.2%}", "density bound": f"{est['density']:.2%}",
                 "FLOPs vs dense (bound)": f"{est['density'] * (tiled.padded_length / real) ** 2:.2f}"})
display(html_table(rows))

# %% [markdown]
# At 720p the grid pads $31 \times 45 \times 80$ to $36 \times 48 \times 80$ and SSTA's attention needs at most a
# quarter of the dense FLOPs. At 480p the $31 \times 30 \times 53$ grid pads to $36 \times 32 \times 56$: 30% more
# tokens, 1.70 times the pairs, and with 168 video tiles a $3 \times 3 \times 3$ window plus 32 chosen tiles is a
# third of all of them: the bound leaves 0.58 of the dense FLOPs. The official code ships sparse checkpoints only at
# 720p.
#
# ## Why tiles, and not tokens
#
# A token-level mask of the same pattern would cost the same as dense attention: flash-style kernels (FlashAttention
# on a GPU, Splash on a TPU) already never write the $S \times S$ scores, and they spend their time in the matrix
# products of $q$ blocks with $k$ blocks. Work is saved only when a whole block pair can be skipped. A tile of 384
# tokens is three 128-row blocks, the size both kernels work in, so a tile mask is a block mask: a kernel walks, for
# each query tile, the list of its attended key tiles and nothing else. That is also why every token of an attended
# tile counts, padding included: masking inside a tile would buy nothing and the checkpoints were trained without it.
#
# `hyv_lib` has one mask and two kernels:
#
# * **torch**: FlexAttention (`torch.nn.attention.flex_attention`) with a `BlockMask` made from the tile mask
#   (`BlockMask.from_kv_blocks`, every attended block full), compiled once per shape; forward and backward on every
#   CUDA GPU of compute capability 8.0 or newer and on the CPU, no extra package (`--attention ssta`).
# * **JAX/TPU**: a Pallas kernel whose grid walks (batch, head, query tile, attended key tile) with the key tiles'
#   indices prefetched into scalar memory, so each step loads the one K/V tile it needs; the mask is built inside
#   the jitted step (`hyv_lib.kernels.ssta_jax`).
#
# Both equal a float32 softmax over exactly the tokens of the attended tiles (`tests/test_ssta.py`,
# `tests/test_ssta_jax.py`), and the runtimes (torch, jax, ulysses, DeepCache, MagCache, LoRA and the train step)
# equal the same model with the reference kernel (`tests/test_ssta_runtimes.py`).
#
# ## Measured on one GPU
#
# `benchmarks/gpu_check.py --sections ssta` ran on one NVIDIA H200 with random bf16 inputs and the real DiT's shapes
# (random weights), twice: run 7 with the first version of the tile layout, run 8 after it became one gather.

# %%
runs = {n: json.loads((RESULTS / f"gpu_check_2026-11-27_H200_run{n}_ssta.json").read_text())["sections"]["ssta"]
        for n in (7, 8)}
table = []
for n, section in runs.items():
    for r in section["rows"]:
        if r.get("status") != "ok":
            continue
        table.append({"run": n, "row": r["name"], "ms": r.get("ms", ""), "s/step": r.get("s_per_step", ""),
                      "tile density": f"{r['tile_density']:.2%}" if "tile_density" in r else "",
                      "mask + layout ms": r.get("mask_ms", ""),
                      "peak GiB": r.get("peak_allocated_gib", "")})
display(html_table(table))
for n, section in runs.items():
    print(f"run {n}:", "; ".join(f"{name} {c['speedup']}x" for name, c in section["compare"].items()))

# %% [markdown]
# In run 8, SSTA's attention call takes 129.9 ms against 366.2 ms for the dense kernel (cuDNN's, through PyTorch's
# SDPA): 2.82x, where the FLOP bound above allows about 4x. Two things take the rest. The mask and the tile layout
# cost 8.1 ms a call (in run 7, before the layout was one gather, 41.3 ms: the first fix the profile asked for), and
# FlexAttention's kernel runs below cuDNN's rate. The whole 720p CFG step drops from 24.25 s to 12.06 s, 2.01x,
# under the 12.5 s this project set itself; compiling every block as well gave 9.34 s in run 7 and 10.10 s in run 8
# (one measurement each, so the two differ by more than the change between them explains). The distilled sparse
# checkpoint runs one sample per step instead of CFG's two: 6.03 s. At 480p SSTA saves nothing, as the arithmetic
# said (70.2 against 67.8 ms, 5.96 against 5.93 s per step).
#
# The sparse output differs from the dense one by 11% here: random weights trained with neither attention. That is a
# record that the mask matters, not a measure of quality; the tiny models below are.

# %% [markdown]
# ## The live comparison
#
# The same prompt and seed, once with dense attention and once with SSTA, on the same weights: hyv-tiny-720p at
# 720x1280, whose DiT sees a $3 \times 9 \times 16$ token grid (its 5 x 5 patches), cut into tiles of
# $1 \times 3 \times 4$ tokens with a $1 \times 3 \times 3$ window and 4 top-$k$ tiles (2 after halving), the
# official pattern scaled down. With a real sparse checkpoint (see the parameters cell) both runs use the official
# options. The PSNR compares the two videos frame by frame. The SSTA run's denoising time includes compiling
# FlexAttention for this shape on its first step, so the two times say nothing about speed on a GPU.

# %%
spec = hyv_lib.get_preset(PRESET)
config = SstaConfig(tile=(1, 3, 4), window=(1, 3, 3), topk=4) if spec.is_tiny else SstaConfig()
dense_pipe = hyv_lib.load_pipeline(PRESET, MODEL_PATH, attention="auto", progress=False)
size = dict(height=HEIGHT, width=WIDTH, video_length=VIDEO_LENGTH, num_inference_steps=STEPS)
dense = dense_pipe.generate(PROMPT, seed=SEED, progress=False, **size)
# The second pipeline shares the loaded models and installs SSTA on the same transformer (after the dense video).
sparse_pipe = hyv_lib.VideoPipeline(spec, dense_pipe.components, attention="ssta", ssta=config,
                                    model_path=MODEL_PATH)
sparse = sparse_pipe.generate(PROMPT, seed=SEED, progress=False, **size)
error = np.mean((dense.frames.astype(np.float64) - sparse.frames.astype(np.float64)) ** 2)
print(f"{PRESET}, {dense.frames.shape[2]}x{dense.frames.shape[1]}, {dense.frames.shape[0]} frames; SSTA options "
      f"{sparse.config['ssta']['tile']} tiles, window {sparse.config['ssta']['window']}, top-{config.topk}")
print(f"denoising: dense {dense.config['denoise_time_s']:.1f} s, SSTA {sparse.config['denoise_time_s']:.1f} s; "
      f"PSNR of the SSTA video against the dense one: {10 * math.log10(255 ** 2 / error):.1f} dB")
frame_grid(dense.frames, columns=5, title=f"dense attention: {PROMPT!r}", scale=1.6)
plt.show()
frame_grid(sparse.frames, columns=5, title="SSTA, same seed", scale=1.6)
plt.show()

# %% [markdown]
# ## Compiled for a TPU
#
# On a TPU, SSTA runs as a Pallas kernel (`hyv_lib.kernels.ssta_jax`). Inside the jitted step it builds the same tile
# mask from the block means, turns each query tile's row into a list of attended key tiles (ascending, with a count),
# and hands the lists to the kernel as *scalar-prefetched* operands: the kernel's grid is (sample, head, query tile,
# list slot), and the index map of K and V reads the slot's tile number, so each grid step loads exactly one
# 384 x 128 key tile and one value tile into VMEM and folds them into a running softmax. Slots past a row's count are
# skipped. Video query tiles have a short list (window + top-$k$ + text: 65 at 720p); the text tiles' rows may hold
# every tile, so they run as a second call.
#
# No TPU is attached here, so the kernel is checked in two ways: in interpret mode on the CPU against the float32
# reference (`tests/test_ssta_jax.py`), and through the real TPU compiler (libtpu, deviceless; see
# {doc}`08_performance`), which lowers it through Mosaic and reports memory. The whole 54-block step of the sparse
# preset, compiled for a v6e-8 with `python -m hyv_lib compile`:

# %%
compiled = json.loads((RESULTS / "ssta_compile_2026-11-27_cpu_libtpu.json").read_text())
rows = []
for name, report in compiled["reports"].items():
    b = report["per_device_bytes"]
    rows.append({"run": name, "mesh": " x ".join(f"{a}={n}" for a, n in report["mesh"].items()),
                 "attention": report["attention"]["backend"], "batch": report["batch"],
                 "Pallas calls": report["splash_kernels"], "native (Mosaic)": report["attention"]["native"],
                 "weights + inputs GiB": f"{b['arguments'] / 2**30:.2f}", "temporaries GiB": f"{b['temporaries'] / 2**30:.2f}",
                 "total GiB": f"{b['total'] / 2**30:.2f}",
                 "of GiB": f"{report['hbm_available_per_device'] / 2**30:.2f}", "fits": report["fits"],
                 "compile s": report["compile_seconds"]})
display(html_table(rows))
print(f"{compiled['refused_command']}\n  -> {compiled['refused']}")

# %% [markdown]
# The sparse step fits a v6e-8 with tensor=8 in about the dense (Splash) step's memory: the weights and inputs are the
# same 10.43 GiB per device (the `tp_replicated_out` rules keep some matrices whole on every device), and the
# temporaries, where SSTA's tile lists and tiled copies of $q$, $k$, $v$ live, come to 2.33 GiB against Splash's
# 2.48 GiB. A `data=2` axis is refused for
# this preset, with the reason: the checkpoint is CFG-distilled and runs one sample per step, so there is nothing for a
# data axis to split; the CFG pair of the base 720p model with `--attention ssta` does compile on data=2 x tensor=4.
#
# The compiler cannot say how fast the kernel is. XLA's cost analysis prices a Pallas call by the bytes of its
# operands, not by its FLOPs (the attention is missing from the compiled FLOP count, dense or sparse), and no TPU is
# here to time it. What the planner can say is the bound: the step's FLOPs with the tile density in place of dense
# attention, and the bytes the kernel must read (each query tile reads its attended K and V tiles once).

# %%
plan_rows = []
for preset in ("720p_t2v", "720p_t2v_distilled_sparse"):
    for r in attention_rows(preset, chip="v6e", n_chips=8):
        plan_rows.append({"preset": r["preset"], "layout": r["layout"], "attention": r["attention"],
                          "density (bound)": f"{r['density']:.1%}", "PFLOP/step": f"{r['pflop_per_step']:.2f}",
                          "attention PFLOP": f"{r['attention_pflop']:.2f}", "compute s": f"{r['compute_s']:.3f}",
                          "HBM s": f"{r['hbm_s']:.3f}", "lower bound s": f"{r['step_s']:.3f}",
                          "limited by": r["limit"], "vs dense": f"{r['vs_dense']:.2f}x"})
display(html_table(plan_rows))

# %% [markdown]
# The planner counts every context token as valid, so its density bound here (19.1%) is higher than the 16.4% of a
# short prompt above. On a v6e-8 its bound for the 720p CFG step falls from 1.77 s (compute-bound) to 0.68 s with
# SSTA, and
# the sparse step becomes *memory*-bound: a 384-row query tile does about 384 FLOPs per byte of K and V it reads in
# bf16, under the v6e's ridge point of about 560, so the kernel waits on HBM, not on the matrix unit. Bounds, not
# times: the published dense step on a v6e-8 is 7.29 s (gpu-tpu-pedia, {doc}`../book/references`), about four times
# its bound; whether SSTA's kernel keeps its share of that is what a TPU would have to show. The next thing to try on
# one is more than one key tile per grid step (fewer, larger steps).
#
# ## What it costs in quality
#
# The sparse checkpoints were trained with SSTA; a dense checkpoint run with it is another model. This book's tiny
# models were trained dense, so running them sparse measures that loss: `benchmarks/ssta_frontier.py` generated
# held-out captions with dense attention and with SSTA at a few tile densities (tiles scaled to each grid), from the
# same seeds, and read each video with the gates of chapter 7 (`hyv_lib.tiny.quality`).

# %%
from hyv_lib.tiny.sparse_frontier import check_record, frontier_rows  # noqa: E402

frontier = json.loads((RESULTS / "ssta_frontier_2026-11-27_cpu.json").read_text())
for record in frontier["runs"]:
    assert check_record(record) == [], check_record(record)
    print(f"{record['preset']} at {record['height']}x{record['width']}: token grid "
          f"{'x'.join(map(str, record['grid']))}, {record['prompts']} held-out captions, {record['steps']} steps")
    display(html_table([{k: v for k, v in row.items() if k not in ("s/video", "denoise s/video")}
                        for row in frontier_rows(record)]))

# %% [markdown]
# Three things stand out, on models that never saw SSTA:
#
# * **Tiling alone costs something.** On hyv-tiny a window that covers the whole grid (every video tile pair
#   attended) is already about 25 dB from dense, and one caption in five reads a different colour: the tiled layout
#   adds zero tokens to fill the last tiles, and the softmax over a whole text tile includes its padding. The official
#   checkpoints were trained with both; a dense model was not.
# * **The time axis matters.** A window one tile-frame deep (1x3x3, or 1x1x3) loses the motion more often than the
#   colour; giving the same window a few top-$k$ tiles brings most of the direction readings back (on hyv-tiny 0.60
#   against 0.20, dense 0.80) at a little more density (0.38 of the tile pairs against 0.34): the chosen tiles are
#   the far-away ones the window misses.
# * **Background and colour survive; detail does not.** The PSNR against the dense video drops by several dB between
#   the densest and the sparsest settings while the coarse readings hold longer.
#
# These are small samples: ten captions for hyv-tiny and three for hyv-tiny-720p (all red shapes on black, so its
# colour column says little), the time a shared 2-core machine allowed; a rate of 0.33 there is one caption.
#
# ## When to use it
#
# * **With the sparse checkpoints, always** (their presets do): they were trained with exactly this attention, and
#   dense attention is the mismatch there.
# * **At 720p, where it pays**: about 2x on the whole step on an H200. At 480p the grid's padding and the window's
#   share of a small grid leave nothing to save.
# * **Not on a dense checkpoint to go faster**, unless its quality is measured first: the frontier above is what that
#   costs a model trained without it.
# * **Anywhere FlexAttention runs**: compute capability 8.0 or newer, the CPU for tests; on a TPU the Pallas kernel
#   compiles and fits, and its speed is still to be measured on one.
#
# ## Summary
#
# * SSTA cuts the joint sequence into 384-token tiles; each query tile attends a clamped 3x3x3 window, its top-$k$
#   tiles by importance and the text, and every token of an attended tile counts. One tile mask
#   (`hyv_lib.ssta_mask`) drives every kernel.
# * Tiles, because kernels skip whole blocks: a token mask of the same pattern would save nothing. The price is the
#   padding, $(L/S)^2$ in the FLOP ratio $\rho L^2/S^2$: a quarter of dense at 720p, 0.58 of it at 480p.
# * torch's FlexAttention, driven by the tile mask, runs it on any GPU of compute capability 8.0 or newer with no extra
#   package: on one H200 the 720p/121f attention call is 2.8x faster than cuDNN's dense kernel and the whole CFG step
#   2.0x (12.06 against 24.25 s).
# * A block-sparse Pallas kernel with scalar-prefetched tile lists runs it on TPU: equal to the float32 reference in
#   interpret mode, lowered by Mosaic, and the sparse 720p step fits a v6e-8; the planner bounds the step at 0.68 s
#   against 1.77 s dense, memory-bound. No TPU has timed it.
# * On models trained dense it costs quality, even before any sparsity (the padding inside tiles); the sparse
#   checkpoints were trained for it.
#
# ## Exercises
#
# Marked ★ (easy) to ★★★ (hard), and *open* where no one has the answer yet ({ref}`notation-exercises`).
#
# 1. ★ How many tiles does a 720x1280 video of 61 frames have with 6x8x8 tiles, and what is $k$ for it?
# 2. ★ Why does the top-$k$ part of the 720p mask add about 8 percentage points of density when $k = 32$ tiles is
#    only 8.7% of 366?
# 3. ★★ A query tile attends its window (27 tiles), 32 top-$k$ tiles and the first text tile. What are the fewest and
#    the most key tiles it can attend, and which part of the mask decides?
# 4. ★★ With 6x8x8 tiles the 480p grid $31 \times 30 \times 53$ pads to $36 \times 32 \times 56$. How many padding
#    tokens is that, what share of the tiled video, and how does it compare with 720p?
# 5. ★★★ SSTA's text cut keeps, in the last live text tile, the padded text tokens after the valid ones as keys.
#    Write down the attention of one video query over that tile and show how the padding changes the output. Why is
#    this not a bug for the sparse checkpoints?
# 6. **Open.** Is the TPU kernel faster with several key tiles per grid step?
#
# :::{admonition} Answers
# :class: dropdown
# 1. 61 frames are $(61 - 1)/4 + 1 = 16$ latent frames; the grid $16 \times 45 \times 80$ pads to $18 \times 48
#    \times 80$: $3 \times 6 \times 10 = 180$ video tiles, plus 6 text tiles. 16 latent frames $\le 31$, so $k$ is
#    halved to 32.
# 2. The density counts pairs over all $366^2$; each of the 360 video rows gains up to 32 tiles outside its 27-tile
#    window, $360 \times 32 / 366^2 = 8.6\%$ at most, less where the chosen tiles fall inside the window (the measured
#    15.75% against the window's 7.80% is an increase of 7.95 points).
# 3. The window (27 tiles) and the live text tile are fixed by the layout. The 32 top-$k$ tiles are distinct, and at
#    most 27 of them can fall inside the window, so at least 5 are outside: at least $27 + 5 + 1 = 33$ tiles, at most
#    $27 + 32 + 1 = 60$ when none falls inside. Where in between is decided by the data (the importance scores).
# 4. $36 \times 32 \times 56 = 64{,}512$ tiled cells for $31 \times 30 \times 53 = 49{,}290$ real ones: 15,222
#    padding tokens, 23.6% of the tiled video. At 720p, $36 \times 48 \times 80 = 138{,}240$ for 111,600: 26,640,
#    19.3%. Both pay for the 31 latent frames (6 tiles of 6 = 36); 480p pays on both spatial axes as well.
# 5. With scores $s_j$ over the tile's valid keys and $s_p$ over its padded ones, the output is
#    $\sum_j e^{s_j} v_j + \sum_p e^{s_p} v_p$ over $\sum_j e^{s_j} + \sum_p e^{s_p}$: the padded tokens enter both
#    sums with their own $k_p$ and $v_p$ (the blocks update them like any token). The sparse checkpoints were trained
#    with exactly this, so it is part of the model; a dense model was not, which is one reason tiling alone moves the
#    tiny models' videos.
# 6. A start: the kernel's grid in `hyv_lib.kernels.ssta_jax`, a v6e, and the planner's HBM bound as the target.
# :::
