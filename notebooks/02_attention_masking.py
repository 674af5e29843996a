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
# # 2. Attention masking: exact, without an S×S mask
#
# Every block of HunyuanVideo-1.5's {term}`DiT` runs *joint* attention over one long sequence: the video tokens,
# then the {term}`context tokens` (image, {term}`ByT5` and text embeddings). Most context tokens are padding, and attention has to ignore
# them: a valid query may attend to valid keys only, and a padded query's output does not matter.
#
# :::{figure} ../book/figures/02_joint_sequence_mask.svg
# :name: fig-02-joint-sequence-mask
# The joint sequence of one sample at 720p and 121 frames, before and after the valid-first reorder, and the mask
# it needs. Valid queries see the valid prefix; padded keys get $-\infty$ (weight exactly 0); padded query rows
# are set to 0. A `[B, S]` key-padding vector (or one valid length per sample) describes all of it; the dense
# `[B, 1, S, S]` mask that diffusers builds stores the same information in $S$ times more bytes.
# :::
#
# This chapter does three things:
#
# 1. It shows where the padding comes from, and what the obvious ways of ignoring it cost: a dense mask of
#    many gigabytes, NaN on JAX, or a small bias that never goes away.
# 2. It derives three exact alternatives: key-padding masks, packed {term}`varlen` sequences, and {term}`Splash`
#    {term}`segment ids`.
# 3. It runs them all through `hyv_lib.kernels.dispatch` and checks each against diffusers' own forward (the
#    {term}`oracle`), including the real TPU Splash kernel in {term}`Pallas` interpret mode.
#
# Symbols follow the {doc}`../book/notation` page: $B$ samples, $S = N_v + N_c$ joint tokens, $n_h$ heads of
# dimension $D$; $h \times w$ is the latent size (pixels are $H \times W$).

# %% tags=["parameters"]
import os

PRESET = os.environ.get("HYV_PRESET", "tiny_trained")   # tiny_trained | tiny | 480p_t2v | 720p_t2v
MODEL_PATH = os.environ.get("HYV_MODEL_PATH") or None  # diffusers folder / hub id for real presets
OUTPUT_DIR = os.environ.get("HYV_OUTPUT_DIR", "stage_outputs/attention")
# Latent size of the model-level checks: small on purpose, even for real weights.
LATENT_FRAMES, LATENT_H, LATENT_W = 2, 6, 10
from hyv_lib.notebook.display import settings_not_used  # noqa: E402

_ = settings_not_used({
    "HYV_RUNTIME": "the backends are called directly (the JAX ones through torchax)",
    "HYV_MESH": "one device", "HYV_ATTENTION": "every backend is measured in turn",
    "HYV_HEIGHT": "the model checks run at the small latent size above; the memory figures cover 720p by formula",
    "HYV_WIDTH": "see HYV_HEIGHT", "HYV_VIDEO_LENGTH": "see HYV_HEIGHT", "HYV_STEPS": "single forwards, no loop",
})

# %%
import time
import warnings

warnings.filterwarnings("ignore", message="IProgress not found")  # tqdm.auto without ipywidgets

import matplotlib.pyplot as plt
import numpy as np
import torch

import hyv_lib
from hyv_lib.kernels.dispatch import attention
from hyv_lib.models.hunyuan_video15 import layout
from hyv_lib.models.hunyuan_video15.processors import use_attention
from hyv_lib.notebook.display import html_table, token_layout_figure
from hyv_lib.models.hunyuan_video15.sampling import prepare_conditioning
from hyv_lib.pipeline.stages import stage1

preset = hyv_lib.get_preset(PRESET)
real = hyv_lib.get_preset("720p_t2v")

# %% [markdown]
# ## Where the padding comes from
#
# The context has a fixed length, so that every prompt gives the same shapes: `image_tokens` SigLIP tokens,
# `byt5_len` ByT5 tokens and `text_len` Qwen2.5-VL tokens. For the real model that is 729 + 256 + 1000:

# %%
html_table([{"preset": p.name, "image": p.image_tokens, "ByT5": p.byt5_len, "text": p.text_len,
             "context": layout.context_tokens(p)} for p in (preset, real)])

# %% [markdown]
# Only some of those tokens are valid:
#
# - A text-to-video run has no image, so all image tokens are padding. (The model detects this because the
#   image embeddings are all zero.)
# - ByT5 only sees text in quotes, so without quotes every ByT5 token is padding.
# - The text mask covers the prompt plus a few template tokens.
#
# Let us encode a prompt with quoted text and a negative prompt without. How many slots stay padding depends on the
# preset's tokenizer and slot counts: hyv-tiny has only 24 text slots, so even this short prompt fills most of
# them, while the real Qwen2.5-VL tokenizer would leave most of the 1000 slots padding:

# %%
from hyv_lib.models.components import quiet_loading

