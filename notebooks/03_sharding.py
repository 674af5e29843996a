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
# # 3. Sharding the DiT across devices
#
# One HunyuanVideo-1.5 step at 720p and 121 frames does about 12.65 PFLOP and needs 15.5 GiB of bf16 weights plus
# gigabytes of activations, so on TPU chips of 16 or 32 GiB it has to be spread over several chips, and spreading it
# divides the work wherever it runs. (One GPU with more memory can hold it whole: one uncached 720p/121f step peaked
# at 26.0 GiB on an H200, {ref}`runbook-gpu-measured`.) There are three ways to split it, and a
# device {term}`mesh` can combine them: split the {term}`CFG` pair of samples (`data`), split the heads and the
# matrices inside each block (`tensor`, Megatron style: {term}`tp`), or split the video tokens and swap to a split by
# heads around attention (`sequence`, {term}`Ulysses`). Symbols and units are those of the {doc}`../book/notation`
# page (memory and bytes moved in GiB; vendors' bandwidths in GB/s).
#
# :::{figure} ../book/figures/03_mesh_tp_ulysses.svg
# :name: fig-03-mesh-tp-ulysses
# (A) A v6e-8 as a `data=2 × tensor=4` mesh: each chip holds one sample of the CFG batch and 4 of the 16 heads.
# (B) Megatron tensor parallelism in one block: the column-parallel projections (`to_q/k/v`, `fc1`) split their
# output features, the row-parallel ones (`to_out`, `fc2`) their input features, and each row-parallel output is
# all-reduced over the tensor row. Under {term}`tp_replicated_out` the row-parallel weights are whole on every chip, and
# XLA replaces half of the all-reduces with all-gathers. (C) Ulysses: an all-to-all turns sequence shards into
# head shards for attention, and a second one turns them back.
# :::
#
# This chapter:
#
# 1. sizes the problem with the planner (`hyv_lib.planning`): FLOPs, bytes per device, lower bounds on step time;
# 2. asks the **TPU compiler** what the real 720p program needs on a v6e-8, without a TPU: libtpu compiles for a
#    named {term}`slice` on any Linux machine, and the planner is checked against it;
# 3. builds device meshes with `data`, `tensor` and `sequence` axes and places the weights with three rule sets
#    (`tp`, `tp_replicated_out`, {term}`fsdp`) on 8 emulated CPU devices, checks every layout against diffusers'
#    forward on a randomly initialised 8-head tiny model, and counts the collectives ({term}`all-reduce`,
#    {term}`all-gather`, {term}`all-to-all`) {term}`XLA` inserts;
# 4. runs Ulysses sequence parallelism, the GPU approach, with torch.distributed on CPU processes.
#
# The emulated devices run the same sharded step a v6e-8 would run, compiled for the CPU
# (`--xla_force_host_platform_device_count=8`). The speed is not a TPU's; the memory and the collectives of the
# real-size program come from the TPU compiler.
# Sharding is about shapes, so the chapter loads no weights: `HYV_PRESET` and `HYV_MODEL_PATH` do not change it.

# %% tags=["parameters"]
import os

N_DEVICES = int(os.environ.get("HYV_N_DEVICES", "8"))   # emulated CPU devices (a real TPU VM: its chips)
COMPILE_PRESET = os.environ.get("HYV_COMPILE_PRESET", "tiny")  # the live TPU compile; 720p_t2v: minutes on a CPU
TOPOLOGY = os.environ.get("HYV_TOPOLOGY", "v6e:2x2")    # its slice (tiny's 2 heads need a 4-device one)
from hyv_lib.notebook.display import settings_not_used  # noqa: E402

_ = settings_not_used({
    "HYV_PRESET": "the planner sizes the real presets and the demos build a randomly initialised 8-head tiny model "
                  "(HYV_COMPILE_PRESET picks the live TPU compile)",
    "HYV_MODEL_PATH": "no weights are loaded: sharding is about shapes, and the demos use random weights",
    "HYV_RUNTIME": "the jax runtime is the subject", "HYV_MESH": "every layout is shown in turn",
    "HYV_ATTENTION": "XLA's kernel (and Splash in interpret mode) on the emulated CPU devices, Splash in the TPU compile",
    "HYV_HEIGHT": "the planner tables use the presets' sizes", "HYV_WIDTH": "see HYV_HEIGHT",
    "HYV_VIDEO_LENGTH": "see HYV_HEIGHT", "HYV_STEPS": "single steps, no loop",
})

# %%
# Emulated devices must be requested before JAX initialises its CPU backend.
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + f" --xla_force_host_platform_device_count={N_DEVICES}")
import copy
import logging
import warnings

warnings.filterwarnings("ignore", message="IProgress not found")
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
logging.getLogger("jax").setLevel(logging.ERROR)

import jax
import torch
from diffusers import HunyuanVideo15Transformer3DModel

