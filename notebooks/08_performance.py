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
# # 8. Performance: roofline, MFU and the road to 50%
#
# How fast *should* one denoising step of HunyuanVideo-1.5's {term}`DiT` be, how fast is it in published runs, and
# what would it take to close the gap? This chapter answers mostly with arithmetic: every number below is either computed here by
# the planner in `hyv_lib.planning` from the model's configuration and the chips' published peaks, read from the TPU
# compiler's saved reports, read from the saved results of `benchmarks/gpu_check.py` on one NVIDIA H200 (the only
# timings of `hyv_lib` itself, with random weights), or cited with its source and hardware.
#
# 1. **Count** one {term}`CFG` step (a forward over the batch of 2 prompts) at 480p and 720p: FLOPs split into attention
#    and linear layers.
# 2. **Bound** it per chip: compute, {term}`HBM` and interconnect lower bounds (a {term}`roofline`).
# 3. **Compile** the real 720p step for TPU slices without having one, to read per-device memory and
#    collectives from the TPU compiler itself (the figure below).
# 4. **Convert** published step times into model FLOP utilisation ({term}`MFU`), next to `hyv_lib`'s own step measured on
#    one H200.
# 5. **Profile** one step of the program the TPU runtime runs, on this CPU, and read where its time goes, op by op.
# 6. **Plan** the road to 50% MFU on a TPU v6e-8: which levers exist, and how much each can give.
#
# :::{figure} ../book/figures/08_compile_without_tpu.svg
# :name: fig-08-compile-without-tpu
# How `python -m hyv_lib compile` (`hyv_lib.planning.tpu_compile`) checks a TPU layout on a CPU. libtpu describes the
# devices of a named slice; the diffusers DiT on torch's meta device gives every weight's name and shape, which become
# abstract bf16 arrays placed on a mesh of those devices by a sharding rule set; the {term}`jitted <jit>` step that
# `JaxTransformer` runs on a TPU VM is lowered and compiled by XLA's TPU compiler, with the {term}`Splash` kernel
# compiled by {term}`Mosaic`. The compiler's memory analysis, cost analysis and optimised {term}`HLO` are what the
# chapter reads back.
# :::
#
# Symbols and units follow the {doc}`../book/notation` page: $C$ is the FLOPs of one step, $n_h$ heads of dimension
# $D$ make the hidden width $d$, memory and bytes moved are in GiB, and the vendors' bandwidths in GB/s ($10^9$
# bytes per second).
#
# Nothing here loads weights, and only the profile section runs a model (a small one with random weights, on the
# CPU backend the book is built with), so the chapter reads the same on a CPU and on a TPU VM; the compiler reports
# were saved by `benchmarks/tpu_compile.py`, so this notebook does not need libtpu either, and the GPU measurements
# are read from the JSON files that `benchmarks/gpu_check.py` wrote on the H200.

# %% tags=["parameters"]
import os

FRAMES = int(os.environ.get("HYV_FRAMES", "121"))       # video length of the roofline section (4n+1)
TARGET_MFU = float(os.environ.get("HYV_TARGET_MFU", "0.5"))  # the goal of the last section
from hyv_lib.notebook.display import NOTEBOOK_SETTINGS, settings_not_used  # noqa: E402

# The counts use the real presets' configurations (hyv_lib.get_preset("720p_t2v"), no weights), the memory and
# collectives come from saved TPU compiler reports, and the step times are published ones or read from a saved GPU
# check (benchmarks/results/); the one model that runs, in the profile section, is a random-weight DiT at hyv-tiny's
# sizes. So HYV_PRESET, HYV_MODEL_PATH and the other run settings are not used; the next line says so if any is set.
_ = settings_not_used({name: "this chapter is arithmetic on the real presets' configurations, saved TPU compiler "
                             "reports, saved GPU measurements and published timings, plus one profiled step of a "
                             "random-weight DiT at hyv-tiny's sizes: no weights are loaded"
                       for name in NOTEBOOK_SETTINGS})

# %%
import math
import warnings

import matplotlib.pyplot as plt
import numpy as np

warnings.filterwarnings("ignore", message="IProgress not found")

from IPython.display import display

import hyv_lib
from hyv_lib.notebook.display import html_table
from hyv_lib.planning.costs import (
    activation_bytes,
    collective_bytes,
    param_bytes,
    parameter_shapes,
    step_flops,
    token_counts,
)
from hyv_lib.planning.hardware import CHIPS, CITED_STEP_TIMES, cited_pair, layout_label, mfu
from hyv_lib.planning.planner import COMPILED_RESULTS, bounds, device_plan
from hyv_lib.runtimes.deepcache import DeepCacheSchedule

GIB = 2**30  # memory and bytes moved are in GiB; bandwidths in the vendors' GB/s (1e9 bytes/s)
PRESETS = {name: hyv_lib.get_preset(name) for name in ("480p_t2v", "720p_t2v")}
P720 = PRESETS["720p_t2v"]
# The published HunyuanVideo-1.5 runs are all 720p (1280x720), 121 frames, 50 steps, CFG as a batch of 2.
F720 = step_flops(P720, 720, 1280, 121)
V6E = CHIPS["v6e"]
print(f"{V6E.name}: {V6E.peak_bf16_flops / 1e12:.0f} TFLOP/s bf16, {V6E.hbm_bytes / 2**30:.0f} GiB HBM at "
      f"{V6E.hbm_bandwidth / 1e9:,.0f} GB/s, {V6E.interconnect_bandwidth / 1e9:.0f} GB/s ICI (bidirectional)")
print("source:", V6E.source)


# %% [markdown]
# ## One CFG step, counted
#
# `step_flops` counts the matmuls of one transformer forward, 2 FLOPs per multiply-add, from the shapes in the
# preset's diffusers config. Elementwise work (norms, softmax, {term}`RoPE`, activations) is left out: a softmax costs
# a few operations per logit against $4D = 512$ matmul FLOPs. With $L = 54$ blocks, batch $B = 2$ (CFG), $n_h = 16$
# heads of $D = 128$, hidden width $d = n_h D = 2048$, MLP width $f = 4d$ and a joint sequence of $S$ tokens (video
# tokens plus all 1985 context tokens, padding included, because the kernels compute it):
#
# $$
# C_\text{attn} = L \cdot \underbrace{2Bn_hS^2D}_{QK^\top} + L \cdot \underbrace{2Bn_hS^2D}_{PV} = 4LBS^2d,
# \qquad
# C_\text{lin} \approx L \cdot 2BS\,(4d^2 + 2df) = 24LBSd^2 .
# $$
#
# Their ratio is $S/(6d)$: attention overtakes the linear layers once the sequence is longer than $6d = 12{,}288$
# tokens, and a 720p video is far longer.
#
# ### Worked out: 720p, 121 frames
#
# The latent of a 1280x720 video of 121 frames has $T = (121-1)/4+1 = 31$ frames of
# $h \times w = 720/16 \times 1280/16 = 45 \times 80$; with patch size 1 that is $N_v = 31 \cdot 45 \cdot 80 = 111{,}600$
# video tokens. The context adds $N_c = 1000 + 256 + 729 = 1985$ (text, ByT5, image), so $S = 113{,}585$. With $L = 54$, $B = 2$ and $d = 2048$:
#
# $$
# C_\text{attn} = 4LBS^2d = 4 \cdot 54 \cdot 2 \cdot 113{,}585^2 \cdot 2048 \approx 11.41\ \text{PFLOP}.
# $$
#
# The linear layers follow the rule of thumb "2 FLOPs per parameter per token", with one catch: count only the
# weights a token passes through. Each block holds three groups of $12d^2 \approx 50.3$ M parameters: the video
# stream's q, k, v, out and MLP, the same for the text stream, and the two {term}`AdaLN` modulation linears ($d \to 6d$
# each), which run once per sample on the timestep embedding. A token meets only its own stream's group, so
# $P_\text{tok} = L \cdot 12d^2 \approx 2.72$ billion of the model's 8.33 billion parameters:
#
# $$
# C_\text{lin} \approx 2 \cdot P_\text{tok} \cdot S \cdot B = 2 \cdot 2.72 \times 10^9 \cdot 113{,}585 \cdot 2
# \approx 1.235\ \text{PFLOP},
# $$
#
# a third of what $2 \times 8.33\text{B} \times S \times B$ would give. One CFG step is therefore about 12.65 PFLOP.
# `hyv_lib.planning.hardware` takes a v6e chip's peak as 918 TFLOP/s in bf16 (`CHIPS["v6e"].source`: the Google Cloud TPU
# documentation, printed above), so eight chips running at 100% of peak would need
#
# $$
# t_\text{min} = \frac{12.65 \times 10^{15}\ \text{FLOP}}{8 \cdot 918 \times 10^{12}\ \text{FLOP/s}}
# \approx 1.72\ \text{s per step, or } 86\ \text{s for 50 steps}.
# $$
#
# The next cell computes the same quantities from the preset and the diffusers class (parameter names and shapes
# from a meta-device instance), next to the planner's full count, `step_flops`, which also counts the token
# refiner, the embedders, the modulation and the output head:

# %%
L = P720.transformer["num_layers"]
h = P720.transformer["num_attention_heads"] * P720.transformer["attention_head_dim"]
B = 2
tokens = token_counts(P720, 720, 1280, 121)
S = tokens["joint"]
_, _, t_lat, h_lat, w_lat = P720.latent_shape(720, 1280, 121)
shapes = dict(parameter_shapes(P720))  # the diffusers DiT's parameter names and shapes, no weights
video_stream = tuple(f".{m}.weight" for m in ("attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0",
                                              "ff.net.0.proj", "ff.net.2"))
P_tok = sum(math.prod(shape) for name, shape in shapes.items()
            if name.startswith("transformer_blocks.") and name.endswith(video_stream))
print(f"video tokens {t_lat} x {h_lat} x {w_lat} = {tokens['video']:,}; S = {tokens['video']:,} + "
      f"{tokens['context']:,} = {S:,}")
print(f"parameters {sum(math.prod(s) for s in shapes.values()) / 1e9:.2f} B; one stream's block weights "
      f"P_tok = {P_tok / 1e9:.3f} B (L x 12d^2 = {L * 12 * h * h / 1e9:.3f} B)")
by_hand = {"attention": 4 * L * B * S**2 * h, "linear": 2 * P_tok * S * B}
by_hand["total"] = by_hand["attention"] + by_hand["linear"]
html_table([{"720p, 121 frames, one CFG step": k, "by hand, PFLOP": f"{v / 1e15:.3f}",
             "step_flops, PFLOP": f"{F720[k] / 1e15:.3f}", "difference": f"{v / F720[k] - 1:+.2%}"}
            for k, v in by_hand.items()])

# %%
t_min = F720["total"] / (8 * V6E.peak_bf16_flops)
print(f"at {V6E.peak_bf16_flops / 1e12:.0f} TFLOP/s per chip: one step on 8 x v6e takes at least "
      f"{F720['total'] / 1e15:.2f} PFLOP / (8 x {V6E.peak_bf16_flops / 1e12:.0f} TFLOP/s) = {t_min:.2f} s, "
      f"{50 * t_min:.0f} s for 50 steps")
for c in CITED_STEP_TIMES:
    if c["chip"] == "v6e":
        print(f"  published {c['seconds']} s/step ({c['label']}) is {c['seconds'] / t_min:.1f}x that")

# %% [markdown]
# :::{admonition} Takeaway
# :class: tip
# One 720p, 121-frame CFG step is about 12.65 PFLOP: $4LBS^2d$ for attention (11.41) plus 2 FLOPs per token for
# each weight *its stream* passes through (1.235), not for all 8.33 B parameters. Even at the full 918 TFLOP/s of
# eight v6e chips that is 1.72 s a step; the published TPU runs take 3.4 to 4.7 times as long. The rest of the
# chapter asks where that factor goes.
# :::
#
# The same count for both presets, at the default size of each:

# %%
def flops_row(name, frames):
    p = PRESETS[name]
    f = step_flops(p, p.default_height, p.default_width, frames)
    t = f["tokens"]
    return {"preset": name, "W x H x frames": f"{p.default_width}x{p.default_height}x{frames}",
            "video tokens": f"{t['video']:,}", "joint tokens S": f"{t['joint']:,}",
            "attention PFLOP": round(f["attention"] / 1e15, 2), "linear PFLOP": round(f["linear"] / 1e15, 2),
            "total PFLOP": round(f["total"] / 1e15, 2), "attention share": f"{f['attention_share']:.1%}"}