with quiet_loading():  # no weight-loading progress bars
    embeds = stage1(preset=PRESET, model_path=MODEL_PATH, output_dir=OUTPUT_DIR,
                    prompt='a red square "OPEN"',  # short: hyv-tiny's text_len is 24
                    negative_prompt="blurry")
for name in ("prompt_embeds_mask", "prompt_embeds_mask_2",
             "negative_prompt_embeds_mask", "negative_prompt_embeds_mask_2"):
    print(f"{name:30s} {int(embeds[name].sum()):5d} valid of {embeds[name].shape[1]}")

# %% [markdown]
# Before the blocks, the model reorders each sample's context so that **valid tokens come first**
# ({term}`valid-first`):
# `[valid image, valid ByT5, valid text, invalid image, invalid ByT5, invalid text]`. diffusers does this with
# boolean indexing per sample. `hyv_lib.models.hunyuan_video15.layout.valid_first_order` does the same with a stable sort and a gather,
# which has static shapes (the torch-to-JAX chapter needs that), and a test checks it against diffusers' own
# reorder. Here is the joint sequence of the positive prompt:

# %%
image_mask = torch.zeros(1, preset.image_tokens, dtype=torch.bool)  # text-to-video: no image
text_mask, byt5_mask = embeds["prompt_embeds_mask"], embeds["prompt_embeds_mask_2"]
order, reordered = layout.valid_first_order(image_mask, byt5_mask, text_mask)
n_video = LATENT_FRAMES * LATENT_H * LATENT_W
fig = token_layout_figure(n_video, {"image": image_mask[0], "ByT5": byt5_mask[0], "text": text_mask[0]},
                          order=order[0], title=f"{PRESET}: {n_video} video tokens + context")
print("valid context tokens form a prefix:", bool(reordered[0, :int(reordered.sum())].all()))

# %% [markdown]
# After the reorder, the valid tokens of every sample form a prefix `[0, n_b)` of the joint sequence:
# the video tokens first, then the valid context. Several exact methods below rely on this.
#
# ## What a dense mask costs
#
# diffusers' processor builds the mask `valid_i & valid_j` as a `[B, 1, S, S]` boolean tensor (1 byte per
# element) in every block. With classifier-free guidance ({term}`CFG`) the batch holds the prompt and the negative
# prompt, $B = 2$. At 720p and 121 frames, written out:
#
# - Latent grid: the {term}`VAE` compresses time 4× and space 16×, so $T = (121 - 1)/4 + 1 = 31$, $h = 720/16 = 45$,
#   $w = 1280/16 = 80$. The patch size is 1×1×1, one token per latent pixel:
#   $N_v = 31 \cdot 45 \cdot 80 = 111{,}600$ video tokens.
# - Context: $N_c = 729 + 256 + 1000 = 1{,}985$ tokens, so $S = N_v + N_c = 113{,}585$.
# - Dense mask: $B \cdot S^2 = 2 \times 113{,}585^2 = 25{,}803{,}104{,}450$ bytes $\approx 24.0$ GiB for the CFG
#   batch, or about 12.0 GiB per sample.
# - Key-padding mask: $B \cdot S = 2 \times 113{,}585 = 227{,}170$ bytes $\approx 222$ KiB, a factor $S$ smaller.
#   After the valid-first reorder even that is redundant: one valid length $n_b$ per sample says the same.
#
# `hyv_lib.models.hunyuan_video15.layout` computes the same from the preset:

# %%
T, h, w = real.latent_shape(720, 1280, 121)[2:]  # latent frames, height, width
s720 = layout.joint_sequence_length(real, 720, 1280, 121)
dense = layout.dense_mask_bytes(real, 720, 1280, 121)  # B = 2 by default
print(f"latent {T} x {h} x {w} = {layout.video_tokens(real, 720, 1280, 121):,} video tokens "
      f"+ {layout.context_tokens(real):,} context = S {s720:,}")
print(f"dense [2, 1, S, S] bool: {dense:,} bytes = {dense / 2**30:.1f} GiB "
      f"({layout.dense_mask_bytes(real, 720, 1280, 121, batch=1) / 2**30:.1f} GiB per sample)")
print(f"key-padding [2, S] bool: {2 * s720:,} bytes = {2 * s720 / 2**10:.0f} KiB, {dense // (2 * s720):,}x smaller")

# %% [markdown]
# The same for shorter videos and for 480p:

# %%
rows = []
for p, (height, width) in ((hyv_lib.get_preset("480p_t2v"), (480, 848)), (real, (720, 1280))):  # pixels
    for frames in (33, 61, 121):
        s = layout.joint_sequence_length(p, height, width, frames)
        rows.append({"preset": p.name, "frames": frames, "S": f"{s:,}",
                     "[2,1,S,S] bool, GiB": round(layout.dense_mask_bytes(p, height, width, frames) / 2**30, 2)})
html_table(rows)