import hyv_lib
from hyv_lib.models.hunyuan_video15.components import example_forward_kwargs
from hyv_lib.models.hunyuan_video15.adapter import RULE_SETS
from hyv_lib.notebook.display import html_table
from hyv_lib.parallel.mesh import make_mesh
from hyv_lib.planning.costs import collective_bytes, param_bytes, step_flops, token_counts
from hyv_lib.planning.hardware import mfu
from hyv_lib.planning.hlo import hlo_collectives
from hyv_lib.planning.planner import (
    COMPILED_RESULTS,
    bounds,
    cited_times,
    device_plan,
)
from hyv_lib.runtimes.jax_step import JaxTransformer

print(jax.device_count(), "devices:", jax.devices()[0].platform)

# %% [markdown]
# ## How big is one step?
#
# `hyv_lib.planning.costs.step_flops` counts the matmuls of one forward over the CFG batch of 2. The parameter shapes come
# from a meta-device instance of the diffusers class, and the attention term is $4 B n_h S^2 D = 4 B S^2 d$ per block
# over the joint sequence ($n_h$ heads of dimension $D$, hidden width $d = n_h D$), context padding included (the kernels compute it). On the tiny config, the same count matches
# the matmul FLOPs in XLA's compiled HLO exactly (a test checks it).

# %%
rows = []
for name in ("480p_t2v", "720p_t2v"):
    p = hyv_lib.get_preset(name)
    f = step_flops(p, p.default_height, p.default_width, 121)
    rows.append({"preset": name, "size": f"{p.default_height}x{p.default_width}x121",
                 "joint tokens S": f"{f['tokens']['joint']:,}", "PFLOP per CFG step": round(f["total"] / 1e15, 2),
                 "attention share": f"{f['attention_share']:.1%}"})
html_table(rows)

# %% [markdown]
# At 720p nine tenths of the work is attention, which is quadratic in the 113k tokens. The weights are
# what decides the *memory* layout:

# %%
real = hyv_lib.get_preset("720p_t2v")
rows = []
for rules in ("replicated", "tp", "tp_replicated_out", "fsdp"):
    report = param_bytes(real, "bf16", rules, mesh_shape=8)
    rows.append({"rule set (8 devices)": rules, "weights per device, GiB": round(report["bytes_per_device"] / 2**30, 2)})
extra = (param_bytes(real, "bf16", "tp_replicated_out", mesh_shape=8)["bytes_per_device"]
         - param_bytes(real, "bf16", "tp", mesh_shape=8)["bytes_per_device"])
print(f"tp_replicated_out holds {extra / 2**30:.2f} GiB more per device than tp")
html_table(rows)

# %% [markdown]
# `tp` splits the attention and MLP matrices of the 54 blocks 8 ways. `tp_replicated_out` keeps the
# row-parallel ones (attention output projection, MLP `fc2`) whole on every device, which costs 3.7 GiB more
# per device; the gpu-tpu-pedia project measured 8.12 → 7.29 s/step on a v6e-8 with this change (`tensor=8`; a single
# author, whose documents label the hardware inconsistently; {ref}`references-baselines`). What the compiler makes of
# it is below. `fsdp` stores every block matrix split over all devices and gathers each block's weights just before
# it runs. About a third of the parameters (the {term}`AdaLN` modulation linears, $6d \times d$ = 12288×2048 per
# stream and block) stay whole under both TP rule sets.
#
# ## What has to cross the interconnect
#
# Memory is one side of a layout; the other is what the devices must exchange. Two layouts at the extremes, at
# 720p and 121 frames on 8 devices, in bf16 ($x = 2$ bytes), with $L = 54$ blocks, hidden width $d = 2048$,
# $N_v = 111{,}600$ video and $N_c = 1{,}985$ context tokens, and the CFG batch $B = 2$ on every device:
#
# **Plain TP on `tensor=8`.** In each block and stream, the two row-parallel matmuls (`to_out`, `fc2`) leave
# partial sums of shape $[B, N, d]$ ($N$ the stream's tokens) that are all-reduced. The last block's context stream
# after attention feeds nothing, so the context counts $L - 1$ times. The all-reduced bytes per step are
#
# $$
# M = 2 B d x \left[L N_v + (L - 1) N_c \right] = 2 \cdot 2 \cdot 2048 \cdot 2 \cdot (54 \cdot 111{,}600 + 53 \cdot 1{,}985)
#   = 16{,}384 \cdot 6{,}131{,}605\ \text{B} \approx 93.6\ \text{GiB}.
# $$
#
# A ring all-reduce of $m$ bytes over $n$ devices sends $2 (n - 1)/n \cdot m$ from each device, so each device sends
# $1.75\,M \approx 163.7$ GiB per step (the token refiner's two small all-gathers add about 14 MiB).
#
# **Ulysses on `sequence=8`.** The weights stay whole: 15.5 GiB on every device, and no all-reduce. Before
# attention each device holds q, k and v for its $N_v/8 = 13{,}950$ video tokens and all 16 heads, each
# $B \cdot 13{,}950 \cdot d \cdot x = 2 \cdot 13{,}950 \cdot 2048 \cdot 2\ \text{B} \approx 109.0$ MiB. The all-to-all
# keeps $1/8$ of it and sends $7/8$: about 95 MiB per tensor. The K and V of one attention call are therefore about
# 191 MiB per device, about 1% of the weights each device holds; q, k, v and the output's way back make about
# 381 MiB per block, or about 20.1 GiB per step. (Gathering the whole joint sequence's K and V on every device
# instead would take $2 B S d x \approx 1.73$ GiB per block.)
#
# The planner in `hyv_lib.planning` computes the same:

# %%
c = real.transformer
L, d, x, B, n = c["num_layers"], c["num_attention_heads"] * c["attention_head_dim"], 2, 2, 8
tok = token_counts(real, 720, 1280, 121)
Nv, Nc = tok["video"], tok["context"]
M = 2 * B * d * x * (L * Nv + (L - 1) * Nc)
tp_plan = device_plan(real, 720, 1280, 121, {"tensor": n}, "tp")
GIB, MIB = 2**30, 2**20
print(f"plain TP, tensor={n}: all-reduced M = {M / GIB:.1f} GiB (planner {tp_plan['collectives']['all-reduce'] / GIB:.1f}); "
      f"sent {2 * (n - 1) / n * M / GIB:.1f} GiB by the formula, {tp_plan['sent_bytes'] / GIB:.1f} GiB by the planner "
      f"(+ refiner gathers, {(tp_plan['sent_bytes'] - 2 * (n - 1) / n * M) / MIB:.0f} MiB)")

shard = B * (Nv // n) * d * x  # one of q, k, v for the local tokens, all heads
ulysses_plan = device_plan(real, 720, 1280, 121, {"sequence": n}, "tp")
kv_sent = 2 * (n - 1) / n * shard
whole = param_bytes(real, "bf16", "replicated")["bytes_per_device"]
print(f"Ulysses, sequence={n}: one q/k/v shard {shard / MIB:.1f} MiB (planner: "
      f"{ulysses_plan['collectives']['all-to-all'] / (4 * L) / MIB:.1f} MiB per all-to-all); "
      f"K and V sent per attention call {kv_sent / MIB:.0f} MiB = {kv_sent / whole:.1%} of the {whole / GIB:.2f} GiB "
      f"of weights per device; q, k, v and the output {2 * kv_sent / MIB:.0f} MiB per block")
print(f"  per step: {4 * L * (n - 1) / n * shard / GIB:.1f} GiB by the formula; collective_bytes(strategy='ulysses') "
      f"{collective_bytes(real, 720, 1280, 121, strategy='ulysses', mesh_shape=n)['bytes_per_device'] / GIB:.1f} GiB "
      f"(it also counts the context tokens); plain TP sends "
      f"{tp_plan['sent_bytes'] / (4 * L * (n - 1) / n * shard):.1f}x more")
print(f"  all-gathering the joint sequence's whole K and V instead: {2 * B * tok['joint'] * d * x / GIB:.2f} GiB per block")

# %% [markdown]
# :::{admonition} Takeaway
# :class: tip
# Plain TP on 8 devices sends about 164 GiB per device per step, because every block all-reduces whole activations
# $[B, N, d]$ twice per stream; it holds 6.65 GiB of weights per device. Ulysses sends about 20 GiB (q, k, v and the
# output, each split 8 ways; one attention call's K and V are about 1% of the weights), but holds all 15.5 GiB of
# weights on every device. TP saves memory and pays in bandwidth; sequence parallelism does the reverse.
# :::
#
# ## What the TPU compiler says
#
# A planner is only as good as its model of what XLA does. The TPU compiler can answer directly, on this CPU:
# libtpu (installed with `requirements.txt`) describes a TPU slice by name, and `python -m hyv_lib compile` lowers the
# very jitted step that `JaxTransformer` runs on such a slice, with {term}`Splash` compiled by {term}`Mosaic`, and prints what the
# compiler reports per device. It is a memory and collective check, not a timing. A small config first, live (the
# tiny preset, whose head dim of 16 Splash pads to the TPU's 128 lanes):

# %%
from hyv_lib.planning.tpu_compile import compile_step, format_report

print(format_report(compile_step(COMPILE_PRESET, TOPOLOGY)))

# %% [markdown]
# The real 720p/121-frame step takes minutes to compile on a CPU (the table's `compile s` column), so the chapter
# reads the results of `benchmarks/tpu_compile.py`, which runs the same command for every chip, layout, size and
# cache mode (one `python -m hyv_lib compile ... --json` process each) and saves them. The command behind each row
# is in the file. For the v6e-8 at 720p, next to the planner's prediction for the same mesh (`device_plan`):

# %%
import json

with open(COMPILED_RESULTS) as f:  # saved by benchmarks/tpu_compile.py, shipped in hyv_lib/compiled/
    COMPILED = json.load(f)
GIB = 2**30
LAYOUTS = {"tp": "tp", "tp_replicated_out": "tp_replicated_out", "fsdp": "fsdp", "sequence": "tp"}
rows, compared = [], {}
for layout, rules in LAYOUTS.items():
    c = COMPILED[f"v6e-8/{layout}/720p/uncached"]
    plan = device_plan(real, 720, 1280, 121, c["mesh"], rules)
    kinds = {k["kind"]: k["bytes"] for k in c["collectives"]}
    compared[layout] = (c, plan, kinds)
    b = c["per_device_bytes"]
    rows.append({"layout": layout, "mesh": ",".join(f"{a}={n}" for a, n in c["mesh"].items() if n > 1),
                 "compiled GiB: weights+inputs": round(b["arguments"] / GIB, 2),
                 "temporaries": round(b["temporaries"] / GIB, 2), "code": round(b["code"] / GIB, 2),
                 "total": round(b["total"] / GIB, 2),
                 "planner total": round(plan["per_device_bytes"]["total"] / GIB, 2),
                 "compiled collectives GiB": round(sum(kinds.values()) / GIB, 1),
                 "planner collectives": round(plan["collective_total"] / GIB, 1),
                 "fits (31.25 GiB usable)": c["fits"], "compile s": round(c["compile_seconds"])})
print(COMPILED["v6e-8/tp_replicated_out/720p/uncached"]["command"])
html_table(rows)

# %%
for layout, (c, p, k) in compared.items():
    memory = p["per_device_bytes"]["total"] / c["per_device_bytes"]["total"] - 1
    # kind by kind: the planner's bytes minus the compiler's, summed over all-reduce, all-gather, all-to-all
    off = sum(abs(p["collectives"].get(kind, 0) - b) for kind, b in k.items()) / sum(k.values())
    print(f"{layout:18s} planner vs compiler: memory {memory:+.1%}, collective bytes kind by kind off by {off:.2%} "
          f"of the total; compiled code {c['per_device_bytes']['code'] / GIB:.2f} GiB (not modelled)")
fsdp_c = compared["fsdp"][0]
fsdp_gathers = next(x["count"] for x in fsdp_c["collectives"] if x["kind"] == "all-gather")
print(f"all fit: {all(c['fits'] for c, _, _ in compared.values())}; largest total "
      f"{max(c['per_device_bytes']['total'] for c, _, _ in compared.values()) / GIB:.1f} GiB of 31.25; fsdp: "
      f"{fsdp_gathers} all-gathers, {fsdp_c['per_device_bytes']['code'] / GIB:.2f} GiB of code")

# %% [markdown]
# Every layout fits a v6e chip with room to spare, and the weights dominate except under FSDP, which splits them
# eight ways. The planner's collective bytes match the compiler's kind by kind, to a small fraction of a percent
# (small gathers and a tiny all-reduce are what it misses): its model of what XLA inserts was written from the
# compiled programs (`device_plan`'s docstring spells it out). Its memory is within a few
# percent for the TP layouts and the sequence mesh. The planner does not model the compiled code, about 0.8 to
# 0.9 GiB under `tp`, `fsdp` and `sequence` alike (printed above); on FSDP's small total that is a much larger share,
# hence its bigger miss. Where
# the compiler has reported on a configuration, the planner shows the compiler's total instead
# (`device_plan(..., topology="v6e:2x4")["memory_total"]`, used by `bounds`); the temporaries are its one
# fitted term (`TEMPORARY_STREAM_COPIES`, `FSDP_GATHERED_BLOCKS`). The whole grid (other chips, 480p,
# DeepCache) is in chapter 8.
#
# ### What `tp_replicated_out` really does
#
# The name suggests that keeping `to_out` and `fc2` whole on every device avoids their all-reduces. The compiled
# {term}`HLO` shows something else: the collectives are swapped, not avoided. The activation that enters these matmuls is
# still split over `tensor` (each device computed only its own heads and MLP columns), so XLA has to bring the
# pieces together somewhere. For `fc2`, it slices the replicated weight to the device's own columns of the MLP
# activation and all-reduces the partial sums exactly as plain TP does. For the attention output projection it
# all-gathers the attention output (the same bytes as the all-reduce it replaces) and then runs the whole `to_out`
# matmul on every device. Every device also stores the whole `to_out` and `fc2` weights instead of its share (a
# quarter on this `tensor=4` mesh). The counts per step:

# %%
rows = []
for layout in ("tp", "tp_replicated_out"):
    c, plan, kinds = compared[layout]
    counts = {k["kind"]: k["count"] for k in c["collectives"]}
    rows.append({"rule set (data=2, tensor=4)": layout,
                 **{f"{kind} (count, GiB)": f"{counts.get(kind, 0)}, {kinds.get(kind, 0) / GIB:.1f}"
                    for kind in ("all-reduce", "all-gather")},
                 "GiB sent per device (ring)": round(plan["sent_bytes"] / GIB, 1),
                 "XLA FLOPs per device (Splash excluded)": f"{c['flops_per_device']:.3g}",
                 "weights GiB": round(plan["per_device_bytes"]["weights"] / GIB, 2)})
html_table(rows)

# %%
(tp, tp_plan24, tp_k), (tro, tro_plan24, tro_k) = compared["tp"], compared["tp_replicated_out"]
print(f"all-reduce bytes: {tro_k['all-reduce'] / tp_k['all-reduce']:.2f}x of plain TP's; all-gathers appear instead "
      f"({tro_k['all-gather'] / GIB:.1f} GiB); bytes sent per device {tro_plan24['sent_bytes'] / tp_plan24['sent_bytes'] - 1:+.0%}; "
      f"non-attention FLOPs per device {tro['flops_per_device'] / tp['flops_per_device'] - 1:+.1%} "
      f"(to_out run whole on all 4 tensor devices); weights per device "
      f"{(tro_plan24['per_device_bytes']['weights'] - tp_plan24['per_device_bytes']['weights']) / GIB:+.2f} GiB")

# %% [markdown]
# So the swap is bytes for bytes in the HLO: half of plain TP's all-reduces become all-gathers of the same size.
# On the wire that is less: a ring all-gather sends $(n-1)/n$ of its result per device, an all-reduce twice that, so
# the bytes each device sends fall by a quarter. It pays for this with more weights per device (the replicated
# matrices are whole on every device: 3.13 GiB more on this mesh, 3.69 GiB on `tensor=8`) and with redundant
# `to_out` matmuls. Whether the trade wins is a question of overlap and timing that only a TPU can answer. The 10%
# that gpu-tpu-pedia measured could come from the fewer bytes on the wire; this chapter cannot tell.
#
# The planner's bounds, per device, for the same meshes, next to gpu-tpu-pedia's measured step times (the only
# published ones for this model on TPU; its runs used `tensor=8`, so that is the mesh here). Each {term}`MFU` is the
# model's FLOPs over the time cited for that row's own layout, with stock Splash: the baseline the book uses
# throughout ({ref}`references-baselines`).

# %%
flops = step_flops(real, 720, 1280, 121)["total"]
rows = []
for rules, mesh in (("tp", {"tensor": 8}), ("tp_replicated_out", {"tensor": 8}), ("fsdp", {"data": 2, "sequence": 4})):
    b = bounds(real, 720, 1280, 121, "v6e", 8, rules, mesh_shape=mesh)
    # gpu-tpu-pedia's stock-Splash time on this very layout, if it published one (hyv_lib.planning.hardware)
    cited = [c for c in cited_times("720p_t2v", "v6e", 8, mesh, rules) if "stock" in c["label"]]
    rows.append({"rule set": rules, "mesh": ",".join(f"{a}={n}" for a, n in b["mesh"].items() if n > 1),
                 "GiB per device (weights + rest)": f"{b['weights_bytes'] / GIB:.1f} + {b['activation_bytes'] / GIB:.1f}",
                 "compute bound s": round(b["compute_s"], 2), "interconnect bound s": round(b["interconnect_s"], 2),
                 "cited s/step (stock Splash)": cited[0]["seconds"] if cited else "",
                 "MFU at that time": f"{mfu(flops, cited[0]['seconds'], 'v6e', 8):.1%}" if cited else ""})
html_table(rows)

# %% [markdown]
# Compute dominates every row, so the levers are the attention kernel's efficiency (gpu-tpu-pedia's custom exp2
# Splash kernel went from 7.29 to 5.81 s/step on the v6e-8, together with a larger query block in the same change)
# and keeping collectives off the critical path. FSDP holds the least weight per device. Its compute is split by
# samples (`data=2`: one sample per device) and video tokens (`sequence=4`), not by weights: each device runs the
# whole gathered matrices on its quarter of one sample's video tokens, and attention with 4 of the 16 heads. The
# context tokens are not split over `sequence` (each device runs all 1,985 of its sample's), so its compute bound
# comes out about the same as plain TP's on `tensor=8`, not lower. Its cost is gathering every block's weights each
# step (and four all-to-alls per block), which XLA can overlap with the previous block.

# %% [markdown]
# ## Meshes and rule sets
#
# A mesh names the devices' axes: `data` (the CFG pair of prompts), `tensor` (heads and matrix columns) and
# `sequence` (video tokens). A rule set maps diffusers parameter names to `PartitionSpec`s. The strategies (`tp`,
# `tp_replicated_out`, `fsdp`) are generic, the parameter names are the model's: HunyuanVideo-1.5's adapter
# (`hyv_lib.models.hunyuan_video15.adapter`) builds its `RULE_SETS` from which layers are column- and which row-parallel, and
# `JaxTransformer` asks the model's adapter for the set. Unmatched parameters are replicated, and a rule that
# matches nothing is an error. The demo model is the tiny config with 8 heads of
# 16, so that 8-way tensor parallelism can split the heads.

# %%
tiny = hyv_lib.get_preset("tiny")
torch.manual_seed(0)
oracle_model = HunyuanVideo15Transformer3DModel(
    **dict(tiny.transformer, num_attention_heads=8, attention_head_dim=16)).eval().requires_grad_(False)
# A CFG batch of 2 with real padding: 14 and 50 valid text tokens, 0 and 7 ByT5 tokens, no image (t2v).
inputs = example_forward_kwargs(tiny, seed=1, latent=(2, 4, 6), text_lengths=(14, 50), byt5_lengths=(0, 7),
                                timestep=600.0)
with torch.no_grad():
    oracle = oracle_model(**inputs).sample
for rule in RULE_SETS["tp_replicated_out"]:
    print(f"{rule.name:40s} {rule.spec}")

# %% [markdown]
# Now each layout runs on its mesh. `JaxTransformer(model, mesh=..., sharding=...)` places the weights by
# the rules. It also puts the CFG batch on `data` and keeps the video tokens split along `sequence` between
# blocks, and it runs attention per shard: `shard_map` with the heads split over `tensor` × `sequence`. That last
# part is needed because Splash is a Pallas kernel, which XLA's partitioner cannot split by itself. XLA inserts
# every collective on its own.

# %%
from torchax.interop import jax_view

cases = [("tp", dict(tensor=8), "xla"), ("tp_replicated_out", dict(tensor=8), "xla"),
         ("tp_replicated_out", dict(data=2, tensor=4), "splash"), ("tp", dict(sequence=2, tensor=4), "xla"),
         ("fsdp", dict(data=2, sequence=4), "xla")]
rows, steps = [], {}
for rules, axes, attention in cases:
    mesh = make_mesh(**axes)
    step = JaxTransformer(copy.deepcopy(oracle_model), mesh=mesh, sharding=rules, attention=attention)
    out = step(**inputs)
    weight = jax_view(step.jitted.buffers["model.transformer_blocks.0.attn.to_out.0.weight"])
    hlo = step.lower(**inputs).compile().as_text()
    steps[(rules, tuple(axes.items()))] = step
    rows.append({"rules": rules, "mesh": ",".join(f"{k}={v}" for k, v in axes.items()), "attention": attention,
                 "max |out - oracle|": f"{(out - oracle).abs().max():.1e}",
                 "to_out.0 shard": str(list(weight.addressable_shards[0].data.shape)),
                 **{op: c["count"] for op, c in hlo_collectives(hlo).items()
                    if op in ("all-reduce", "all-gather", "all-to-all")}})
html_table(rows)

# %% [markdown]
# JAX can draw how an array is laid out over the devices. Here is the attention output projection
# under `tp` on `tensor=8`: eight column blocks, one per device.

# %%
tp_step = steps[("tp", (("tensor", 8),))]
jax.debug.visualize_array_sharding(jax_view(tp_step.jitted.buffers["model.transformer_blocks.0.attn.to_out.0.weight"]))

# %% [markdown]
# Every layout reproduces the oracle to float32 rounding. The shard shape of the attention output
# projection (full size 128×128) shows the rules at work: split by input features under `tp`, whole under
# `tp_replicated_out`, split by rows under `fsdp` (which gathers it whole just before its block runs). The
# collective counts come from the compiled program: all-reduces for `tp`, all-gathers joining them under
# `tp_replicated_out`, all-to-alls wherever there is a `sequence` axis, and weight all-gathers for `fsdp`. The
# planner counts the same collectives, with the same bytes, as a test checks against the TPU compiler.
#
# ### A sequence axis has to divide the attention too
#
# On a mesh with a `sequence` axis, the video tokens are split between blocks. Attention needs every token, so a
# device must hold whole sequences of *some* heads. If the heads were split over `tensor` alone, the two sequence
# halves would both compute the same heads over the whole sequence: twice the attention work of `tensor=8` per
# device. `hyv_lib` splits the heads over `tensor` × `sequence`; XLA turns the sequence shards into head shards with
# an all-to-all before the kernel and back after it (Ulysses inside the mesh). XLA's own count per device, for a
# model whose video tokens outnumber its context tokens as at real size, with dense attention so that no loop hides
# FLOPs:

# %%
import dataclasses

long_video = dataclasses.replace(tiny, text_len=16, byt5_len=8, image_tokens=4)  # 28 context tokens
flops_inputs = example_forward_kwargs(long_video, seed=1, latent=(4, 16, 16), text_lengths=(9, 16),
                                      byt5_lengths=(0, 5))  # 1,024 video tokens
per_device = {}
for axes in (dict(tensor=8), dict(sequence=2, tensor=4), dict(data=2, sequence=4)):
    step = JaxTransformer(copy.deepcopy(oracle_model), mesh=make_mesh(**axes), sharding="tp", attention="xla",
                          attention_options={"block_kv": None})
    cost = step.lower(**flops_inputs).compile().cost_analysis()
    per_device[",".join(f"{k}={v}" for k, v in axes.items())] = float(cost["flops"])
base = per_device["tensor=8"]
html_table([{"mesh (8 devices, tp rules)": k, "XLA FLOPs per device": f"{v:.3g}", "vs tensor=8": f"{v / base:.2f}x"}
            for k, v in per_device.items()])

# %% [markdown]
# With the heads split over both axes, the sequence mesh does the per-device work of `tensor=8`.
# `data=2,sequence=4` does less again: there the parts no rule splits (embedders, modulation, token refiner) run on
# one sample per device instead of both. The all-to-alls that move the shards are in the collectives table above:
# four per block (q, k and v to head shards, the output back), as in the TPU compiler's 720p program, where each is
# $[b, N_v/s, d/t]$ as the planner counts them.
#
#

# %% [markdown]
# ## Ulysses: sequence parallelism on GPUs
#
# The official GPU code parallelises differently. Each of N processes holds the whole model and 1/N of the video
# tokens. In each attention, an all-to-all turns sequence shards into head shards, so every rank attends over
# all tokens with $n_h/N$ heads, and a second all-to-all turns them back. The text tokens are small, so they are
# replicated and only head-sliced. `hyv_lib.runtimes.ulysses.UlyssesTransformer` does this on torch.distributed (nccl on
# GPUs). Here it runs on gloo, with CPU processes:

# %%
from hyv_lib.parallel.distributed import run_distributed
from hyv_lib.runtimes.ulysses import ulysses_forward

ulysses_model = copy.deepcopy(oracle_model)
rows = []
for world in (2, 4):
    out = run_distributed(ulysses_forward, world, ulysses_model, inputs)
    rows.append({"ranks": world, "heads per rank": 8 // world, "video tokens per rank": -(-48 // world),
                 "max |out - oracle|": f"{(out - oracle).abs().max():.1e}"})
html_table(rows)

# %% [markdown]
# On real hardware it is one command per node:
#
# ```bash
# torchrun --nproc_per_node=8 -m hyv_lib stage2 --input_dir out --runtime ulysses --num_inference_steps 50
# ```
#
# and on a TPU VM, after checking the layout with the compiler on any machine:
#
# ```bash
# python -m hyv_lib compile --preset 720p_t2v --topology v6e:2x4 --mesh data=2,tensor=4 --sharding tp_replicated_out
# python -m hyv_lib stage2 --input_dir out --runtime jax --mesh data=2,tensor=4 --sharding tp_replicated_out
# ```
#
# ## Summary
#
# - At 720p and 121 frames one CFG step is about 12.65 PFLOP, 90% of it attention. The bf16 weights take
#   15.5 GiB, 6.65 GiB per device under 8-way `tp`, or 10.34 GiB with the row-parallel weights replicated.
# - Plain TP on `tensor=8` sends about 164 GiB per device per step (two all-reduces of $[B, N, d]$ per block and
#   stream); Ulysses on 8 devices sends about 20 GiB but keeps all the weights on every device.
# - The TPU compiler runs on any Linux machine with libtpu: `python -m hyv_lib compile` compiles the real step for
#   a named slice and reports per-device memory, collectives and FLOPs. At 720p every layout above fits a v6e-8.
#   The planner (`device_plan`) matches the compiler's collective bytes, and its memory to within a few
#   percent except for FSDP, whose small total makes the compiled code the planner does not model a large share.
# - `tp_replicated_out` does not avoid collectives, it swaps them: XLA all-gathers the attention output and runs
#   `to_out` whole on every device, and still all-reduces the MLP output. Half of the all-reduces become all-gathers
#   of the same size, which cuts the bytes on the wire by a quarter, for more weights per device (the replicated
#   matrices are whole everywhere) and some redundant compute.
# - A `sequence` axis splits the heads together with `tensor` (Ulysses inside the mesh), so
#   `sequence=2,tensor=4` does the per-device work of `tensor=8`; FSDP gathers each block's weights whole and splits
#   its compute by samples (`data`) and video tokens (`sequence`).
# - `JaxTransformer(..., mesh, sharding)` matches diffusers' forward on every layout tested here, and Ulysses gives
#   the same output on 2 and 4 processes.
#
# ## Exercises
#
# Marked ★ (easy) to ★★★ (hard), and *open* where no one has the answer yet ({ref}`notation-exercises`).
#
# 1. ★ Why must the number of heads be divisible by `tensor` × `sequence`, and what would you do for 16 heads on
#    a 12-chip system?
# 2. ★★ Using `param_bytes`, how much memory per device would splitting the AdaLN modulation linears
#    (`norm1.linear`, `norm1_context.linear`) save under `tp` on 8 devices? How would you confirm it with the
#    compiler?
# 3. ★ Ulysses moves the video q, k, v and output through all-to-alls. Why is it attractive on GPUs, where TP
#    is the usual choice for large language models?
# 4. ★★★ On the compiled mesh `data=2,tensor=4` with plain `tp`, derive by hand the all-reduce bytes per device per
#    step that the compiler reports (the 46.8 GiB in the layout table), and the bytes each device sends.
# 5. ★★★ *Open.* gpu-tpu-pedia measured `tp_replicated_out` 10% faster than `tp` on `tensor=8` (8.12 → 7.29 s/step),
#    yet the bytes it saves on the wire would take a fraction of that 0.83 s even at the ICI's peak (chapter 8 works
#    it out). Which default layout is fastest on a real v6e-8: `tp_replicated_out` on `data=2,tensor=4` (this
#    book's default), the same rules on `tensor=8`, or `fsdp` on `data=2,sequence=4`, which sends the least and holds
#    the least? The planner ranks them by bounds only; no one has timed them.
#
# :::{admonition} Answers
# :class: dropdown
# 1. Attention runs per shard with whole heads on each device (Splash works on [heads, sequence, head_dim]
#    blocks), and the heads are split over both axes. No product of `tensor` and `sequence` that uses 12 chips divides
#    16, and `data` can only take 1 or 2 (the CFG batch of 2). Use 8 of the 12 chips (`data=2,tensor=4`, or
#    `tensor=8`). `JaxTransformer`, `python -m hyv_lib compile` and `UlyssesTransformer` raise a clear error instead of
#    guessing.
# 2. Each is 12288×2048 (+bias) per block and stream: 2 × 54 × 25.18 M ≈ 2.72 B parameters ≈ 5.06 GiB in bf16.
#    Split 8 ways, that is 0.63 GiB per device instead of 5.06, so `tp` would drop from 6.65 to about 2.2 GiB per
#    device. Try it with a custom rule list, such as
#    `RULE_SETS["tp"] + [Rule("tp/adaln", r"transformer_blocks\.\d+\.norm1(_context)?\.linear\.(weight|bias)", ("tensor", None))]`.
#    To confirm it, add that rule to `hyv_lib.models.hunyuan_video15.adapter.RULE_SETS` under a new name and compile: the compiler's
#    `arguments` per device should fall by the same amount (and it will show whether the modulation output now needs
#    a collective).
# 3. Here the sequence is long (about 114k tokens) while the model is modest (8.3B), so activations dominate and the
#    weights fit on one GPU. Ulysses keeps the weights whole, which means no all-reduce after every matmul. Per
#    block it moves only the attention inputs and outputs, and each all-to-all sends 1/N of them to each peer.
#    At 720p on 8 devices that is about 20 GiB per device per step against about 164 GiB for plain TP on `tensor=8`
#    (the derivation above). The price is memory: each GPU holds all 15.5 GiB of weights.
# 4. With `data=2` each device holds one sample, $B = 1$. Each block all-reduces two $[1, N, 2048]$ bf16 tensors per
#    stream, $2048 \cdot 2 = 4096$ bytes per token, and the context stream counts in 53 blocks:
#
#    $$
#    2 \cdot 4096 \cdot (54 \cdot 111{,}600 + 53 \cdot 1{,}985) = 49{,}368{,}268{,}800 + 861{,}839{,}360
#    = 50{,}230{,}108{,}160 \text{ bytes} = 46.78 \text{ GiB},
#    $$
#
#    the compiler's figure to the byte
#    (`device_plan(real, 720, 1280, 121, {"data": 2, "tensor": 4}, "tp")["collectives"]["all-reduce"]`). A ring
#    all-reduce over $n = 4$ sends $2 \cdot 3/4$ of it: $70.2$ GiB per device, the table's "GiB sent".
# 5. *Where to start.* On a v6e-8, time 5 steps of `python -m hyv_lib stage2 --runtime jax --warmup_steps 2` at 720p/121f with each
#    `--mesh`/`--sharding` pair of the compiled table, and capture one step with `jax.profiler` to see how much of each
#    collective overlaps compute. The compiled reports (`hyv_lib/compiled/tpu_compile.json`) already say each layout
#    fits; the profile answers whether its collectives are hidden.
# :::