html_table([flops_row(name, FRAMES) for name in PRESETS])

# %%
h = P720.transformer["num_attention_heads"] * P720.transformer["attention_head_dim"]
S = F720["tokens"]["joint"]
parts = F720["parts"]
print(f"720p, 121 frames: S = {S:,} tokens, S / (6d) = {S / (6 * h):.2f}; "
      f"counted block attention / block linear = {parts['blocks_attention'] / parts['blocks_linear']:.2f}")
html_table([{"part of one 720p CFG step": k, "TFLOP": f"{v / 1e12:,.3f}", "share": f"{v / F720['total']:.4%}"}
            for k, v in parts.items()])

# %% [markdown]
# Everything besides the blocks' attention and linear layers (the blocks' AdaLN modulation, token refiner,
# embedders, output head) is below 0.01% of the step, so the step is the blocks' matmuls, and those are mostly
# attention. The share grows with the video, because attention is quadratic in $S$ and the linear layers are linear
# in it:

# %%
labels, attn, lin = [], [], []
for name, p in PRESETS.items():
    for frames in sorted({33, 61, FRAMES}):
        f = step_flops(p, p.default_height, p.default_width, frames)
        labels.append(f"{name.split('_')[0]}\n{frames} frames")
        attn.append(f["attention"] / 1e15)
        lin.append(f["linear"] / 1e15)
fig, ax = plt.subplots(figsize=(7.5, 3.4))
x = np.arange(len(labels))
ax.bar(x, lin, color="C0", label="linear layers")
ax.bar(x, attn, bottom=lin, color="C1", label="attention ($QK^T$ and $PV$)")
for xi, a, l in zip(x, attn, lin):
    ax.text(xi, a + l, f"{a / (a + l):.0%}", ha="center", va="bottom", fontsize=8)