# %% [markdown]
# The dense mask grows with $S^2$, the key-padding vector with $S$. At 720p and 121 frames the dense mask is more
# than the 16 GiB of {term}`HBM` on a TPU v5e chip (16 GB in the Cloud TPU documentation; 16 GiB as JAX reports it),
# and it is built again in each of the 54 blocks.
#
# :::{admonition} Takeaway
# :class: tip
# At 720p/121f the dense `[2, 1, S, S]` mask is about 24 GiB for the CFG batch (12 GiB per sample), while the
# key-padding vector holding the same information is about 222 KiB. Pass the `[B, S]` vector (or the valid
# lengths) to the kernel; never build the $S \times S$ tensor.
# :::
#
# ## NaN: why "just mask with -inf" breaks under JAX
#
# A padded *query* row has no valid key at all. In JAX, the softmax of an all `-inf` row is `0/0 = NaN`. That NaN
# does not stay in its row: in the next block the padded token is a *key*. Its attention weight is exactly 0,
# but `0 * NaN = NaN`, so every valid token's output becomes NaN:

# %%
import jax
import jax.numpy as jnp

valid = jnp.array([True, True, True, False])  # 3 valid tokens, 1 padding
rng = np.random.default_rng(0)
x = jnp.asarray(rng.standard_normal((4, 8)), dtype=jnp.float32)

def naive_layer(x):
    scores = x @ x.T / jnp.sqrt(8.0)
    allowed = valid[:, None] & valid[None, :]  # the dense mask
    probs = jax.nn.softmax(jnp.where(allowed, scores, -jnp.inf), axis=-1)
    return probs @ x

h1 = naive_layer(x)
h2 = naive_layer(h1)
print("after block 1, NaN per token:", jnp.isnan(h1).any(axis=1))
print("after block 2, NaN per token:", jnp.isnan(h2).any(axis=1))

# %% [markdown]
# The same two layers through `hyv_lib.kernels.dispatch` stay finite: a padded query gets an exact zero output
# instead of a softmax over an empty set.

# %%
xt = torch.tensor(np.asarray(x))[None, None]  # [B=1, heads=1, S=4, D=8]
mask = torch.tensor(np.asarray(valid))[None]
y = attention(xt, xt, xt, mask, backend="reference")
y = attention(y, y, y, mask, backend="reference")
print("any NaN after two layers:", torch.isnan(y).any().item())
print("output of the padded token:", y[0, 0, 3].abs().max().item())

# %% [markdown]
# ## Three exact methods, and one that is not
#
# Let $V$ be the valid keys of a query $i$ and $s_{ij} = q_i \cdot k_j / \sqrt{D}$. Exact attention is
#
# $$
# o_i = \frac{\sum_{j \in V} e^{s_{ij}} v_j}{Z_i}, \qquad Z_i = \sum_{j \in V} e^{s_{ij}} .
# $$
#
# - **Key-padding mask.** Set $s_{ij} = -\infty$ for $j \notin V$. Then $e^{-\infty} = 0$ exactly, and padded
#   keys add nothing to the sum or to $Z_i$. This needs only a `[B, S]` vector, broadcast inside the kernel.
# - **Varlen (packed) sequences.** After the valid-first reorder, $V$ is the prefix `[0, n_b)`. Pack every
#   sample's prefix into one `[sum n_b, n_h, D]` tensor, describe it by `cu_seqlens = [0, n_0, n_0 + n_1, ...]`,
#   and run attention with no mask at all. This is flash-attn's `flash_attn_varlen_func`. The `sdpa` backend
#   ({term}`SDPA`) does the same on CPU one sample at a time (a slice, no copy).
# - **Segment ids.** The TPU Splash kernel lets query $i$ see key $j$ only when `segment[i] == segment[j]`. Valid
#   tokens get id 1; padding, including the padding added to reach a multiple of the block size, gets id 0. A
#   valid query never sees padding. A padded query sees only padding, so its softmax is finite and it gets zeroed.
#
# **{term}`K/V zeroing`** (the scheme of the gpu-tpu-pedia TPU port) multiplies padded keys and values by 0 and
# attends with no mask. For a padded key $s_{ij} = 0$ and $v_j = 0$, so the numerator is unchanged, but each of
# the $P$ padded keys adds $e^0 = 1$ to the denominator:
#
# $$
# o'_i = \frac{\sum_{j \in V} e^{s_{ij}} v_j}{Z_i + P} = o_i \cdot \frac{Z_i}{Z_i + P} .
# $$
#
# (Kernels subtract the row maximum $m$ first; then the extra term is $P e^{-m}$. The bias is the same.) Every
# valid output shrinks towards zero. The shrinkage grows with the amount of padding, and it hits every token,
# video tokens included. A measurement confirms the formula:

# %%
g = torch.Generator().manual_seed(0)
n_valid, d = 64, 16
q, k, v = (torch.randn(1, 1, n_valid + 1000, d, generator=g) for _ in range(3))
pads = [0, 4, 16, 64, 256, 1000]
measured, predicted = [], []
for p in pads:
    s = n_valid + p
    qs, ks, vs = (t[:, :, :s] for t in (q, k, v))
    mask = torch.arange(s)[None] < n_valid
    exact = attention(qs, ks, vs, mask, backend="reference")[0, 0, :n_valid]
    approx = attention(qs, ks, vs, mask, backend="kv_zeroing")[0, 0, :n_valid]
    z = torch.exp(qs[0, 0, :n_valid] @ ks[0, 0, :n_valid].T / d**0.5).sum(-1)
    measured.append((approx - exact).abs().max().item())
    predicted.append((exact * (z / (z + p) - 1)[:, None]).abs().max().item())
fig, ax = plt.subplots(figsize=(5, 3))
ax.plot(pads, measured, "o", label="measured max |o' - o|")
ax.plot(pads, predicted, "-", label="predicted from Z / (Z + P)")
ax.set(xscale="symlog", xlabel="padded keys P", ylabel="max abs error", title="K/V zeroing is biased")
ax.legend(fontsize=8)
fig.tight_layout()

# %% [markdown]
# ## Padding to block multiples
#
# Tiled kernels work on blocks of queries and keys, so the sequence is padded to a multiple of the block size.
# If those extra positions are treated as valid zero keys, the result is K/V zeroing again, applied to every
# token. With the block sizes that the TPU kernel uses by default here (2048), the 720p sequence gets this
# much padding:

# %%
from hyv_lib.kernels.splash import DEFAULT_BLOCK_SIZES