ax.set_xticks(x, labels, fontsize=8)
ax.set_ylabel("PFLOP per CFG step")
ax.set_title("One CFG step (batch 2); attention share above each bar", fontsize=10)
ax.legend(frameon=False, fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# ## The roofline
#
# `bounds` turns the counts into three lower bounds on the time of one CFG step on $n$ chips:
#
# - **compute**: $C / (n \cdot \text{peak})$, at the chip's dense bf16 peak;
# - **HBM**: the bytes each chip moves through HBM (its share of the weights under the rule set, plus what the
#   attention kernel moves) over the HBM bandwidth. A flash-style kernel reads $q$ once and writes its output once,
#   but $k$ and $v$ do not fit in on-chip memory, so it streams them again for every *query block*
#   ({term}`block_q`): with 2,048-row blocks (`hyv_lib`'s Splash setting on v6e, taken from gpu-tpu-pedia's
#   2048/2048/1024 runs; JAX's own `BlockSizes.get_default()` is 128 rows) the 720p joint sequence (113,585 tokens,
#   padded to 56 blocks) reads $k$ and $v$ 56 times per block (`attention_hbm_bytes`; the tiles are `hyv_lib`'s per
#   chip, `hyv_lib.kernels.splash`: 1,024 query rows on v4/v5e/v5p, where 2,048-row tiles need 21.6 MiB of scoped
#   {term}`VMEM`, over the compiler's 16 MiB default limit for it; a compiler flag,
#   `--xla_tpu_scoped_vmem_limit_kib`, raises that limit, not tried here). On a GPU, flash-attn's 128-row query
#   tiles of one head run side by side on the
#   132 SMs and share each $k$/$v$ read through L2, so the planner counts one read per 132 tiles: an estimate, with
#   no GPU profile behind it;
# - **interconnect**: the bytes each chip sends in the layout's collectives over half its published bidirectional
#   {term}`ICI` or NVLink bandwidth (no sourced figure for TPU7x or v4, so that bound stays empty).
#
# TPUs use the runtime's default layout: {term}`tp_replicated_out` on a {term}`mesh` with the CFG pair on `data` and
# the rest on `tensor` (`data=2,tensor=4` on eight v6e chips; `default_layout`), with per-device FLOPs, memory
# and collectives from `device_plan`, the planner's model of the compiled step (checked against the TPU compiler in
# {doc}`03_sharding`). JAX shows a TPU7x chip as two devices, so eight v7x chips are sixteen devices here. GPUs use
# what `--runtime ulysses` does: whole weights on every GPU, {term}`Ulysses` all-to-alls. The last column is the arithmetic
# intensity per device, FLOPs over HBM bytes.

# %%
LAYOUT = {chip: ("replicated" if chip.startswith("H") else "tp_replicated_out") for chip in CHIPS}
rows, points = [], []
for chip, rules in LAYOUT.items():
    for name, p in PRESETS.items():
        b = bounds(p, p.default_height, p.default_width, FRAMES, chip, 8, rules)
        intensity = b["flops_per_device"] / b["hbm_traffic_bytes"]
        # Pessimistic traffic: also write and read the activations (all but the weights) once per block.
        pessimistic = b["flops_per_device"] / (b["hbm_traffic_bytes"] + 2 * 54 * b["activation_bytes"])
        points.append((chip, name, intensity, pessimistic))
        rows.append({"8 x": chip, "preset": name, "weights": "replicated (Ulysses)" if rules == "replicated" else rules,
                     "mesh": ",".join(f"{a}={n}" for a, n in b["mesh"].items() if n > 1),
                     "weights GiB/device": round(b["weights_bytes"] / GIB, 1),
                     "rest GiB/device": round(b["activation_bytes"] / GIB, 1), "memory from": b["memory_source"],
                     "fits": b["fits"],
                     "compute s": round(b["compute_s"], 3), "HBM s": round(b["hbm_s"], 3),
                     "interconnect s": round(b["interconnect_s"], 3) if b["interconnect_s"] else "n/a",
                     "K/V passes": b["attention_passes"],
                     "attention FLOP/byte": f"{b['attention_intensity']:,.0f}", "FLOP/byte": f"{intensity:,.0f}"})
html_table(rows)

# %%
fig, ax = plt.subplots(figsize=(7.5, 4))
xs = np.logspace(1, 5, 300)
for i, chip in enumerate(("v5e", "v6e", "v7x", "H100")):
    spec = CHIPS[chip]
    ridge = spec.peak_bf16_flops / spec.hbm_bandwidth
    ax.loglog(xs, np.minimum(spec.peak_bf16_flops, xs * spec.hbm_bandwidth) / 1e12, color=f"C{i}",
              label=f"{spec.name} (ridge {ridge:,.0f} FLOP/B)")
    for c, name, intensity, pessimistic in points:
        if c == chip:
            marker = "o" if name.startswith("720") else "s"
            ax.plot(intensity, spec.peak_bf16_flops / 1e12, marker, color=f"C{i}", ms=7)
            ax.plot(pessimistic, spec.peak_bf16_flops / 1e12, marker, color=f"C{i}", ms=7, mfc="none")
ax.set_xlabel("arithmetic intensity per chip (FLOP per HBM byte)")
ax.set_ylabel("attainable TFLOP/s per chip")
ax.set_title("Roofline, 8 chips: squares 480p, circles 720p; hollow = pessimistic HBM traffic", fontsize=9)
ax.legend(frameon=False, fontsize=8, loc="lower right")
fig.tight_layout()
plt.show()
v6e_720 = next(p for p in points if p[0] == "v6e" and p[1] == "720p_t2v")
ridge = V6E.peak_bf16_flops / V6E.hbm_bandwidth
print(f"v6e, 720p: intensity {v6e_720[2]:,.0f} FLOP/B ({v6e_720[2] / ridge:.1f}x the ridge of {ridge:,.0f}); "
      f"pessimistic {v6e_720[3]:,.0f} FLOP/B ({v6e_720[3] / ridge:.1f}x)")
worst = max((max(r["HBM s"], r["interconnect s"] if r["interconnect s"] != "n/a" else 0) / r["compute s"], r["8 x"],
             r["preset"]) for r in rows)
print(f"largest HBM or interconnect bound in the table: {worst[0]:.0%} of the compute bound ({worst[1]}, {worst[2]})")

# %% [markdown]
# The step is compute-bound on every chip, but on the TPUs by a factor of a few, not by orders of magnitude: the
# points sit a few times to the right of each ridge (the line above gives the v6e's factor at 720p), and the
# pessimistic count (every block's activations written and read once more) moves them closer. The reason is the
# attention kernel, which does about nine tenths of the FLOPs: re-reading $k$ and $v$ once per query block gives
# it an intensity of about $2 \cdot \text{block}_q / x$ FLOP per byte ($x$ = 2 bytes in bf16), whatever the layout
# or the sequence length: the `attention FLOP/byte` column, about 2,000 with 2,048-row blocks and half that on the
# chips whose Splash tiles are 1,024 rows. The GPU points sit further right because of the L2 estimate above.
# Neither HBM bandwidth nor, at link peak, the interconnect bounds the step above compute: the last line gives the
# largest ratio of either bound to the compute bound in the table. What limits the step is how close the matrix
# units get to their peak, above all inside the attention kernel.
#
# The query block is therefore a lever on the kernel's memory traffic. On the v6e-8 at 720p:
#
# %%
lever = []
for block_q in (512, 1024, 2048, 3072, 4096):
    b = bounds(PRESETS["720p_t2v"], 720, 1280, FRAMES, "v6e", 8, "tp_replicated_out", block_q=block_q)
    lever.append({"block_q": block_q, "K/V passes": b["attention_passes"],
                  "attention GiB/chip": round(b["attention_hbm_bytes"] / GIB),
                  "attention FLOP/byte": f"{b['attention_intensity']:,.0f}",
                  "vs ridge": f"{b['attention_intensity'] / ridge:.1f}x", "HBM s": round(b["hbm_s"], 2),
                  "compute s": round(b["compute_s"], 2)})
html_table(lever)

# %% [markdown]
# With 512-row blocks the kernel would fall left of the v6e ridge (memory-bound); at 2,048 it is a few times right
# of it, and each doubling halves the $k$/$v$ traffic again. This is one part of what gpu-tpu-pedia's exp2 change
# bought (block_q 2,048 → 3,072 in the same commit; see the kernel section below), and why v4, v5e and v5p, where
# `hyv_lib` uses 1,024-row tiles at this length (2,048 exceed the compiler's default 16 MiB scoped-VMEM limit
# there), stream twice the bytes per FLOP. What the compiler reports does
# not show this traffic: XLA prices a Pallas call by its operands only, once.
#
# ## Will it fit? Compiled, not estimated
#
# The memory columns above are the planner's, except in the rows whose `memory from` says `TPU compiler`: those
# take the compiler's total from the saved reports described here. The TPU compiler can say it for certain,
# without a TPU (the figure at the top of the chapter): libtpu describes a named slice on any Linux machine, and
# `python -m hyv_lib compile` lowers the real step (54 blocks, bf16 weights, Splash compiled by Mosaic) for it and
# reports per-device bytes against what the compiler lets a program use ({doc}`03_sharding` shows one report and
# how it compares with the planner). `benchmarks/tpu_compile.py` runs it over a grid of 8-chip-class slices,
# layouts, the two presets' sizes and DeepCache's pair of programs, and saves every report in
# `hyv_lib/compiled/tpu_compile.json`. The table reads that file, which holds the whole grid (compiled by the TPU
# compiler on a CPU; a memory and collective check, not a timing):

# %%
import json

with open(COMPILED_RESULTS) as f:  # saved by benchmarks/tpu_compile.py, shipped in hyv_lib/compiled/
    COMPILED = json.load(f)
GIB = 2**30
grid = [key.split("/") + [record] for key, record in COMPILED.items() if key.count("/") == 3]
slices = sorted({g[0] for g in grid}, key=lambda name: (int(name.rsplit("-", 1)[1]), name))
columns = [f"{size} {cache}" for size in sorted({g[2] for g in grid}) for cache in ("uncached", "deepcache")]
rows = []
for slice_ in slices:
    records = [g for g in grid if g[0] == slice_]
    first = records[0][4]
    chips = f"{first['chips']} chips" + (f", {first['devices']} devices" if first["devices"] != first["chips"] else "")
    limit = next((g[4]["hbm_available_per_device"] for g in records if "hbm_available_per_device" in g[4]), None)
    order = ("tp", "tp_replicated_out", "fsdp", "sequence")  # the benchmark's layouts first, then any others
    for layout in sorted({g[1] for g in records}, key=lambda n: (order.index(n) if n in order else len(order), n)):
        row = {"slice": f"{slice_} ({chips})", "layout": layout, "mesh": ""}
        for column in columns:
            size, cache = column.split()
            r = COMPILED.get(f"{slice_}/{layout}/{size}/{cache}")
            if r is None:
                row[column] = "not compiled"
                continue
            row["mesh"] = ",".join(f"{a}={n}" for a, n in r["mesh"].items() if n > 1) or "one device"
            row[column] = f"{r['per_device_bytes']['total'] / GIB:.1f} GiB" + ("" if r["fits"] else " (does not fit)")
        row["usable HBM per device"] = f"{limit / GIB:.2f} GiB" if limit else ""
        rows.append(row)
print("per-device bytes (weights + inputs + temporaries + outputs + code), one CFG step; e.g.",
      COMPILED["v6e-8/tp_replicated_out/720p/uncached"]["command"])
html_table(rows)

# %%
done = [r for r in COMPILED.values() if "compile_seconds" in r]
full = [r["compile_seconds"] for k, r in COMPILED.items() if k.endswith("720p/uncached")]
misfits = sorted(k for k, r in COMPILED.items() if not r.get("fits", True))
print(f"{len(done)} configurations in the saved file; the full 720p step took {min(full):.0f}-{max(full):.0f} s "
      f"each to compile on a 2-core CPU (compile times vary with the machine's load)")
print("does not fit:", ", ".join(misfits) if misfits else "none")

# %% [markdown]
# All 64 configurations (4 slices, 4 layouts, 2 sizes, with and without DeepCache) are compiled, and every one
# fits; the tightest, `tp_replicated_out` on the v5e-8 at 720p, leaves about 2 GiB of its 15.75 GiB. A layout that
# the compiler rejects for HBM would be the cheapest failure there is: it costs minutes on a CPU instead of an hour
# of a rented slice. To check any other layout, size or slice before renting it:
#
# ```bash
# python -m hyv_lib compile --preset 720p_t2v --topology v6e:2x4 --mesh data=2,tensor=4 --sharding tp_replicated_out
# python -m hyv_lib compile --preset 480p_t2v --topology v5e:2x4 --mesh data=2,sequence=4 --sharding fsdp --enable_cache
# python -m hyv_lib compile --preset 720p_t2v --topology v6e:4x4 --mesh data=2,tensor=8 --json   # 16 chips, 4 hosts
# ```
#
# The reports also hold what the compiler put between the devices. Here are the two tensor-parallel rule sets on
# the same v6e-8 mesh, straight from the saved HLO counts:

# %%
pair = {rules: COMPILED.get(f"v6e-8/{rules}/720p/uncached") for rules in ("tp", "tp_replicated_out")}
if None in pair.values():
    print("the saved file lacks one of the two v6e-8 720p reports; compile them with the first command above")
else:
    display(html_table([
        {"rule set (v6e-8, data=2,tensor=4, 720p)": rules,
         **{f"{kind} (count, GiB)": next((f"{c['count']}, {c['bytes'] / GIB:.2f}" for c in r["collectives"]
                                           if c["kind"] == kind), "none") for kind in ("all-reduce", "all-gather")},
         "weights + inputs GiB": round(r["per_device_bytes"]["arguments"] / GIB, 2),
         "total GiB": round(r["per_device_bytes"]["total"] / GIB, 2)} for rules, r in pair.items()]))

# %% [markdown]
# `tp_replicated_out` replicates the row-parallel weights (`to_out.0`, `to_add_out` and the MLPs' second linears).
# The compiler does not simply drop collectives for it: about half of `tp`'s all-reduces become all-gathers of
# the same total size (the attention output is gathered and the whole `to_out` runs on every device), while the
# MLP outputs are still all-reduced. An all-gather sends half the bytes of an all-reduce of the same result, so the
# traffic falls by about a quarter. The price is memory: the replicated weights are whole on every device, so each
# device holds more weights than under `tp` (the arguments column). The section on communication below turns these
# counts into seconds.

# %% [markdown]
# ## Measured times as MFU
#
# Model FLOP utilisation is the model's FLOPs per step over what the chips could do in the measured time:
#
# $$\text{MFU} = \frac{C}{t_\text{step} \cdot n \cdot \text{peak}} .$$
#
# $C$ is the *model's* count, here `step_flops` at 720p and 121 frames, whatever the kernel actually
# executes. The only published HunyuanVideo-1.5 step times on these systems come from one project,
# gpu-tpu-pedia (a single author; not reproduced here; see {doc}`../book/references`). Its documents label the
# same TPU runs *v4-8* in some places and *v6e-8* in others. They cannot have been v4. A v4-8 is 4 chips of
# 275 TFLOP/s, 1.1 PFLOP/s in all; doing the step's 12.65 PFLOP in 7.29 s (the stock-Splash baseline) takes about
# 1.74 PFLOP/s, more than that peak (the first lines below), and the faster runs would need more still. On eight v6e
# chips the same time is a plausible 24% MFU. The MFU below therefore assumes v6e, as the project's current README
# says.
#
# Each MFU is computed against the time of the run it names, one value per configuration as
# {ref}`references-baselines` lists them (kept in `hyv_lib.planning.hardware.CITED_STEP_TIMES`): on the v6e-8,
# 7.29 s/step is the stock-Splash baseline; on 8×H100, 5.2 s/step for FlashAttention-2.
#
# Each time was measured on one layout, and the `layout` column gives it in `hyv_lib`'s terms. The project's TPU
# script builds a single mesh, `(tp, dp, sp) = (8, 1, 1)`, so every TPU time is `tensor=8`, with its weight rules
# (plain Megatron TP, or `tp_replicated_out`'s replicated row-parallel weights); its GPU runs start one process per
# GPU with sequence parallelism over all eight (`torchrun --nproc_per_node=8`, Ulysses, whole weights on every GPU).
# None was measured on `hyv_lib`'s default TPU layout, `data=2,tensor=4`. MFU needs only the model's FLOPs, so it
# does not depend on the layout; the bounds do, which is why {doc}`05_end_to_end_720p` puts a cited time only on the
# row of its own layout.
#
# A cache changes the picture. A {term}`DeepCache` step averages over full and cached steps, and a cached step skips
# 53 of the 54 blocks. Dividing the full-step $C$ by its *average* time gives an **effective** MFU: the throughput of
# a model that did all the work. The **real** MFU divides the FLOPs actually executed, $C$ over the schedule's
# block-count ratio, by the same time ({term}`effective MFU`, {term}`real MFU`). The cached times come from documents
# that also timed their own uncached run (`CITED_RUN_PAIRS`): on the GPUs that run is the 5.2 s/step baseline itself
# (260 s per video), but on the TPU the migration guide's uncached run took about 350 s, 7.0 s/step, not the
# README's 7.29. A cached run is compared with its own document's uncached run, never with the other.

# %%
V4 = CHIPS["v4"]
BASE = {c["chip"]: c for c in CITED_STEP_TIMES  # the uncached baseline of each platform (references-baselines)
        if c["chip"] == "H100" or (c["rules"] == "tp_replicated_out" and "stock" in c["label"])}
EXP2 = next(c for c in CITED_STEP_TIMES if "exp2" in c["label"])  # the fastest published TPU run
t_base = BASE["v6e"]["seconds"]
print(f"{F720['total'] / 1e15:.2f} PFLOP in {t_base} s = {F720['total'] / t_base / 1e15:.2f} PFLOP/s; a v4-8 peaks at "
      f"4 x {V4.peak_bf16_flops / 1e12:.0f} TFLOP/s = {4 * V4.peak_bf16_flops / 1e15:.2f} PFLOP/s: "
      f"{mfu(F720['total'], t_base, 'v4', 4):.0%} MFU, impossible; on 8 x v6e {mfu(F720['total'], t_base, 'v6e', 8):.0%}")
schedule = DeepCacheSchedule(50)  # HunyuanVideo-1.5's 11 / 45 / 4 schedule
skip_ratio = schedule.block_speedup(54)  # FLOPs without the cache / FLOPs with it (1 block recomputed)
print(f"DeepCache 11/45/4: {len(schedule.full_steps)} of 50 steps full; FLOPs executed fall {skip_ratio:.2f}x")

def layout(mesh, rules):
    """A cited run's layout in hyv_lib's terms: the GPU runs are Ulysses with whole weights on every GPU."""
    return f"Ulysses, {layout_label(mesh)}" if rules == "replicated" else f"{rules}, {layout_label(mesh)}"


runs = [dict(system=f"{c['n_chips']} x {c['chip']}", config=c["label"], s=c["seconds"], chip=c["chip"],
             layout=layout(c["mesh"], c["rules"]), cache=1.0, source=c["source"]) for c in CITED_STEP_TIMES]
DEEPCACHE = {chip: cited_pair("deepcache", chip) for chip in ("v6e", "H100")}  # each with its own uncached run
runs += [dict(system=f"{d['n_chips']} x {chip}",
              config=f"{d['after']}, {d['after_s']:.0f} s / {d['steps']} (its uncached run {d['before_s']:.0f} s)",
              s=d["after_s"] / d["steps"], chip=chip, layout=layout_label(d["mesh"]) if chip == "v6e"
              else layout(d["mesh"], "replicated"), cache=skip_ratio, source=d["source"])
         for chip, d in DEEPCACHE.items()]
rows = []
for r in runs:
    effective = mfu(F720["total"], r["s"], r["chip"], 8)
    rows.append({"system": r["system"], "configuration": r["config"], "layout": r["layout"],
                 "s/step": round(r["s"], 2),
                 "MFU (effective if cached)": f"{effective:.1%}", "real MFU": f"{effective / r['cache']:.1%}",
                 "source": r["source"]})
display(html_table(rows))
for chip, d in DEEPCACHE.items():
    t_uncached, t_cached = d["before_s"] / d["steps"], d["after_s"] / d["steps"]
    print(f"{d['n_chips']} x {chip}, DeepCache against its own document's uncached run: {t_uncached:.2f} s/step = "
          f"{mfu(F720['total'], t_uncached, chip, 8):.1%} MFU uncached, {mfu(F720['total'], t_cached, chip, 8) / skip_ratio:.1%}"
          f" real MFU cached (the baseline {BASE[chip]['seconds']} s/step is {mfu(F720['total'], BASE[chip]['seconds'], chip, 8):.1%})")

# %% [markdown]
# For comparison, the best public TPU number for a video DiT of this class is for another model, Wan2.2-A14B
# (720p, 81 frames, 75,600 tokens): maxdiffusion ran its 40 denoising steps in 105.3 s on a v7x-8 with a
# fixed-max 2D ring attention (commit `8dd63054`, `end_to_end/tpu/run_wan_fast_inference.sh`). Its FLOP count is
# maxdiffusion's own: `tests/flop_calculations_test.py` puts a training pass of Wan2.1-14B at that size at
# 19,573 TFLOP, three forwards, so a CFG step is two thirds of it. JAX shows each TPU7x chip as two devices, so a
# "v7x-8" is 4 chips (the planner counts chips). The same FLOP count gives the MFU of gpu-tpu-pedia's torchax
# run of Wan2.1-14B on a v6e-8 (4.60 s/step, `tpu/Wan2.1/README.md`, single author, unverified).

# %%
WAN_CFG_STEP = 2 * 19_573e12 / 3  # two forwards of maxdiffusion's training-pass count (3 forwards)
rows = [
    {"model": "Wan2.2-A14B, 720p 81f", "system": "v7x-8 (4 chips)", "s/step": round(105.3 / 40, 3),
     "PFLOP/step": round(WAN_CFG_STEP / 1e15, 2), "MFU": f"{mfu(WAN_CFG_STEP, 105.3 / 40, 'v7x', 4):.1%}",
     "source": "maxdiffusion 8dd63054 (fixed-m 2D ring)"},
    {"model": "Wan2.1-14B, 720p 81f", "system": "v6e-8", "s/step": 4.60,
     "PFLOP/step": round(WAN_CFG_STEP / 1e15, 2), "MFU": f"{mfu(WAN_CFG_STEP, 4.60, 'v6e', 8):.1%}",
     "source": "gpu-tpu-pedia tpu/Wan2.1/README.md [U]"},
]
html_table(rows)

# %%
T_TARGET = F720["total"] / (TARGET_MFU * 8 * V6E.peak_bf16_flops)
bound = {chip: bounds(P720, 720, 1280, 121, chip, 8, LAYOUT[chip])["compute_s"] for chip in ("v6e", "H100")}
bars = [r for r in runs if r["cache"] == 1.0]
fig, ax = plt.subplots(figsize=(8.5, 3.6))
y = np.arange(len(bars))
ax.barh(y, [r["s"] for r in bars], color=["C0" if r["chip"] == "v6e" else "C2" for r in bars])
ax.set_yticks(y, [f"{r['system']}: {r['config']}" for r in bars], fontsize=8)
for chip, color in (("v6e", "C0"), ("H100", "C2")):
    ax.axvline(bound[chip], color=color, ls=":", lw=2, label=f"compute bound, 8 x {chip} ({bound[chip]:.2f} s)")
ax.axvline(T_TARGET, color="k", ls="--", label=f"{TARGET_MFU:.0%} MFU on 8 x v6e ({T_TARGET:.2f} s)")
ax.set_xlabel("seconds per CFG step, 720p, 121 frames: cited, not measured here")
ax.set_title("Published runs of gpu-tpu-pedia's code (single author, unverified), 8 chips each", fontsize=9)
fig.legend(frameon=False, fontsize=8, loc="lower center", ncol=3)
fig.tight_layout(rect=(0, 0.08, 1, 1))
plt.show()

# %% [markdown]
# Both platforms land at 21–31% MFU without a cache. The cached runs look like 42–56% *effective* MFU,
# but the chips do not work harder: the real MFU drops below that of the same source's uncached run (the lines
# under the table), because a cached step costs more than its FLOPs (next section). maxdiffusion's Wan2.2 number
# shows that a JAX video DiT on TPU can run above 50% MFU, on a newer chip.
#
# The v6e compute bound in the chart sits a little above the worked example's 1.72 s, because it is the planner's
# per-device count for the default layout: under `tp_replicated_out` every device runs the replicated `to_out`
# projections whole, so each does somewhat more than an eighth of the FLOPs.

# %% [markdown]
# ### Measured here: one H200, random weights
#
# Every time above is cited. The only timings of `hyv_lib` itself come from one GPU: `python benchmarks/gpu_check.py`
# ran three times on one NVIDIA H200 on 2026-11-26, and its JSON files are committed in `benchmarks/results/`, whose
# `README.md` says what each run holds. Run 2 has the attention call, the 480p step and the cache, offload and VAE
# rows; run 3 `hyv_lib`'s 720p step; run 1 diffusers' 720p step and `hyv_lib`'s steps with `torch_varlen`, which
# `auto` picked before run 1 showed SDPA faster (in run 1 a wrong attribute name stopped each step row after its
# seconds and peaks were written and before its MFU). The weights are random bf16, which changes the numbers computed
# but not the work or its speed. Each step is one CFG step (batch 2) of the full 54-block DiT at 121 frames, through
# the forward `--runtime torch` runs (diffusers' DiT with `hyv_lib`'s attention) or diffusers' stock one (its
# dense-mask attention) on the same weights and inputs. The cells below read the files and recompute each MFU from
# the row's FLOPs and seconds against the H200's peak in `CHIPS`.

# %%
from pathlib import Path

RESULTS = Path("../benchmarks/results")  # this notebook runs in notebooks/; the files benchmarks/gpu_check.py wrote
RUNS = {n: json.loads((RESULTS / f"gpu_check_2026-11-26_H200_run{n}.json").read_text()) for n in (1, 2, 3)}
H200 = CHIPS["H200"]


def gpu_rows(run, section):
    """The rows of one section of one run, by name."""
    return {r["name"]: r for r in RUNS[run]["sections"][section]["rows"]}


env = RUNS[2]["sections"]["environment"]
print(f"measured here (one {env['gpu']}, random weights): torch {env['torch']}, diffusers {env['diffusers']}; "
      f"its own bf16 matmul ran at {env['matmul_bf16_tflops']} TFLOP/s, "
      f"{env['matmul_bf16_tflops'] * 1e12 / H200.peak_bf16_flops:.0%} of the {H200.peak_bf16_flops / 1e12:.0f} "
      "TFLOP/s datasheet peak that MFU divides by")
attn = RUNS[2]["sections"]["attention"]
shape = attn["shape"]
print(f"attention at 720p/121f: {shape['batch']} samples x {shape['heads']} heads x {shape['tokens']:,} tokens "
      f"({shape['valid_tokens'][0]:,} and {shape['valid_tokens'][1]:,} valid), {attn['useful_gflop'] / 1e3:.1f} "
      "TFLOP of useful work per call")
html_table([{"attention call (run 2)": r["name"], "status": r["status"], "ms": r.get("ms", ""),
             "useful TFLOP/s": r.get("tflops", ""),
             "of H200 peak": f"{r['tflops'] * 1e12 / H200.peak_bf16_flops:.1%}" if "tflops" in r else "",
             "max error vs fp32": f"{r['max_error']:.1e}" if "max_error" in r else "",
             "peak GiB": r.get("peak_allocated_gib", ""), "why skipped": r.get("reason", "").split(" (")[0]}
            for r in attn["rows"]])

# %%
a = gpu_rows(2, "attention")
print(f"SDPA per sample is {a['torch_varlen']['ms'] / a['sdpa']['ms']:.1f}x faster than torch_varlen and "
      f"{a['diffusers_dense']['ms'] / a['sdpa']['ms']:.1f}x faster than the dense mask, whose [B, 1, S, S] bool mask "
      f"alone is {a['diffusers_dense']['mask_gib']} GiB")
STEPS = [(2, "hyv_lib 480p"), (1, "hyv_lib 480p"), (2, "diffusers 480p"),
         (3, "hyv_lib 720p"), (1, "hyv_lib 720p"), (1, "diffusers 720p")]
measured_steps, rows = {}, []
for run, name in STEPS:
    r = gpu_rows(run, "step")[name]
    code, size = name.split()
    util = mfu(r["tflop"] * 1e12, r["s_per_step"], "H200", 1)
    measured_steps[(code, size, r.get("backend", "dense"))] = dict(r, mfu_here=util)
    rows.append({"one CFG step, 121 frames": size, "code": code + (" stock" if code == "diffusers" else ""),
                 "attention": r.get("backend", "dense [B, 1, S, S] mask"), "s/step": r["s_per_step"],
                 "PFLOP": round(r["tflop"] / 1e3, 2), "MFU": f"{util:.1%}",
                 "MFU in the file": f"{r['mfu']:.1%}" if "mfu" in r else "not written",
                 "peak GiB": r["peak_allocated_gib"], "measured here": f"one H200, run {run}"})
display(html_table(rows))
for size in ("480p", "720p"):
    mine, stock = measured_steps[("hyv_lib", size, "sdpa")], measured_steps[("diffusers", size, "dense")]
    print(f"{size}: diffusers stock / hyv_lib = {stock['s_per_step'] / mine['s_per_step']:.2f}x the time, "
          f"{stock['peak_allocated_gib'] / mine['peak_allocated_gib']:.1f}x the peak memory")
same = RUNS[2]["sections"]["step"]["compare"]["480p"]
print(f"480p outputs, hyv_lib vs diffusers (bf16): max |difference| {same['max_abs_diff']:.3f} on outputs up to "
      f"{same['max_abs_output']:.2f}, relative L2 {same['relative_l2']:.3f}")

# %%
cache = gpu_rows(2, "cache")["cache 480p"]
offload = gpu_rows(2, "offload")["block offload 480p"]
vae = gpu_rows(2, "vae")["vae decode 720x1280x121"]
resident = measured_steps[("hyv_lib", "480p", "sdpa")]
plan = cache["deepcache_default"]
print(f"DeepCache at 480p: full step {cache['full_step_s']} s, cached step {cache['cached_step_s']} s = "
      f"{cache['cached_over_full']:.4f} of a full step (one block of 54: {1 / 54:.4f}); 50 steps under "
      f"{plan['schedule']}: {plan['projected_50_step_s']} s, {plan['projected_speedup']}x (FLOP bound "
      f"{plan['block_bound']}x) - arithmetic on the two measured steps, not a measured run")
print(f"block offloading at 480p: {offload['s_per_step']} s/step at {offload['peak_allocated_gib']} GiB peak, against "
      f"{resident['s_per_step']} s at {resident['peak_allocated_gib']} GiB with the weights resident "
      f"(+{offload['s_per_step'] / resident['s_per_step'] - 1:.0%} time)")
print(f"VAE decode of {vae['latents']} latents to {vae['frames'][0]} frames of {vae['frames'][2]}x{vae['frames'][1]}, "
      f"{vae['tile_px']} px tiles, {vae['dtype']}: {vae['seconds']} s, {vae['peak_allocated_gib']} GiB peak")

# %%
cited_gpu = [r for r in runs if r["chip"] == "H100" and r["cache"] == 1.0]
bars = [(f"1 x H200, hyv_lib, {backend}", measured_steps[("hyv_lib", "720p", backend)]["mfu_here"], "measured")
        for backend in ("sdpa", "torch_varlen")]
bars.append(("1 x H200, diffusers stock, dense mask", measured_steps[("diffusers", "720p", "dense")]["mfu_here"],
             "measured"))
bars += [(f"8 x H100, gpu-tpu-pedia: {r['config']} ({r['s']} s)", mfu(F720["total"], r["s"], "H100", 8), "cited")
         for r in cited_gpu]
fig, ax = plt.subplots(figsize=(8.5, 3.2))
y = np.arange(len(bars))
for yi, (label, value, kind) in zip(y, bars):
    ax.barh(yi, value * 100, color="C2" if kind == "measured" else "0.8", hatch="" if kind == "measured" else "//",
            edgecolor="0.3", label={"measured": "measured here (one H200, random weights; benchmarks/results/)",
                                    "cited": "cited, not measured here (gpu-tpu-pedia, unverified)"}[kind])
    ax.text(value * 100 + 0.5, yi, f"{value:.1%}", va="center", fontsize=8)
ax.set_yticks(y, [b[0] for b in bars], fontsize=8)
ax.invert_yaxis()
ax.set_xlim(0, 100 * max(b[1] for b in bars) * 1.15)
ax.set_xlabel("MFU of one 720p, 121-frame CFG step (% of the GPUs' bf16 peak)")
handles, labels = ax.get_legend_handles_labels()
unique = dict(zip(labels, handles))
fig.legend(unique.values(), unique.keys(), frameon=False, fontsize=8, loc="lower center", ncol=2)
fig.tight_layout(rect=(0, 0.1, 1, 1))
plt.show()
print(f"GPU-seconds per 720p CFG step: measured 1 x {measured_steps[('hyv_lib', '720p', 'sdpa')]['s_per_step']} "
      f"(one H200) against cited " + " and ".join(f"8 x {r['s']} = {8 * r['s']:.1f}" for r in cited_gpu)
      + f" (8 x H100); bf16 peaks "
      f"{H200.peak_bf16_flops / 1e12:.0f} and {CHIPS['H100'].peak_bf16_flops / 1e12:.1f} TFLOP/s, HBM "
      f"{H200.hbm_bandwidth / 1e12:.2f} and {CHIPS['H100'].hbm_bandwidth / 1e12:.2f} TB/s")

# %% [markdown]
# On one H200, `hyv_lib`'s step runs at about half of the bf16 peak: 48.1% MFU at 480p and 51.7% at 720p, with
# PyTorch's SDPA on each sample's valid tokens. diffusers' stock forward, on the same weights and inputs, takes 2.89x
# as long at 480p and 3.41x at 720p, and at 720p needs 117.13 GiB at its peak against 26.02 GiB; the two outputs agree
# to a relative L2 of 0.012 in bf16. The attention call alone shows where the difference is: SDPA per sample does
# the useful work at 557.7 TFLOP/s, 56.4% of the peak, `torch_varlen` (PyTorch's varlen kernel, which torch 2.11
# feeds packed keys) takes 1.6x as long, and the dense mask 4.0x as long with 100.49 GiB at its peak. That is why
# `--attention auto` on Hopper tries SDPA first. This run did not record which kernel SDPA dispatched to inside
# PyTorch (`gpu_check` records it now); torch 2.11 on an H200 prefers cuDNN's fused attention, and chapter 2's kernel
# table gives the sources and what flash-attn and FlashAttention-3 add there. All paths agree with the fp32 reference
# within 7.4e-5.
#
# A DeepCache cached step cost 0.0192 of a full one, about its FLOP share of one block in 54 (0.0185), where
# gpu-tpu-pedia's runs imply 5 to 9 times that share (the DeepCache section below). Streaming the blocks from host
# memory (diffusers' group offloading) cut the peak from 20.25 to 5.61 GiB for 3% more time at 480p.
#
# Against the cited GPU runs: the H200 and the H100 are the same GH100 chip with the same bf16 peak, so MFU compares
# them. One H200 running `hyv_lib`'s step reaches 51.7%, against 30.7% for gpu-tpu-pedia's 8×H100 FlashAttention-2
# run (5.2 s/step), and spends 24.725 GPU-seconds on a step that cost that run 41.6. The comparison is not like for
# like: one GPU has
# no all-to-all to hide, the H200's HBM is faster (4.80 against 3.35 TB/s), and the cited runs are another code base
# with FlashAttention-2. It does show that one Hopper GPU runs this step above 50% MFU with PyTorch's SDPA
# (cuDNN's kernel, 1.6x FlashAttention-2's speed in the attention table above), so the 8-GPU runs' 31% leaves a
# gap that communication and their kernel must account for. `hyv_lib`'s Ulysses
# runtime has not been measured on GPUs, and nothing here was measured on an H100.

# %% [markdown]
# ## Reading a profile: one step, op by op
#
# Every time so far was counted, cited or read from a file. A *profile* says where a real step's time goes, op by op,
# and it is how one would answer the open exercise at the end of this chapter on a TPU. This section profiles one step
# here, on the program the TPU runtime runs (`JaxTransformer`, the jitted step of chapter 1, on JAX's CPU backend,
# which the book is built with: on a TPU VM without `JAX_PLATFORMS=cpu` the same cell traces the TPU, where the way
# `profile_step` reads the trace is untested), and walks through reading it. The model is the diffusers DiT at
# hyv-tiny's sizes (3 blocks, 2 heads of 32, $d = 64$) with seeded random weights, which change the numbers computed
# but not the work or its speed, at a size chosen so that attention's share of the counted FLOPs is close to the 720p
# step's (both printed below).
#
# `hyv_lib.planning.profile.profile_transformer` runs the step once (it compiles), then traces two more steps with
# `jax.profiler.trace(..., create_perfetto_trace=True)`, the capture the JAX documentation describes for any
# backend ([Profiling computation](https://docs.jax.dev/en/latest/profiling.html)). In the trace, XLA's CPU runtime
# names the {term}`HLO` instruction behind each event; `profile_step` looks each one up in the compiled program
# (`compiled.as_text()`) and sorts it into one of four kinds:
#
# - **linear matmuls**: ops that are or contain a `dot` (or a convolution) without batch dimensions: activations
#   times a weight matrix;
# - **attention matmuls**: ops that contain a `dot` batched over samples and heads: $QK^\top$ and $PV$;
# - **attention softmax and mask**: the other ops that write or read the *scores*, the tensor $QK^\top$ produces and
#   $PV$ consumes (the mask, the running maximum, the exponentials, the sums and the rescale);
# - **other**: the rest (norms, RoPE, activations, residual adds, copies and transposes).
#
# Loops are not counted twice: the attention kernel's `lax.scan` over key blocks compiles to a `while`, and only
# the ops of its body are counted, once per run.

# %%
from hyv_lib.kernels.xla import DEFAULT_BLOCK_KV, kv_block_layout
from hyv_lib.models.components import build_tiny_components
from hyv_lib.models.hunyuan_video15.components import example_forward_kwargs
from hyv_lib.planning.profile import OP_KINDS, profile_transformer
from hyv_lib.runtimes.jax_step import JaxTransformer

TINY = hyv_lib.get_preset("tiny_trained")  # hyv-tiny's sizes; random weights below, not its trained ones
PROFILE_SIZE = (256, 384, 33)  # height, width, frames of the profiled step
_, _, *profile_latent = TINY.latent_shape(*PROFILE_SIZE)
profile_flops = step_flops(TINY, *PROFILE_SIZE)
profile_model = build_tiny_components(TINY, names=["transformer"])["transformer"]  # seeded random weights
profile_inputs = example_forward_kwargs(TINY, latent=tuple(profile_latent), text_lengths=(7, 12),
                                        byt5_lengths=(0, 5))  # a CFG pair with real padding
profile = profile_transformer(JaxTransformer(profile_model), profile_inputs, repeats=2)
S_profile = profile_flops["tokens"]["joint"]
print(f"{len(profile_model.transformer_blocks)} blocks, d = {profile_model.config.num_attention_heads} x "
      f"{profile_model.config.attention_head_dim}; one CFG step at {PROFILE_SIZE[1]}x{PROFILE_SIZE[0]}, "
      f"{PROFILE_SIZE[2]} frames: S = {S_profile:,} tokens, {profile_flops['total'] / 1e9:.1f} GFLOP counted, "
      f"{profile_flops['attention_share']:.1%} of it attention (720p, 121 frames: {F720['attention_share']:.1%})")
print(f"per step ({profile.repeats} traced): {1e3 * profile.wall_seconds:.0f} ms from call to result on the host; "
      f"some op running for {1e3 * profile.busy_seconds:.0f} ms ({profile.busy_seconds / profile.wall_seconds:.0%}); "
      f"the ops' times summed: {1e3 * profile.op_seconds:.0f} ms")
counted = {"linear matmuls": profile_flops["linear"], "attention matmuls": profile_flops["attention"]}
html_table([{"kind": kind, "ms/step": round(1e3 * profile.by_kind[kind], 1),
             "share of op time": f"{profile.shares[kind]:.1%}",
             "share of counted FLOPs": (f"{counted[kind] / profile_flops['total']:.1%}" if kind in counted
                                        else "not counted"),
             "GFLOP/s": round(counted[kind] / profile.by_kind[kind] / 1e9, 1) if kind in counted else ""}
            for kind in OP_KINDS])

# %% [markdown]
# The ten longest ops, with what the profile and the compiled program say about each, then the longest op of each
# kind:

# %%
display(html_table(profile.top(10)))
display(html_table([row for kind in OP_KINDS for row in profile.top(1, kind)]))
n_kv_blocks, kv_block = kv_block_layout(S_profile, DEFAULT_BLOCK_KV)
attention_time = profile.by_kind["attention matmuls"] + profile.by_kind["attention softmax and mask"]
print(f"key blocks of the XLA attention kernel: kv_block_layout({S_profile:,}, {DEFAULT_BLOCK_KV}) = "
      f"{n_kv_blocks} blocks of {kv_block} keys")
print(f"attention (matmuls + softmax and mask): {attention_time / profile.op_seconds:.1%} of the op time for "
      f"{profile_flops['attention_share']:.1%} of the counted FLOPs; the softmax and mask are "
      f"{profile.by_kind['attention softmax and mask'] / attention_time:.0%} of attention's time")

# %%
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.6), gridspec_kw={"width_ratios": [1, 1.4]})
colors = dict(zip(OP_KINDS, ("C0", "C1", "C3", "0.6")))
y = np.arange(len(OP_KINDS))
ax1.barh(y - 0.2, [100 * counted.get(k, 0) / profile_flops["total"] for k in OP_KINDS], 0.4, color="0.85",
         edgecolor="0.3", label="counted FLOPs (step_flops)")
ax1.barh(y + 0.2, [100 * profile.shares[k] for k in OP_KINDS], 0.4, color=[colors[k] for k in OP_KINDS],
         label="measured op time (profile), by kind")
ax1.set_yticks(y, OP_KINDS, fontsize=8)
ax1.invert_yaxis()
ax1.set_xlabel("% of the step")
ax1.set_title("Counted FLOPs against measured time", fontsize=9)
ax1.legend(frameon=False, fontsize=7, loc="lower right")
top = profile.ops[:10]
ax2.barh(np.arange(len(top)), [1e3 * o["seconds"] for o in top], color=[colors[o["kind"]] for o in top])
ax2.set_yticks(np.arange(len(top)), [f"{o['name']} (x{o['calls']:g})" for o in top], fontsize=7)
ax2.invert_yaxis()
ax2.set_xlabel("ms per step (all runs of the op)")
ax2.set_title("The ten longest HLO ops, coloured by kind", fontsize=9)
fig.suptitle(f"One CFG step of hyv-tiny's DiT at S = {S_profile:,} on this CPU (random weights)", fontsize=10)
fig.tight_layout()
plt.show()

# %% [markdown]
# Read it from the top down, as one would read a TPU profile:
#
# 1. **Host or device?** The second printed line compares the time from call to result with the time some op was
#    running. When the two are close, as here, the step is bound by the device's work; a large gap would be Python,
#    dispatch and copies, which on a TPU VM show up on the host rows of the trace, not on the TPU's. (The ops'
#    summed time can exceed the busy time a little: XLA's CPU runtime may run two independent ops at once.)
# 2. **Which kind of work?** The kinds table and the left chart set each kind's share of the op time beside its
#    share of the FLOPs that `step_flops` counts. The two matmul kinds have FLOPs, so their time gives a rate
#    (GFLOP/s). The softmax and mask have none in the count (`step_flops` counts matmuls only, and a softmax is a
#    few operations per score against $4D$ matmul FLOPs), yet they take a large part of the time (the second printed
#    line under the op tables): they are elementwise passes over the whole score tensor, limited by memory and
#    the vector units, not by the matrix units. On a v6e, gpu-tpu-pedia's optimisation guide (cited in the next
#    section, unverified) puts the softmax at about a third of the Splash kernel's time: the same kind of cost, on
#    another machine.
# 3. **Which ops?** Each row of the two op tables is one HLO instruction, named by XLA after what it fuses:
#    `ynn_fusion.N` is a fusion that XLA's CPU backend hands to YNNPACK, its matmul library;
#    `broadcast_select_fusion` holds the mask's `jnp.where`, `subtract_exponential_fusion` the $\exp(s - m)$ of the
#    online softmax. `runs/step` is how often the op ran: the attention ops run once per key block (the number
#    printed under the tables, from `kv_block_layout`), because they sit in the body of the kernel's `while` loop.
#    `JAX op (metadata)` is the JAX operation XLA kept in the op's metadata: `while/body/closed_call/...` marks the
#    kernel's loop, and a linear matmul's reads `linear/...a,ba->...b/dot_general`, a torch `Linear` lowered by
#    torchax, whose `reads weight` names the parameter it multiplies by (second table). That is the way back from a
#    slow op to the code that made it.
# 4. **How fast is each kind?** The GFLOP/s column is the measured rate of the matmuls; against the machine's peak
#    it is the per-op FLOP utilisation that a TPU profiler reports per op and per category (below).
#
# ### What a TPU profile shows instead
#
# On a TPU VM the same step compiles to a different program, and its profile reads differently:
#
# - **Attention is one op per block.** With {term}`Splash` (`--attention auto` on a TPU), $QK^\top$, the softmax and
#   $PV$ are one Pallas kernel compiled by {term}`Mosaic`, one custom call in the HLO, so no separate softmax rows
#   appear: the kernel's time against its FLOPs gives its efficiency, the $e_\text{attn}$ of the next section, and
#   how that time splits inside the kernel needs the kernel-level tools.
# - **The linear layers** run in bf16 on the {term}`MXU`, as fusions around the dots (here: f32, on YNNPACK).
# - **On a mesh, collectives appear**: the all-reduces of `tp`, or under `tp_replicated_out` all-gathers in place of
#   half of them (chapter 3). XLA may make them asynchronous (`-start`/`-done` pairs); whether compute runs between
#   a start and its done, or the chip waits, is the exposed communication $t_\text{exposed}$ of the next section.
# - {term}`XProf`'s **HLO Op Stats** tool lists the time of every HLO op and charts it by category, and its **HLO Op
#   Profile** tool gives each op's and each category's FLOPS utilisation and HBM bandwidth utilisation
#   ([HLO Op Stats](https://openxla.org/xprof/hlo_op_stats), [HLO Op Profile](https://openxla.org/xprof/hlo_op_profile)).
#
# To capture one on a TPU VM, warm the step up (the first call compiles), trace one call, and open the trace in
# XProf (the JAX documentation's recipe, [Profiling computation](https://docs.jax.dev/en/latest/profiling.html);
# Google Cloud's [Profile your model on Cloud TPU VMs](https://docs.cloud.google.com/tpu/docs/profile-tpu-vm)):
#
# ```python
# import jax
# from hyv_lib.runtimes.jax_step import JaxTransformer
#
# tpu = JaxTransformer(transformer, mesh="data=2,tensor=4")  # the real 720p DiT, loaded as in chapter 5
# tpu(**kwargs)                                  # warm-up: compiles
# with jax.profiler.trace("/tmp/profile-data"):
#     tpu(**kwargs)                              # returns the prediction on the host: the device work is inside
# ```
#
# then `pip install xprof` and `xprof --port 8791 /tmp/profile-data` on the VM, forward the port over SSH, and
# choose `trace_viewer`, `hlo_op_stats` or `hlo_op_profile` under Tools. `profile_transformer` itself was
# written and tested on the CPU backend only: on a TPU its trace should name the device's HLO ops too, but no TPU
# was at hand to check it, so read a TPU profile in XProf.
#
# :::{admonition} Takeaway
# :class: tip
# A profile turns the FLOP count into time per op. Each kind of matmul takes its FLOPs divided by its own rate (the
# GFLOP/s column), and the softmax and mask, which the count leaves out, take a large share of the step besides:
# the reason a FLOP count alone cannot give a step time, and why the attention kernel, softmax included, is the
# lever of the next section.
# :::