block = DEFAULT_BLOCK_SIZES["block_kv"]
padded = -(-s720 // block) * block
print(f"S = {s720:,} -> {padded:,} at block_kv = {block}: {padded - s720:,} block-padding keys")


# %% [markdown]
# Segment ids make both kinds of padding invisible: block padding gets the padding id 0, the same as
# context padding.
#
# ## The real Splash kernel on CPU
#
# `hyv_lib.kernels.splash` calls JAX's Pallas Splash attention kernel (`make_splash_mha` with `SegmentIds`). On a TPU it
# runs natively. Anywhere else it runs in Pallas *interpret mode*, which executes the same kernel code (grid,
# blocks, online softmax) with ordinary XLA operations: slowly, but with the same numerics. Below, every backend
# that can run here is compared with a float64 computation, on the joint-sequence mask of the prompt above.
# Small blocks force several grid steps and a sequence that is not a block multiple.

# %%
def float64_attention(q, k, v, mask):
    out = torch.zeros(q.shape, dtype=torch.float64)
    for b in range(q.shape[0]):
        idx = mask[b].nonzero(as_tuple=True)[0]
        w = torch.softmax(q[b][:, idx].double() @ k[b][:, idx].double().transpose(-1, -2)
                          / q.shape[-1] ** 0.5, dim=-1)
        out[b][:, idx] = w @ v[b][:, idx].double()
    return out

ctx_mask = torch.cat([torch.ones(1, n_video, dtype=torch.bool), reordered], dim=1)
neg_order, neg_reordered = layout.valid_first_order(
    image_mask, embeds["negative_prompt_embeds_mask_2"], embeds["negative_prompt_embeds_mask"])
kv_mask = torch.cat([ctx_mask, torch.cat([torch.ones(1, n_video, dtype=torch.bool), neg_reordered], 1)])
g = torch.Generator().manual_seed(1)
q, k, v = (torch.randn(2, 2, kv_mask.shape[1], 64, generator=g) for _ in range(3))
expected = float64_attention(q, k, v, kv_mask)
rows = []
for backend, options in (("reference", {}), ("sdpa", {}), ("kv_zeroing", {}),
                         ("splash", dict(block_q=128, block_kv=128, block_kv_compute=128))):
    attention(q, k, v, kv_mask, backend=backend, **options)  # warm up (Splash compiles)
    t0 = time.perf_counter()
    out = attention(q, k, v, kv_mask, backend=backend, **options)
    ms = (time.perf_counter() - t0) * 1e3
    valid_rows = kv_mask[:, None, :, None].expand_as(out)
    rows.append({"backend": backend, "max |err| (valid rows)": f"{(out.double() - expected)[valid_rows].abs().max():.1e}",
                 "padded rows exactly 0": bool((out[~valid_rows] == 0).all()), "ms": round(ms, 1)})
print(f"S = {kv_mask.shape[1]}, valid tokens per sample = {kv_mask.sum(1).tolist()}")
html_table(rows)

# %% [markdown]
# The exact backends agree with float64 to float32 rounding. K/V zeroing does not. (Its padded rows are
# not zero either, but no valid token reads them.) The times are one call each on this CPU, with whatever else it
# is running; they say nothing about speed on a TPU, where Splash runs natively instead of in interpret mode.
#
# ## On the model: every backend against diffusers
#
# `hyv_lib.models.hunyuan_video15.processors.use_attention(model, backend)` installs the masked processor on every attention of a
# `HunyuanVideo15Transformer3DModel`: the dual-stream blocks (54 in the real model, a few here) and the token refiner. The processor
# receives diffusers' `[B, L_context]` mask, extends it with `True` for the video tokens, and passes the
# `[B, S]` vector to the backend. No `S x S` tensor is built. The oracle is diffusers' own eager forward:

# %%
import copy

from hyv_lib.models.components import load_components

transformer = load_components(preset, MODEL_PATH, ["transformer"], dtype="fp32")["transformer"]
conditioning = prepare_conditioning(embeds, preset, torch.float32,
                                   image_dim=transformer.config.image_embed_dim)
c = preset.latent_channels
g = torch.Generator().manual_seed(2)
inputs = dict(hidden_states=torch.randn(2, 2 * c + 1, LATENT_FRAMES, LATENT_H, LATENT_W, generator=g),
              timestep=torch.tensor([800.0, 800.0]), **conditioning)
with torch.no_grad():
    oracle = transformer(**inputs).sample
rows = []
for backend, options in (("reference", {}), ("sdpa", {}), ("kv_zeroing", {}),
                         ("splash", dict(block_q=128, block_kv=128, block_kv_compute=128))):
    model = copy.deepcopy(transformer)
    n = use_attention(model, backend, **options)
    with torch.no_grad():
        out = model(**inputs).sample
    err = (out - oracle).abs().max().item()
    rows.append({"backend": backend, "processors": n, "max |out - oracle|": f"{err:.1e}",
                 "relative": f"{err / oracle.abs().max().item():.1e}"})
html_table(rows)

# %% [markdown]
# The exact backends match the oracle to float32 rounding. K/V zeroing misses it by a margin that the
# tests would reject. In a 50-step loop that bias feeds back into the latents at every step. On a model this
# small, though, this single-forward number says little about how visible it would be in a real video.
#
# ## Memory: O(S) instead of O(S²)
#
# What grows with $S$ is easiest to see in the largest tensor a forward creates. `hyv_lib.base.memory.LargestTensor`,
# a `TorchDispatchMode`, sees every torch operation and records the largest new tensor (views excluded) in one
# forward of the tiny model, batch 1, with 64×64 latent pixels per frame, with diffusers' processor and with ours.
# When $S$ doubles, an O(S²) tensor grows about fourfold and an O(S) one twofold:

# %%
from hyv_lib.base.memory import LargestTensor
from hyv_lib.models.components import build_tiny_components
from hyv_lib.models.hunyuan_video15.components import example_forward_kwargs

tiny = hyv_lib.get_preset("tiny")
diffusers_model = build_tiny_components(tiny, names=["transformer"])["transformer"]
ours = copy.deepcopy(diffusers_model)
use_attention(ours, "sdpa")
rows = []
for frames in (1, 2):
    kwargs = example_forward_kwargs(tiny, latent=(frames, 64, 64), text_lengths=(20,), byt5_lengths=(0,))
    s = frames * 64 * 64 + layout.context_tokens(tiny)
    row = {"S": s}
    for name, m in (("diffusers", diffusers_model), ("hyv_lib sdpa", ours)):
        with torch.no_grad(), LargestTensor() as probe:
            m(**kwargs)
        row[f"{name}: largest MiB"] = round(probe.bytes / 2**20, 1)
        row[f"{name}: op"] = probe.op
    row["diffusers bytes / S²"] = round(row["diffusers: largest MiB"] * 2**20 / s**2, 2)
    rows.append(row)
first, second = rows
print(f"S x{second['S'] / first['S']:.2f}: diffusers' largest tensor x"
      f"{second['diffusers: largest MiB'] / first['diffusers: largest MiB']:.2f} (S² would be "
      f"x{(second['S'] / first['S']) ** 2:.2f}), hyv_lib's x"
      f"{second['hyv_lib sdpa: largest MiB'] / first['hyv_lib sdpa: largest MiB']:.2f}")
html_table(rows)

# %% [markdown]
# diffusers' largest tensor is the $S \times S$ mask, and its 4 bytes per element show that it is not even the
# boolean one: on this CPU, torch's SDPA turns the boolean mask into an additive float mask before the kernel
# runs. It grows with $S^2$. Ours is an ordinary activation, the MLP matmul output of the video tokens: it grows
# linearly with their count (×2.00 here, slightly more than $S$, which also holds the fixed context).
# `benchmarks/attention_memory.py` measures the whole process's peak resident memory instead, one fresh
# process per run, at longer sequences.

# %% [markdown]
# ## GPU kernels: what was measured, what is cited
#
# On GPUs the same semantics map onto the kernels below (`hyv_lib.kernels.dispatch.available_backends()` says which
# ones can run on a machine, and why not). One NVIDIA H200 timed those that were installed on the real 720p/121f
# attention call (the CFG pair, 16 heads of 128, 113,585 tokens per sample) with `benchmarks/gpu_check.py`; the files
# are committed in `benchmarks/results/`, and the cell below reads them, with `auto`'s order from
# `hyv_lib.kernels.dispatch.GPU_ORDERS`.

# %%
import json
from pathlib import Path

from hyv_lib.kernels.dispatch import GPU_ORDERS

RESULTS = Path("../benchmarks/results")  # this notebook runs in notebooks/; the files benchmarks/gpu_check.py wrote
gpu_runs = {n: json.loads((RESULTS / f"gpu_check_2026-11-26_H200_run{n}.json").read_text()) for n in (2, 4)}
env = gpu_runs[2]["sections"]["environment"]
shape = gpu_runs[2]["sections"]["attention"]["shape"]
print(f"one {env['gpu']}, torch {env['torch']}: one attention call of {shape['batch']} x {shape['heads']} heads x "
      f"{shape['tokens']:,} tokens ({shape['dtype']}, head dim {shape['head_dim']})")
display(html_table([
    {"file": f"gpu_check_2026-11-26_H200_run{n}.json", "backend": r["name"], "ms": r.get("ms", ""),
     "useful TFLOP/s": r.get("tflops", ""), "max error vs fp32": f"{r['max_error']:.1e}" if "max_error" in r else "",
     "peak GiB": r.get("peak_allocated_gib", ""), "not run because": r.get("reason", "").split(" (")[0]}
    for n, run in gpu_runs.items() for r in run["sections"]["attention"]["rows"]]))
for order, newer in zip(GPU_ORDERS, (None, *GPU_ORDERS)):
    where = (f"of compute capability {order.min_capability[0]}.{order.min_capability[1]} and newer" if newer is None
             else f"below compute capability {newer.min_capability[0]}.{newer.min_capability[1]}")
    print(f"auto on CUDA GPUs {where}: {' > '.join(order.backends)}")

# %% [markdown]
# | backend | kernel | exact? | how the mask is used | speed on Hopper (H100/H200, head dim 128) | `auto` tries it |
# |---|---|---|---|---|---|
# | `sdpa` | torch's `scaled_dot_product_attention`, which picks its kernel: cuDNN's fused attention (`SDPBackend.CUDNN_ATTENTION`) on Hopper with torch ≥ 2.11, torch's own FlashAttention-2 before Hopper, a CPU kernel here | yes | each sample's valid prefix, no mask argument | **measured**, one H200: 366.5 ms, 557.7 TFLOP/s (`gpu_check_2026-11-26_H200_run2.json`; 367.4 ms in run 4) | 1st on Hopper, 2nd before |
# | `torch_varlen` | torch's own varlen FlashAttention-2 (`torch.nn.attention.varlen.varlen_attn`, torch ≥ 2.10) | yes | packed valid tokens + `cu_seqlens` | **measured**, one H200: 586.2 ms, 348.7 TFLOP/s (run 2) | last |
# | `flash` | flash-attn's FlashAttention-2 `flash_attn_varlen_func` | yes | packed valid tokens + `cu_seqlens` | **cited**: about 370 TFLOP/s forward on an H100 SXM5 at 8k–16k tokens (flash-attention's chart `assets/flash3_fp16_fwd.png`); not installed in the H200 runs | 3rd on Hopper, 1st before |
# | `flash3` | FlashAttention-3 varlen (Hopper only) | yes | same | **cited**: 646–648 TFLOP/s against cuDNN's 595–600 in the same chart (the cuDNN of 2024); 632 against 631 for cuDNN 9.1 at 24 heads x 4,608 tokens in PyTorch's Tritonbench (pytorch/pytorch issue #142132); not installed in the H200 runs | 2nd on Hopper |
# | `sage` | SageAttention 1 (`sageattention==1.0.6`), INT8 $QK^T$ | no (lossy) | each sample's valid tokens | **measured**, one H200: 449.7 ms, max error 3.2e-4 (run 4) | never (lossy) |
# | `splash` | JAX Pallas Splash (TPU) | yes | segment ids | not a GPU kernel | on TPU |
#
# **Which kernel `sdpa` runs.** PyTorch's dispatcher puts cuDNN's attention first on compute capability 9.0 and 10.0
# (H100, H200, B200) when its bundled cuDNN is newer than 9.15 (`check_prefer_cudnn_attention` in PyTorch's
# `aten/src/ATen/native/transformers/cuda/sdp_utils.cpp`). PyTorch 2.5 first made cuDNN the default on H100 ("up to
# 75% speed-up over FlashAttentionV2", the PyTorch 2.5 release blog, <https://pytorch.org/blog/pytorch2-5/>), then
# made it opt-in after bugs (pytorch/pytorch PR #138522) and preferred it again on sm90/sm100 behind that version check
# (PR #162073); torch 2.11 is the first release whose bundled cuDNN passes it (a transformers maintainer's reading of
# the same code, huggingface/transformers PR #48163). The H200 files above come from torch 2.11 and did not record the
# kernel SDPA chose (`gpu_check` records it now, as `sdpa_kernel_bf16_d128`), but their ratio matches: torch's
# FlashAttention-2 took 1.6x as long as SDPA, as FlashAttention-2 does against cuDNN in the flash-attention chart
# (370 against 595–600 TFLOP/s). A probe outside this repository on one H200 (torch 2.11) forced each kernel on
# one 720p sample: cuDNN's 178 ms (about 575 TFLOP/s) against 281 ms (about 364) for torch's FlashAttention-2 path.
#
# **What flash-attn and FlashAttention-3 add on Hopper.** For speed, FlashAttention-2 adds nothing there: it is the
# kernel `torch_varlen` already runs, measured 1.6x slower than SDPA's cuDNN. What it does add is one varlen launch
# for the whole batch and a fast path before Hopper (A100, L40S) or with the torch releases before 2.11 (2.5.0 aside),
# where SDPA does not pick cuDNN; that is why `auto` tries it first on GPUs older than Hopper (not measured by this project).
# FlashAttention-3 was not measured here; the published numbers put it from level with cuDNN (Tritonbench) to 8–9% above it
# (its own chart) on an H100. `auto` on Hopper tries SDPA first, and SDPA runs wherever CUDA does, so `auto` resolves to `sdpa`
# there; `--attention flash3` forces FlashAttention-3 where it is built.
#
# Other published numbers, with their hardware:
#
# - **SageAttention 1**, the release `requirements-gpu.txt` pins (`sageattention==1.0.6`: INT8 $QK^T$, FP16 $PV$).
#   Its paper reports about 2.1× the throughput of FlashAttention-2 (Zhang et al., arXiv:2410.02367; its README
#   says the kernel was tuned for RTX 4090 and 3090). On an H100 at head dim 128, the SageAttention repository's
#   chart puts it at about 516–518 TOPS, where the same chart's FlashAttention-3 FP16 build reaches 459–470. The
#   871–900 TOPS often quoted for the H100 belong to SageAttention2, a later release that `hyv_lib` does not
#   install. Both are lossy: a ComfyUI report (Comfy-Org/ComfyUI issue #10823) links black HunyuanVideo-1.5
#   output to the SageAttention 2.2.0.post4 release.
# - **HunyuanVideo-1.5 end to end**, 720p, 121 frames, 50 steps (gpu-tpu-pedia, a single author whose documents
#   label hardware inconsistently; {doc}`../book/references` lists every such time with its layout). On 8×H100, with
#   {term}`Ulysses` over all eight GPUs: FlashAttention-2 5.2 s/step; SageAttention 3.25 s/step (its SageAttention
#   path ignores the text mask, and the release it used is not stated).
# - **TPU**, same project, on a v6e-8 (`tp_replicated_out` on `tensor=8` in this book's terms): stock Splash with
#   K/V zeroing, 7.29 s/step. Its migration guide also tried segment ids in place of K/V zeroing, and they were
#   *slower*: about 435 s per 50-step video against about 350 s for the guide's own K/V-zeroing run, 24% more. (That
#   run is the guide's baseline, 7.0 s/step, not the 7.29 s/step above; only the ratio between its two runs is
#   like for like.) Exactness may cost time on a TPU. No chapter of this book times Splash on a TPU; chapter 8 counts
#   the attention FLOPs that the padded context tokens add to a step. The cell below prints these times from
#   `hyv_lib.planning.hardware`, where the book keeps them.

# %%
from hyv_lib.planning.hardware import CITED_STEP_TIMES, cited_pair, layout_label

for c in CITED_STEP_TIMES:
    if c["chip"] == "H100" or c["rules"] == "tp_replicated_out" and "stock" in c["label"]:
        print(f"{c['n_chips']} x {c['chip']}, {c['label']} ({c['rules']}, {layout_label(c['mesh'])}): "
              f"{c['seconds']} s/step")
seg = cited_pair("segment_ids", "v6e")
print(f"{seg['n_chips']} x {seg['chip']}, {seg['after']} vs {seg['before']}: {seg['after_s']:.0f} s vs "
      f"{seg['before_s']:.0f} s per {seg['steps']}-step video ({seg['after_s'] / seg['before_s'] - 1:+.0%}; "
      f"{seg['before_s'] / seg['steps']:.1f} s/step uncached in that document)")

# %% [markdown]
# - diffusers ≥ 0.37 rejects masks in its `flash`/`flash_hub`/`_flash_3` backends (huggingface/diffusers
#   PR #12892). HunyuanVideo-1.5's processor always passes a mask, so those backends fail for this model. Its
#   varlen backends work.
#
# ## Summary
#
# - The context is padded to 1985 tokens (729 image + 256 ByT5 + 1000 text); after the valid-first reorder, the
#   valid tokens of each sample are a prefix of the joint sequence.
# - A dense `[2, 1, S, S]` mask costs about 24 GiB at 720p/121 frames (12 GiB per sample), rebuilt in every
#   block. A `[B, S]` vector of about 222 KiB (or just the valid lengths) holds the same information.
# - Fully masked rows give NaN under JAX, and the NaN spreads through $0 \cdot \text{NaN}$. `hyv_lib` zeroes
#   padded rows instead.
# - Key-padding masks, varlen packing and Splash segment ids are exact. K/V zeroing shrinks every output by
#   $Z/(Z+P)$, and so does treating block padding as valid.
# - `use_attention(model, backend)` makes diffusers' model use any of them. The exact ones match the oracle to
#   float32 rounding, and the largest tensor of a forward grows as O(S), not O(S²).
# - On one H200, SDPA on each sample's valid tokens (cuDNN's kernel on Hopper) ran the 720p/121f attention at
#   557.7 TFLOP/s, 1.6x faster than FlashAttention-2 inside torch; `auto` picks it on Hopper, and building
#   flash-attn there buys no speed.
#
# ## Exercises
#
# Marked ★ (easy) to ★★★ (hard), and *open* where no one has the answer yet ({ref}`notation-exercises`).
#
# 1. ★ Show that K/V zeroing with *no* padding at all (`P = 0`) is exact, and find the padding at which the
#    relative error of a token reaches 1% when its $Z_i = 500$.
# 2. ★ Why does the Splash backend give padded tokens segment id 0 instead of a fresh id per padded token?
# 3. ★ Use `hyv_lib.models.hunyuan_video15.layout.dense_mask_bytes` to find the longest 720p video (4n+1 frames) whose `[2, 1, S, S]`
#    mask still fits in 16 GiB.
# 4. ★★ A text-to-video prompt at 720p/121f has 120 valid text tokens and no quoted text. How many of the $S$ keys
#    are padding? Suppose a query's scores were all near 0, so that every key adds about $e^0 = 1$ to the
#    denominator. By what factor would K/V zeroing shrink its output, and by what factor if the 2048-key block
#    padding were also treated as valid zero keys?
# 5. ★★★ *Open.* gpu-tpu-pedia found Splash with segment ids 24% slower than K/V zeroing on its TPU runs (printed
#    above), yet both compute the same blocks: every key block is attended. Where does the time go, and can an
#    exact mask be as fast as the biased one? With the valid-first order, the padding is one contiguous tail of each
#    sample, so a kernel could also *skip* the key blocks that hold only padding instead of computing them. No one
#    has timed either on a TPU for this model.
#
# :::{admonition} Answers
# :class: dropdown
# 1. With $P = 0$ the factor $Z/(Z+P)$ is 1. The relative error is $P/(Z+P)$, and $P/(500+P) = 0.01$ gives
#    $P \approx 5.05$, so about 5 padded keys. A real text-to-video prompt of about 100 tokens leaves over 1,800
#    padded context tokens, so the bias is far from small unless $Z$ is huge.
# 2. Segment ids only have to separate valid tokens from padding. With one shared padding id, each padded query
#    sees at least one key (itself and the other padding), so its softmax is finite. Its output is zeroed
#    afterwards anyway. A fresh id per token would also work, but it adds nothing. Giving padding the *valid* id
#    would be K/V zeroing again.
# 3. `max(f for f in range(1, 122, 4) if layout.dense_mask_bytes(real, 720, 1280, f) <= 16 * 2**30)` gives 97
#    frames (25 latent frames, S = 91,985, about 15.8 GiB). At 101 frames it is already 17.0 GiB. The dense mask
#    alone would fill a 16 GiB v5e chip before the model stored a single activation.
# 4. The valid keys are the 111,600 video tokens and the 120 text tokens, $n = 111{,}720$; the padding is
#    $P = 1985 - 120 = 1{,}865$ context tokens. With $Z_i \approx n$, the factor is
#    $Z/(Z + P) = 111{,}720 / 113{,}585 \approx 0.984$: every output shrinks by about 1.6%. Block padding brings the
#    key length to 114,688 (the 1,103 extra keys printed above), so $111{,}720 / 114{,}688 \approx 0.974$, a 2.6%
#    shrink. Check: `n = layout.video_tokens(real, 720, 1280, 121) + 120; n / s720, n / padded`. Real scores are
#    not all 0, so real $Z_i$ vary from token to token, and so does the bias.
# 5. *Where to start.* On a TPU VM, time `hyv_lib.kernels.splash` on the real 720p shape (2 samples, 16 heads of 128, $S$ = 113,585)
#    with segment ids against the same call with every id 1 (K/V zeroing's cost without its zeroing), under
#    `jax.profiler`, at `hyv_lib`'s Splash blocks (`hyv_lib.kernels.splash.DEFAULT_BLOCK_SIZES`) and at larger
#    ones. If the segment-id version is slower, the mask
#    blocks Splash builds from the ids (partial rather than full blocks) are the first suspect. A mask that marks the
#    all-padding key blocks as empty lets Splash skip them; the count of attended tokens in chapter 8's padding
#    table bounds what that can save.
# :::