# %% [markdown]
# ## The road to 50% MFU on a v6e-8
#
# The target follows from the count and the peak alone:

# %%
print(f"{TARGET_MFU:.0%} MFU on 8 x v6e: {F720['total'] / 1e15:.2f} PFLOP / ({TARGET_MFU} x 8 x "
      f"{V6E.peak_bf16_flops / 1e12:.0f} TFLOP/s) = {T_TARGET:.2f} s per CFG step, {50 * T_TARGET:.0f} s for 50 steps")
for c in CITED_STEP_TIMES:
    if c["chip"] == "v6e":
        print(f"  from {c['seconds']} s/step ({c['label']}): {c['seconds'] / T_TARGET:.2f}x faster")

# %% [markdown]
# To see where the time must come from, split the step into the two kinds of work plus whatever is exposed
# (communication or host overhead not hidden behind compute), each at its own efficiency $e$ (fraction of peak):
#
# $$
# t_\text{step} = \frac{C_\text{attn}}{n\,\text{peak}\,e_\text{attn}} + \frac{C_\text{lin}}{n\,\text{peak}\,e_\text{lin}}
# + t_\text{exposed} .
# $$
#
# For $e_\text{lin}$ take the best matmul rate reported on a v6e: 728 TFLOP/s, about 79% of peak (gpu-tpu-pedia
# `tpu/v7_perf/tpu_v7_benchmark_report.md`, single source, unverified). Inverting the model for each measured time,
# with nothing exposed, gives the *least* attention efficiency that explains it; any exposed time means the kernel
# was faster than that.

# %%
N, PEAK = 8, V6E.peak_bf16_flops
E_LIN = 728e12 / PEAK  # best v6e matmul rate reported (gpu-tpu-pedia, unverified)
t_lin = F720["linear"] / (N * PEAK * E_LIN)


def step_time(e_attn, exposed=0.0, e_lin=E_LIN, flops=F720):
    return flops["attention"] / (N * PEAK * e_attn) + flops["linear"] / (N * PEAK * e_lin) + exposed


def attention_efficiency(seconds, exposed=0.0, e_lin=E_LIN, flops=F720):
    return flops["attention"] / (N * PEAK * (seconds - flops["linear"] / (N * PEAK * e_lin) - exposed))


# plain TP on tensor=8, the mesh of the cited runs
tp_allreduce = bounds(P720, 720, 1280, 121, "v6e", 8, "tp", mesh_shape={"tensor": 8})["interconnect_s"]
ulysses_a2a = bounds(P720, 720, 1280, 121, "v6e", 8, "replicated")["interconnect_s"]
print(f"e_lin = {E_LIN:.1%}: the linear layers take at least {t_lin:.3f} s of a step")
rows = [{"case": f"measured {c['seconds']} s ({c['label']})", "exposed s": 0,
         "attention efficiency": f"{attention_efficiency(c['seconds']):.1%}"}
        for c in CITED_STEP_TIMES if c["chip"] == "v6e"]
for label, exposed in (("nothing exposed", 0.0), ("Ulysses all-to-all bound exposed", ulysses_a2a),
                       ("plain-TP all-reduce bound exposed", tp_allreduce)):
    rows.append({"case": f"target {T_TARGET:.2f} s, {label}", "exposed s": round(exposed, 3),
                 "attention efficiency": f"{attention_efficiency(T_TARGET, exposed):.1%}"})
html_table(rows)

# %% [markdown]
# So the road to 50% is, to first order, the road to an attention kernel at about half of peak, from the 20–28%
# that the measured times imply. Published kernel anchors for scale (other shapes, other chips):
#
# | Kernel | Fraction of peak | Hardware, shape | Source |
# |---|---|---|---|
# | Splash attention (stock) | ≈36% (a 15.97 ms roofline over 43.93 ms; the guide says about 37%) | v6e, Wan 720p, 5 heads per chip | gpu-tpu-pedia `tpu/Wan2.2/docs/wan_tpu_optimization_guide.md` (unverified) |
# | FlashAttention-2, forward | ≈37% (370 TFLOP/s) | H100 SXM5, head dim 128, non-causal | flash-attention `assets/flash3_fp16_fwd.png` |
# | FlashAttention-3, fp16 forward | ≈65% (646–648 TFLOP/s) | same | same |
# | cuDNN fused attention, forward | ≈60% (595–600 TFLOP/s) | same | same |
# | PyTorch SDPA on each sample's valid tokens, cuDNN's kernel on Hopper (measured here) | 56.4% (557.7 TFLOP/s) | one H200, this model's 720p/121f attention, head dim 128 | `benchmarks/results/gpu_check_2026-11-26_H200_run2.json` (printed in the measured section above) |
# | torch's varlen FlashAttention-2 (`torch_varlen`, measured here) | 35.3% (348.7 TFLOP/s) | same | same |
# | maxdiffusion fixed-max ring hop | "91% of the K=128 MXU roofline" (roofline not defined) | v7x | maxdiffusion commit `8dd63054` (unverified) |
#
# The same optimisation guide attributes about a third of the Splash kernel's time on v6e to the softmax on the vector
# unit ({term}`VPU`), and notes that head dimension 128 fills half of the 256-wide {term}`MXU`. Those are the attention levers on TPU:
# a cheaper exponential (exp2: gpu-tpu-pedia went from 7.29 to 5.81 s/step with it, together with a larger query
# block, 2048 → 3072, in the same commit, so the two effects are not separated), a fixed softmax maximum that
# removes the running-max rescale (maxdiffusion's fixed-m kernels), and block sizes tuned to the shape. The curve
# below is the model above: step time against attention efficiency.

# %%
e = np.linspace(0.15, 0.8, 200)
fig, ax = plt.subplots(figsize=(7.5, 3.6))
ax.plot(e * 100, [step_time(v) for v in e], color="C0", label="nothing exposed")
ax.plot(e * 100, [step_time(v, tp_allreduce) for v in e], color="C3",
        label=f"+ plain-TP all-reduce bound ({tp_allreduce:.2f} s)")
ax.axhline(T_TARGET, color="k", ls="--", lw=1, label=f"{TARGET_MFU:.0%} MFU ({T_TARGET:.2f} s)")
for c in CITED_STEP_TIMES:
    if c["chip"] == "v6e":
        ax.plot(attention_efficiency(c["seconds"]) * 100, c["seconds"], "o", color="C0")
        ax.annotate(f"{c['seconds']} s", (attention_efficiency(c["seconds"]) * 100, c["seconds"]),
                    textcoords="offset points", xytext=(6, 2), fontsize=8)
ax.set_xlabel("attention kernel efficiency on v6e (% of bf16 peak)")
ax.set_ylabel("s per CFG step, 8 x v6e")
ax.set_ylim(0, 10)
ax.legend(frameon=False, fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# ### Communication and layout
#
# The curve's second line is what exposed collectives cost. The planner's per-device traffic for the layouts an
# 8-chip v6e slice can use (720p, 121 frames, bf16; TPU rows from `device_plan`, with the memory total and
# the collectives' result bytes from the saved compiler report wherever the layout was compiled), with the memory
# each needs:

# %%
ICI_SEND = V6E.interconnect_bandwidth / 2  # bytes/s a chip can send: half the bidirectional figure
layouts = [
    ("tp", {"tensor": 8}, "--runtime jax --mesh tensor=8 --sharding tp"),
    ("tp", {"data": 2, "tensor": 4}, "--runtime jax --mesh data=2,tensor=4 --sharding tp"),
    ("tp_replicated_out", {"data": 2, "tensor": 4}, "--runtime jax --mesh data=2,tensor=4 (the default rule set)"),
    ("tp", {"sequence": 2, "tensor": 4}, "--runtime jax --mesh sequence=2,tensor=4 --sharding tp"),
    ("fsdp", {"data": 2, "sequence": 4}, "--runtime jax --mesh data=2,sequence=4 --sharding fsdp"),
    ("ulysses", {"sequence": 8}, "the GPU layout: torchrun ... --runtime ulysses"),
]
rows, sent_by = [], {}
for rules, mesh, flags in layouts:
    name = f"{rules} {','.join(f'{k}={v}' for k, v in mesh.items())}"
    if rules == "ulysses":
        sent = collective_bytes(P720, 720, 1280, 121, strategy="ulysses", mesh_shape=mesh)["bytes_per_device"]
        weights = param_bytes(P720, "bf16", "replicated")["bytes_per_device"]
        total = weights + activation_bytes(P720, 720, 1280, 121, mesh_shape=mesh)["bytes_per_device"]
        source, results, compiled = "planner", None, None
    else:
        plan = device_plan(P720, 720, 1280, 121, mesh, rules, topology="v6e:2x4")
        sent, weights, total = plan["sent_bytes"], plan["per_device_bytes"]["weights"], plan["memory_total"]
        source, results = plan["memory_source"], plan["collective_total"]
        compiled = sum(c["bytes"] for c in plan["compiled"]["collectives"]) if plan["compiled"] else None
    sent_by[name] = sent
    rows.append({"rules": rules, "mesh": ",".join(f"{k}={v}" for k, v in mesh.items()),
                 "weights GiB/device": round(weights / GIB, 1), "total GiB/device": round(total / GIB, 1),
                 "memory from": source, "fits 32 GiB": total <= V6E.hbm_bytes,
                 "collective results GiB, planner": "n/a" if results is None else round(results / GIB, 2),
                 "same, compiled HLO": "not compiled" if compiled is None else round(compiled / GIB, 2),
                 "GiB sent/device/step": round(sent / GIB, 1),
                 "ICI bound s": round(sent / ICI_SEND, 3), "share of target": f"{sent / ICI_SEND / T_TARGET:.1%}",
                 "how to run it": flags})
display(html_table(rows))
tp8 = sent_by["tp tensor=8"]
print(f"bytes sent vs tp on tensor=8: data=2,tensor=4 {1 - sent_by['tp data=2,tensor=4'] / tp8:.0%} less; "
      f"tp_replicated_out on it another {1 - sent_by['tp_replicated_out data=2,tensor=4'] / sent_by['tp data=2,tensor=4']:.0%} "
      "less; " + ", ".join(f"{n.split()[0]} {tp8 / sent_by[n]:.1f}x less" for n in ("tp_replicated_out data=2,tensor=4",
                                                                              "fsdp data=2,sequence=4",
                                                                              "ulysses sequence=8")))
saved = device_plan(P720, 720, 1280, 121, {"tensor": 8}, "tp")["sent_bytes"] - device_plan(
    P720, 720, 1280, 121, {"tensor": 8}, "tp_replicated_out")["sent_bytes"]
t_tp = next(c["seconds"] for c in CITED_STEP_TIMES if c["rules"] == "tp")
print(f"on tensor=8, tp_replicated_out sends {saved / GIB:.0f} GiB less per chip and step than tp: at most "
      f"{saved / ICI_SEND:.2f} s at the ICI's peak, against the {t_tp - t_base:.2f} s ({t_tp} -> {t_base} s) "
      "gpu-tpu-pedia measured")

# %% [markdown]
# Where a layout was compiled, the planner's collective bytes and the compiler's HLO agree to within rounding
# (the two collective columns). Plain tensor parallelism on `tensor=8` sends the most: two all-reduces of the full
# activations per block and stream, on both CFG samples. Putting the CFG pair on a `data` axis (one sample per
# device) cuts that by more than half, and `tp_replicated_out` cuts about another quarter by turning half of the
# all-reduces into all-gathers of the same size, at the cost of more weights per device (the weights column). A
# `sequence` axis under `tp` adds its all-to-alls to the all-reduces rather than replacing them. FSDP on a
# `data=2,sequence=4` mesh gathers every block's weights whole once per step and adds the sequence axis'
# all-to-alls, yet sends less than any tensor-parallel layout and holds the least memory; Ulysses on
# GPUs, which moves only the attention inputs and outputs, sends the least of all. gpu-tpu-pedia's measured gain
# from replicating the row-parallel weights is several times the planner's bound for the bytes that change saves
# (the last line above): either its collectives ran well below link peak and were not hidden, or the change helped
# in some other way; the bytes alone do not explain it. gpu-tpu-pedia also reports that on CogVideoX, `dp2 x tp4`
# ran 1.58x faster than `tp8` on a v6e-8 (`tpu/CogVideoX/README.md`, unverified), the same effect on a smaller
# model. Communication is the second lever: at link peak it need not take
# more than a few percent of the step, if the layout is chosen for it.

# %% [markdown]
# ### Doing less work: the CFG-distilled checkpoints, padding and DeepCache
#
# Three levers lower the FLOPs executed instead of raising the rate.
#
# **CFG-distilled checkpoints** are the largest. Every step above is a CFG step: the DiT runs the negative and the
# positive prompt as a batch of 2 and mixes the two predictions with guidance 6. HunyuanVideo-1.5 also ships
# checkpoints distilled to produce the guided prediction in one pass, run with guidance 1 ("CFG off"): the official
# README lists `480p_t2v_distilled`, `480p_i2v_distilled` and `720p_i2v_distilled` (the 720p text-to-video one is
# "coming soon"), each at its base model's flow shift and 50 steps, and its `--cfg_distilled` flag promises "~2x
# speedup" (Tencent-Hunyuan/HunyuanVideo-1.5 `README.md`, "Optimal Inference Configurations" and "Command Line
# Arguments"). `hyv_lib` has presets for the three (`hyv_lib.get_preset("480p_t2v_distilled")` and so on, hub ids
# `hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-<name>`): the same 8.3B DiT, one sample per step. The planner
# counts a step at each preset's own batch, so the distilled step is exactly half its base model's, and a v6e-8
# puts all eight chips on `tensor`, because with one sample there is nothing for a `data` axis to split:

# %%
rows = []
for name, base in (("480p_t2v_distilled", "480p_t2v"), ("480p_i2v_distilled", "480p_i2v"),
                   ("720p_i2v_distilled", "720p_i2v")):
    p, q = hyv_lib.get_preset(name), hyv_lib.get_preset(base)
    size = (p.default_height, p.default_width, FRAMES)
    one, pair, b = step_flops(p, *size), step_flops(q, *size), bounds(p, *size, "v6e", 8)
    rows.append({"preset": name, "W x H x frames": f"{size[1]}x{size[0]}x{FRAMES}", "guidance": p.guidance_scale,
                 "samples per step": p.samples_per_step, "steps": p.default_steps,
                 "PFLOP per step": round(one["total"] / 1e15, 2),
                 "base model (CFG pair) PFLOP": round(pair["total"] / 1e15, 2),
                 "distilled / base": f"{one['total'] / pair['total']:.3f}",
                 "v6e-8 default mesh": layout_label(b["mesh"]), "compute bound s/step": round(b["compute_s"], 2)})
display(html_table(rows))
try:
    device_plan("720p_i2v_distilled", 720, 1280, FRAMES, "data=2,tensor=4")
except hyv_lib.HyvInputError as err:
    print(f"device_plan('720p_i2v_distilled', ..., 'data=2,tensor=4') -> {err.argument}: {err.message}")

# %% [markdown]
# Half the FLOPs per step at the same MFU is half the time per video, 2x: more than the 1.69x that the road to 50%
# MFU above asks of the attention kernel from the exp2 run, and available today, at the price of whatever quality the
# distillation costs (the README offers the checkpoints for speed; this chapter measures no quality). Two caveats. The step's model count $C$ halves too, so MFU is computed on the
# halved count: the chips do not work harder, they do half the work. And one sample per step halves the rows of every
# matmul on each chip, which may lower the rate a chip reaches; no one has measured it on a TPU.
#
# **Padding.** The joint sequence carries all 1985 context tokens, padding included: for text-to-video the 729
# image tokens are all masked, and a short prompt fills a fraction of the 1000 text slots. Splash with segment
# ids, like the dense reference, computes the padded positions; a kernel that skipped them would do less:

# %%
rows = []
for label, kwargs in (("all 1985 context tokens (Splash with segment ids)", {}),
                      ("120 valid context tokens (short prompt, no quoted text, t2v)", {"valid_context": 120}),
                      ("keys padded to a multiple of 2048 (a Splash KV block)", {"kv_block": 2048})):
    f = step_flops(P720, 720, 1280, 121, **kwargs)
    rows.append({"attention counted over": label, "attended tokens": f"{f['tokens']['attended']:,}",
                 "attention PFLOP": round(f["attention"] / 1e15, 3),
                 "vs all context": f"{f['attention'] / F720['attention'] - 1:+.1%}"})
html_table(rows)

# %% [markdown]
# A few percent either way: worth having in a kernel, not a road to 50%.
#
# **DeepCache** (see {doc}`04_deepcache`) runs 25 full and 25 cached steps with the 11/45/4 schedule, so it executes
# about half the FLOPs. Its measured speed-ups fall short of that ratio. Solving
# $t_\text{avg} = t_\text{full}\,(25 + 25c)/50$ for the cost $c$ of a cached step relative to a full one:

# %%
full, cached = len(schedule.full_steps), 50 - len(schedule.full_steps)
rows, c_cost = [], {}
for chip, d in DEEPCACHE.items():  # each cached run against its own document's uncached run
    t_full, t_cached = d["before_s"] / d["steps"], d["after_s"] / d["steps"]
    speedup = t_full / t_cached
    c = (50 / speedup - full) / cached
    c_cost[chip] = c
    rows.append({"system": f"{d['n_chips']} x {chip}", "full s/step": round(t_full, 2),
                 "cached avg s/step": round(t_cached, 2), "speed-up": f"{speedup:.2f}x", "bound": f"{skip_ratio:.2f}x",
                 "cached step / full step": f"{c:.3f}", "in FLOPs": f"{1 / 54:.3f}",
                 "s per cached step": round(c * t_full, 2), "source": d["source"]})
display(html_table(rows))
print(f"measured here (one H200, 480p, hyv_lib's TorchDeepCache): a cached step is {cache['cached_over_full']:.4f} "
      f"of a full step ({cache['cached_step_s']} s against {cache['full_step_s']} s); one block of 54 is {1 / 54:.4f}")

# %% [markdown]
# A cached step runs one block of 54, yet costs 5–9 times its FLOP share in these cited runs. The rest is overhead
# around the block: in gpu-tpu-pedia's GPU version the cached block outputs are parked in host memory and copied
# back; its TPU version switches between two compiled programs from Python and synchronises on every cached step.
# That overhead is a lever of its own, and not a cost of the method: `hyv_lib`'s cached step, which keeps the cached
# tokens on the GPU, cost about its FLOP share on the H200 (the last line above; measured at 480p, not 720p).
#
# Padding and DeepCache shorten the step without raising real MFU: the model count $C$ stays what it was, and less
# of it runs.
#
# **Not run by `hyv_lib` yet: super-resolution and sparse attention.** The official pipeline has two more stages
# that change the cost of a video; `hyv_lib` runs neither (nor does diffusers), so they appear here as cited facts
# and planner arithmetic only.
#
# - **The super-resolution stage (SR)** upsamples the generated latents and refines them with a second,
#   step-distilled DiT: `720p_sr_distilled` takes 480p to 720p in 6 steps and `1080p_sr_distilled` takes 720p to
#   1080p in 8 steps, both at guidance 1 (one sample per step) and flow shift 2 (README, "Optimal Inference
#   Configurations"; `generate.py` runs it by default, `--sr true`). The official code upsamples the low-resolution
#   latents with a latent upsampler, adds noise, and feeds them to the SR DiT as extra condition channels; a 16:9
#   720p video goes to 1904 x 1072 pixels (`hyvideo/pipelines/hunyuan_video_sr_pipeline.py`). Its cost is a short
#   loop at a much longer sequence. The SR DiT's width and depth are not in our reference notes; if they are the base
#   model's, the planner counts:

# %%
sr = step_flops(P720, 1072, 1904, 121, batch=1)  # the base DiT's shape at the SR output size, one sample
base_loop = 50 * F720["total"]
print(f"1080p SR step (1904 x 1072, 121 frames, one sample): {sr['tokens']['video']:,} video tokens, "
      f"{sr['total'] / 1e15:.1f} PFLOP ({sr['attention_share']:.0%} attention); 8 steps = {8 * sr['total'] / 1e15:.0f} "
      f"PFLOP, {8 * sr['total'] / base_loop:.0%} of the 720p loop's 50 CFG steps ({base_loop / 1e15:.0f} PFLOP)")

# %% [markdown]
# - **Sparse attention (SSTA, selective and sliding tile attention)** replaces dense attention with a block-sparse
#   one: the keys of each query tile are a sliding window of neighbouring 3D tiles plus the top-k most important
#   other tiles, chosen from the data (`ssta_attention.py` in the official `hyvideo` package, on the
#   `flex_block_attn` kernels). The README reports "an end-to-end speedup of 1.87x in 10-second 720p video synthesis
#   compared to FlashAttention-3" and gives `--sparse_attn` as "~1.5-2x speedup, requires H-series GPUs, auto-enables
#   CFG distilled"; its weights are released for 720p image-to-video only (`720p_i2v_distilled_sparse`). It needs
#   the model trained for it and a kernel that skips the unselected blocks; on a TPU that would be a block-sparse
#   Splash mask, which `hyv_lib` does not build.
#
# ### Putting it together
#
# The rows below combine the levers in the model above. Only the first row is a measurement; the others are
# predictions of the model, built from the numbers derived in this chapter, and no one has measured them. In
# particular, DeepCache was measured with the stock kernel, not with the exp2 kernel. *Effective* MFU credits the
# cached steps with the full-step FLOPs; *real* MFU counts what ran.

# %%
t_exp2 = EXP2["seconds"]
e_now = attention_efficiency(t_exp2)
c_tpu = c_cost["v6e"]
softmax_share = 1 / 3  # of the Splash kernel's time on v6e (gpu-tpu-pedia Wan guide, unverified)


def cached_avg(t_full, c):
    return t_full * (full + cached * c) / 50


paths = [
    ("exp2 Splash kernel, measured", e_now, t_exp2, 1.0),
    ("softmax fully hidden behind the MXU", e_now / (1 - softmax_share), None, 1.0),
    ("attention kernel at the 50% requirement", attention_efficiency(T_TARGET), None, 1.0),
    ("exp2 kernel + DeepCache, measured cached-step cost", e_now, cached_avg(t_exp2, c_tpu), skip_ratio),
    ("exp2 kernel + DeepCache, cached step at its FLOP cost", e_now, cached_avg(t_exp2, 1 / 54), skip_ratio),
]
rows = []
for label, e_attn, seconds, flop_ratio in paths:
    seconds = seconds if seconds is not None else step_time(e_attn)
    utilization = mfu(F720["total"], seconds, "v6e", 8)
    rows.append({"path (8 x v6e, 720p, 121 f)": label, "attention efficiency": f"{e_attn:.1%}",
                 "s/step": round(seconds, 2), "effective MFU": f"{utilization:.1%}", "real MFU": f"{utilization / flop_ratio:.1%}",
                 "50 steps, s": round(50 * seconds)})
html_table(rows)

# %% [markdown]
# Read the table as a budget, not a forecast:
#
# - **Attention kernel efficiency is the lever.** Attention is nine tenths of the FLOPs; 50% MFU needs the kernel at
#   about half of peak (about 1.7 times the rate the exp2 run implies), with the linear layers near the best
#   measured matmul rate and the collectives hidden. Hiding the softmax alone, if the guide's one-third share holds,
#   gets most of the way there.
# - **Layout keeps communication out of the way.** Plain TP's all-reduces on `tensor=8` would eat an eighth of the
#   3.4 s budget even at link peak; the default `tp_replicated_out` on `data=2,tensor=4`, FSDP and Ulysses send
#   about 3 to 8 times less (the line under the communication table).
# - **DeepCache reaches the wall time, not the MFU.** On today's kernel it predicts about the 50% step time in
#   effective terms, at unchanged or lower real MFU and with a quality cost ({doc}`04_deepcache`). It multiplies
#   with every other lever, and removing the cached-step overhead adds to it.
# - Not counted here: lower precision. fp8 or int8 attention (SageAttention on 8×H100: 3.25 s/step, visibly lossy,
#   gpu-tpu-pedia) changes the numerics and the peak that MFU is measured against.

# %% [markdown]
# ## Summary
#
# - One CFG step at 720p and 121 frames is about 12.65 PFLOP (480p: about 2.9), and 90% of it is attention
#   (81% at 480p); by hand, $4LBS^2d$ for attention plus 2 FLOPs per token for each weight of its own stream. The
#   attention-to-linear ratio of a block is $S/(6d)$. At the peak of eight v6e chips the step takes at least 1.72 s.
# - The step is compute-bound on every chip considered, but on the TPUs only a few times past the HBM ridge: the
#   attention kernel re-reads $k$ and $v$ once per query block, so its intensity is about $\text{block}_q$ FLOP per
#   byte in bf16 and the query block is a lever on its memory traffic. The time is decided by how close the matrix
#   units run to peak.
# - The TPU compiler runs on a CPU for a named slice: compiling the real step with abstract bf16 weights gives
#   per-device memory and the collectives in the HLO. It shows what `tp_replicated_out` does: half of `tp`'s
#   all-reduces become all-gathers of the same size (a quarter fewer bytes on the wire), and every device holds the
#   replicated weights whole.
# - gpu-tpu-pedia's published runs (single author; its documents label the TPU runs both v4-8 and v6e-8, and the
#   times rule out v4) sit at about 21–30% MFU on a v6e-8 and about 31% on 8×H100; their DeepCache runs look like
#   42–56% *effective* MFU, but real MFU falls. maxdiffusion's Wan2.2 on v7x-8 reaches about 54%.
# - Measured here, on one H200 with random weights (`benchmarks/results/`): `hyv_lib`'s CFG step takes 6.061 s at
#   480p and 24.725 s at 720p, 48.1% and 51.7% MFU, with peaks of 20.25 and 26.02 GiB; diffusers' stock forward
#   takes 2.89x and 3.41x as long and peaks at 117.13 GiB at 720p. SDPA on each sample's valid tokens runs the 720p
#   attention at 56.4% of peak, 1.6x faster than `torch_varlen`, and a DeepCache cached step costs about its FLOP
#   share. No `hyv_lib` step has been timed on several GPUs, on an H100 or on a TPU.
# - 50% MFU on a v6e-8 is about 3.4 s per step. The main lever is the attention kernel (about half of peak
#   needed, against about 28% implied today); the layout should keep collectives to a few percent; DeepCache and
#   skipping padding cut FLOPs, shortening the step without raising real MFU.
# - The largest single lever is doing less work: the CFG-distilled checkpoints (`480p_t2v_distilled`, `480p_i2v_distilled`,
#   `720p_i2v_distilled`) run one sample per step instead of the CFG pair, exactly half the FLOPs, and leave a
#   `data` axis nothing to split. The official super-resolution stage and sparse attention (SSTA) change the cost
#   of a video too; `hyv_lib` runs neither yet.
# - A profile of one step of the TPU runtime's program, here on the CPU backend at hyv-tiny's sizes with attention
#   about as large a share of the counted FLOPs as at 720p, splits the step's time by HLO op: each kind of matmul
#   takes its FLOPs at a rate of its own, and the attention's softmax and mask, which the FLOP count leaves out,
#   take a large share besides. On a TPU, Splash holds them inside one custom call; `jax.profiler.trace` around one
#   warmed-up step and XProf's trace viewer, HLO Op Stats and HLO Op Profile show where that time goes.
#
# ## Exercises
#
# Marked ★ (easy) to ★★★ (hard), and *open* where no one has the answer yet ({ref}`notation-exercises`).
#
# 1. ★ Attention equals the linear layers in FLOPs when $S = 6d$. How many latent frames of 720p video is that, and
#    what video length in frames?
# 2. ★ What real MFU corresponds to DeepCache's 2.84 s/step on 8×H100? Why does it fall below the 5.2 s/step run's?
# 3. ★★ If HunyuanVideo-1.5 ran on a v7x-8 (4 chips) at the 54% MFU that maxdiffusion reached for Wan2.2, what would
#    one 720p, 121-frame CFG step take? What does the planner say about its memory?
# 4. ★★ The planner counts the 729 image tokens of text-to-video in the attention. A kernel that skips them (and the
#    padded text slots) saves what fraction of a step? Compare it with the 1.69x needed from 5.81 s/step.
# 5. ★★★ On the v6e-8 mesh `data=2,tensor=4`, how many more bytes of weights does each device hold under
#    `tp_replicated_out` than under `tp`? Derive it from the replicated matrices, then compare with the compiler's
#    arguments in the saved reports.
# 6. ★★ Double the video to 241 frames at 720p. How many tokens and PFLOP is one CFG step, by what factor does the
#    attention grow, and how long would the step take on a v6e-8 at the 29.6% MFU of the exp2 run?
# 7. ★★★ *Open.* Where do the 7.29 s of the stock-Splash step on a v6e-8 go? The model above can only say what
#    attention efficiency would explain the time if nothing else were exposed; a profile of one real step would
#    split it into the Splash kernel, the linear layers, collectives that do not overlap compute, and host time.
#    No such profile of this model has been published, and `hyv_lib` has not run on a TPU.
# 8. ★ In the profile's top-ops table every attention op ran the same number of times per step. Which number, and
#    where does it come from? How many times would each of them run per step at 720p, 121 frames, with the same
#    kernel?
# 9. ★★ Profile the same step with `JaxTransformer(profile_model, attention_options={"block_kv": 256})`. Predict the
#    `runs/step` of the attention ops, how many keys the kernel computes (padding included) against 512-key blocks,
#    and the `result` shape of the $QK^\top$ op; then measure whether the attention's time changes. What is the TPU
#    counterpart of this knob?
#
# :::{admonition} Answers
# :class: dropdown
# 1. $6d = 12{,}288$ tokens. The context adds 1985, so the video needs $12{,}288 - 1985 = 10{,}303$ tokens; one 720p
#    latent frame is $45 \times 80 = 3600$ tokens, so about 2.9 latent frames. Video length $F$ gives $(F-1)/4+1$
#    latent frames: 5 frames (2 latent) stay below the crossover, 9 frames (3 latent) are just above it. Every useful
#    720p clip is attention-dominated. Check with `step_flops(P720, 720, 1280, 5)["attention_share"]` and
#    `(..., 9)`.
# 2. Effective MFU is `mfu(F720["total"], 2.84, "H100", 8)`, about 56%; divided by the schedule's FLOP ratio
#    (`DeepCacheSchedule(50).block_speedup(54)`, 1.96), the real MFU is about 29%, below the uncached run's 31%. The
#    speed-up (1.83x) is smaller than the FLOP ratio (1.96x), because each cached step costs about 0.09 of a full step
#    instead of 1/54: the cached blocks' outputs travel through host memory, and the step has fixed costs that do not
#    shrink with the work.
# 3. `F720["total"] / (0.54 * 4 * CHIPS["v7x"].peak_bf16_flops)` is about 2.5 s per step, about 127 s for 50
#    steps. With 192 GiB per chip, even fully replicated weights (15.5 GiB) fit: `bounds(P720, 720, 1280, 121,
#    "v7x", 4, "replicated")["fits"]`. The interconnect bound is empty, because the planner has no sourced TPU7x ICI
#    bandwidth. Note that the 4 chips show up as 8 JAX devices, so a mesh would have 8 devices.
# 4. `step_flops(P720, 720, 1280, 121, valid_context=120)` counts 3.3% less attention, which is 2.9% of the
#    step since attention is 90% of it. That is worth a kernel feature (with valid-first ordering the padding is one
#    contiguous tail that a block-sparse kernel can skip), but a 1.69x speed-up must remove $1 - 1/1.69 = 41\%$ of
#    the step's time, about fourteen times more.
# 5. The replicated matrices are, per block, `to_out.0` and `to_add_out` ($d \times d$ each) and the two MLPs' second
#    linears ($d \times 4d$ each): $2d^2 + 8d^2 = 10d^2 \approx 41.9$ M parameters, or $54 \times 41.9\,\text{M}
#    \approx 2.26$ billion, 4.22 GiB in bf16. Under `tp` a device holds a quarter of them (tensor = 4), under
#    `tp_replicated_out` all of them: $\tfrac34 \times 4.22 \approx 3.16$ GiB more per device.
#    `param_bytes(P720, "bf16", "tp_replicated_out", {"data": 2, "tensor": 4})["bytes_per_device"]` minus the
#    same for `"tp"` gives 3.16 GiB. The compiler's arguments (weights plus inputs) differ by 3.13 GiB
#    (`COMPILED["v6e-8/tp_replicated_out/720p/uncached"]["per_device_bytes"]["arguments"]` minus the `tp` one): the
#    30 MiB less is the last block's `to_add_out` and `ff_context.net.2`, whose output nothing reads, so `jax.jit`
#    drops them.
# 6. $(241-1)/4+1 = 61$ latent frames, $61 \times 3600 = 219{,}600$ video tokens, $S = 221{,}585$. Attention grows by
#    $(221{,}585 / 113{,}585)^2 \approx 3.81$ (to 43.4 PFLOP), the linear layers only by $221{,}585/113{,}585 \approx
#    1.95$; `step_flops(P720, 720, 1280, 241)` gives 45.85 PFLOP in total, 94.7% of it attention. At 29.6% of
#    8 x 918 TFLOP/s (2.18 PFLOP/s) that is about 21.1 s per step, 3.6 times the 5.81 s of 121 frames for twice the
#    frames: attention's quadratic cost makes long videos disproportionately expensive.
# 7. *Where to start.* On a v6e-8 with the real weights, run `python -m hyv_lib stage2 --runtime jax --warmup_steps 2` for a few steps
#    with `jax.profiler.trace` around one step, open the trace in TensorBoard's profile plugin or Perfetto, and sum the
#    device time per operation kind: the Splash custom calls, the fusions around the matmuls, and each all-reduce or
#    all-gather (and whether it runs beside compute or alone). Compare the Splash total with this chapter's
#    `attention_efficiency` line, and the exposed collectives with the interconnect bounds of the communication table;
#    then repeat on `data=2,tensor=4` to see what the default layout changes.
# 8. 7, the number of key blocks printed under the table: `kv_block_layout(3500, 512)` cuts the 3,500 keys into 7
#    blocks of 504, and the XLA kernel's `lax.scan` over those blocks compiles to a `while` loop whose body holds the
#    attention's ops (their `JAX op` column starts with `while/body`). At 720p, `kv_block_layout(113585, 512)` gives 222
#    blocks of 512 keys, so each would run 222 times per step. On a TPU the step would use Splash instead, whose loop over
#    blocks runs inside one kernel: the profile shows one op per block, not its iterations.
# 9. `kv_block_layout(3500, 256)` gives 14 blocks of 256 keys: 14 runs per step, $14 \cdot 256 = 3{,}584$ keys computed
#    against $7 \cdot 504 = 3{,}528$ (84 padded keys instead of 28, 1.6% more attention work), and a score tile of
#    `f32[2,2,3500,256]` instead of `f32[2,2,3500,504]`. The time is for the measurement to say: each run does half the
#    work, and the softmax's elementwise passes go over a tile half the size, which may fit the CPU's caches better.
#    `hyv_lib/kernels/xla.py` records 512 as the fastest of 256 to 2,048 at head dimension 128 and $S \approx 4$k on a
#    2-core CPU; at this model's head dimension of 32 the best block can differ, which is why such a default is
#    measured, not derived. On a TPU the counterpart is Splash's block sizes: the key block, and the query block
#    ({term}`block_q`) whose size sets how often $k$ and $v$ are read again from HBM (the roofline section).
# :::
