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
# # 9. Fine-tuning HunyuanVideo-1.5
#
# Chapter 7 trained {term}`hyv-tiny` from scratch with a training loop that lives in a notebook: clips in memory,
# one process, a {term}`LoRA` that only that notebook could load. This chapter fine-tunes HunyuanVideo-1.5 the way
# one fine-tunes the 8.3B model, with `hyv_lib`'s commands, and runs them live on hyv-tiny:
#
# 1. **The recipe at real size**: a `data.json` of clips, their {term}`VAE` latents and text embeddings extracted
#    once, training on those features with the weights sharded and activations recomputed, a LoRA, and the LoRA
#    merged for inference. What MindSpeed-MM's guides and the official trainer do, and the `hyv_lib` command for
#    each step.
# 2. **What fits where**: the train step of the 8.3B {term}`DiT` compiled by the TPU compiler for v5e-8, v6e-8 and
#    v5p-8 slices, read from saved reports, beside the planner's memory model; and why {term}`remat` and
#    {term}`FSDP` are not optional.
# 3. **Live on hyv-tiny**: teach it a colour it has never seen. Clips of orange shapes (and of colours it knows) go
#    into mp4 files and a `data.json`; `extract_features`, `train --lora_rank 16` and `generate --lora` run
#    in-process; the colour of held-out captions is read before and after.
# 4. **A new motion**: the same question for a direction hyv-tiny never saw, "up-right", across training settings
#    and seeds: what teaches it, what that costs the directions it knew, and the recipe that does both for every
#    seed tried (now hyv-tiny's training defaults).
#
# :::{figure} ../book/figures/09_fine_tuning_pipeline.svg
# :name: fig-09-fine-tuning-pipeline
#
# The fine-tuning path this chapter teaches. A `data.json` lists the clips; `extract_features` runs the VAE encoder
# and the text encoders once per clip and writes a features folder; `train --lora_rank R` trains a LoRA on the
# attention projections of both streams in every block, with the torch runtime (FSDP2) or the JAX one (a jitted
# step, FSDP and a sequence axis on a mesh, each block rematerialised); `generate --lora` merges the LoRA file into
# the weights as they load. The gate probes held-out captions before and after the LoRA and asks for the new colour
# in at least 6 of 8 for every training seed. `compile --train` checks, without a TPU, whether the step fits a
# slice.
# :::
#
# The whole chapter runs on a 2-core CPU in about two minutes.

# %% tags=["parameters"]
import os

# The live part (the last section) runs on hyv-tiny (tiny_trained), the only model this CPU can fine-tune. With a real
# preset (HYV_PRESET=720p_t2v and HYV_MODEL_PATH=...), the chapter prints the commands it would run for that preset
# instead of running them, and the memory sections describe that preset at HYV_HEIGHT x HYV_WIDTH x HYV_VIDEO_LENGTH
# (default: its 720p or 480p size, 121 frames); HYV_RUNTIME and HYV_MESH go into the printed train command.
PRESET = os.environ.get("HYV_PRESET", "tiny_trained")
MODEL_PATH = os.environ.get("HYV_MODEL_PATH") or None
RUNTIME = os.environ.get("HYV_RUNTIME", "jax")  # the printed real-size train command's runtime: jax | torch
MESH = os.environ.get("HYV_MESH") or None  # e.g. data=1,sequence=8 (FSDP over every device; default: one per chip)
HEIGHT = int(os.environ.get("HYV_HEIGHT", 0)) or None
WIDTH = int(os.environ.get("HYV_WIDTH", 0)) or None
VIDEO_LENGTH = int(os.environ.get("HYV_VIDEO_LENGTH", 0)) or None
PROBE_STEPS = int(os.environ.get("HYV_STEPS", 0)) or None  # denoising steps of the live probe (default: the preset's)
LORA_STEPS = int(os.environ.get("HYV_LORA_STEPS", "500"))  # optimizer steps of the live LoRA
from hyv_lib.notebook.display import settings_not_used  # noqa: E402

_ = settings_not_used({"HYV_ATTENTION": "training runs the torch runtime's exact attention (and Splash in the compiled "
                                        "TPU step); there is no choice to make here"})

# %%
import collections
import glob
import json
import re
import shutil
import tempfile
import time
import warnings

warnings.filterwarnings("ignore", message="IProgress not found")
warnings.filterwarnings("ignore", message="os.fork", category=RuntimeWarning)  # ffmpeg started after JAX loaded

import matplotlib.pyplot as plt
import numpy as np
import torch
from IPython.display import display

import hyv_lib
from hyv_lib.base.stats import at_least_chance
from hyv_lib.cli.commands import run
from hyv_lib.models.lora import read_lora
from hyv_lib.notebook.display import frame_grid, html_table
from hyv_lib.pipeline.video_io import read_mp4, write_mp4
from hyv_lib.planning.hardware import CHIPS, GIB
from hyv_lib.planning.train_memory import (
    TRAIN_LAYOUTS,
    activation_phases,
    lora_parameters,
    state_bytes,
    train_step_memory,
)
from hyv_lib.planning.train_check import model_of_compiled
from hyv_lib.runtimes.vae import to_uint8_frames
from hyv_lib.tiny import data, motion_gate, quality, train

requested = hyv_lib.get_preset(PRESET)
LIVE = requested.name == "tiny_trained"  # the live fine-tune needs hyv-tiny's weights and its colour reader
real = requested if not requested.is_tiny else hyv_lib.get_preset("720p_t2v")  # the preset sections 1-2 describe
height, width = HEIGHT or real.default_height, WIDTH or real.default_width
frames = VIDEO_LENGTH or 121
print(f"real-size sections: {real.name} at {height}x{width}, {frames} frames; live section: "
      + ("hyv-tiny (tiny_trained)" if LIVE
         else f"not run ({requested.name} is not hyv-tiny; its commands are printed)"))

# %% [markdown]
# ## The recipe at real size
#
# MindSpeed-MM, Huawei's multimodal training suite, documents the whole path for HunyuanVideo in its user guide
# (`examples/hunyuanvideo/README_en.md`, <https://gitcode.com/Ascend/MindSpeed-MM>) and the data and parallel setup
# for HunyuanVideo-1.5 in `examples/hunyuanvideo_1.5/README.md`. Tencent's own trainer for 1.5 is `train.py` in
# <https://github.com/Tencent-Hunyuan/HunyuanVideo-1.5>. Step by step:
#
# | step | MindSpeed-MM's guides | official `train.py` (1.5) | `hyv_lib` |
# |---|---|---|---|
# | data | `data.json`: a list of `{"path", "cap", "num_frames", "fps", "resolution": {"height", "width"}}`, paths relative to the dataset folder | your own dataloader (pixels, caption, optionally pre-encoded latents) | the same `data.json` |
# | features, once | a feature-extraction run saves the VAE latents and text embeddings; frames past `num_frames` are sampled, frames past `max_height` x `max_width` centre-cropped | optional `latents` in the batch | `python -m hyv_lib extract_features`: sharded safetensors with an index, resumable, bad clips reported and skipped |
# | training | tensor parallel, context parallel (Ulysses, ring attention or both), TP-SP, or layer ZeRO-3 instead of TP; selective recomputation with the attention activations offloaded to the host; FSDP2 in the 1.5 guide | FSDP2 per block, sequence parallel (`--sp_size`, default 8), gradient checkpointing per block, flow matching with logit-normal timesteps and shift 3, Muon (or AdamW) | `python -m hyv_lib train --runtime torch` (FSDP2 under `torchrun`) or `--runtime jax` (a jitted step, FSDP over a JAX mesh, each block rematerialised); the official objective, AdamW |
# | LoRA | an I2V LoRA script; only the LoRA weights are saved | peft LoRA, r = 8, alpha = 16, on every linear layer by default | `train --lora_rank R`: `pytorch_lora_weights.safetensors` in diffusers' format |
# | merge, convert | `mm-convert ... merge_lora_to_base` writes merged weights | | `generate --lora FILE` (and `load_pipeline(lora=...)`) merges it before the weights are placed or sharded |
#
# Two things in that table decide whether a run fits at all, and the next section measures both. *Feature extraction*
# takes the text encoders (Qwen2.5-VL's 7B and ByT5) and the VAE out of the training step: they run once per clip
# instead of once per step, and their weights are not on the training devices. *Recomputation and sharding* decide
# the activations and the optimizer state, which, as the compiled step shows, dwarf the bf16 weights.
#
# With `hyv_lib` the same four commands run at every size; only the preset, the model folder and the devices
# change. For the preset this chapter describes (with the reader's `HYV_RUNTIME` and `HYV_MESH` in the train
# command; LoRA rank 8 and alpha 16 as the official trainer's):

# %%
model = MODEL_PATH or f"/path/to/{real.name}"  # a diffusers-format folder (hunyuanvideo-community/...)
mesh = MESH or ("data=1,sequence=8" if RUNTIME == "jax" else None)  # FSDP over 8 devices, as compiled below
mesh_flag = f" --mesh {mesh}" if mesh else ""
commands = [
    f"python -m hyv_lib extract_features --data_json dataset/data.json --preset {real.name} --model_path {model} "
    f"--num_frames {frames} --max_height {height} --max_width {width} --output_dir features",
    f"python -m hyv_lib train --features features --preset {real.name} --model_path {model} --lora_rank 8 "
    f"--lora_alpha 16 --steps 2000 --learning_rate 1e-4 --runtime {RUNTIME}{mesh_flag} --checkpoint_every 200 "
    "--output_dir lora",
    f"python -m hyv_lib generate --preset {real.name} --model_path {model} --prompt \"...\" --lora lora "
    f"--height {height} --width {width} --video_length {frames} --output_dir video",
    f"python -m hyv_lib compile --preset {real.name} --topology v6e:2x4 --train lora --lora_rank 8 "
    f"--video_length {frames} --json   # does the step fit a v6e-8? (no TPU needed)",
]
print("\n".join(commands))

# %% [markdown]
# `train` writes a checkpoint with the optimizer state and every random generator's state every
# `--checkpoint_every` steps, so a killed run restarted with the same command continues with the same losses, and
# `train_log.jsonl` gets one line per step. `--full` trains every weight instead and writes a diffusers transformer
# folder.
#
# ## What fits where
#
# `python -m hyv_lib compile --train` builds the 8.3B DiT on the meta device, attaches the LoRA (or trains every
# weight), and hands the *whole* update (forward, backward, AdamW) to the TPU compiler for a named slice, with no
# TPU present (chapter 8 does the same for the inference step). The weights are bf16; each trained parameter keeps
# an fp32 master copy and two fp32 AdamW moments; the blocks are rematerialised; FSDP shards every weight over the
# slice and the video tokens are split over its devices (a `sequence` axis). `benchmarks/train_compile.py` ran it for
# three slices at 480p and 720p with 121 frames and saved the reports; the next cell reads the newest, puts the
# planner's model (`hyv_lib.planning.train_memory`) for the same setting beside each, and prints the command that
# made each row.

# %%
runs = {}
reports = sorted(glob.glob("../benchmarks/results/train_compile_*.json"))
if reports:
    runs = json.load(open(reports[-1]))["runs"]
    print(f"{os.path.basename(reports[-1])}: {len(runs)} compiles (python benchmarks/train_compile.py)")
else:
    print("no saved train-step compiles yet: python benchmarks/train_compile.py writes benchmarks/results/")
groups = {}  # (height, slice, what trains, frames) -> its compiles, by batch
for key, r in runs.items():
    what = f"LoRA r{r['lora']['rank']}" if r["lora"] else "every weight"
    groups.setdefault((r["size"]["height"], key.split("/")[0], what, r["size"]["video_length"]), {})[r["batch"]] = r
rows = []
for (h, slice_, what, f), by_batch in sorted(groups.items()):
    r = by_batch.get(1) or by_batch[min(by_batch)]
    b = r["per_device_bytes"]
    fitting = [n for n, x in by_batch.items() if x["fits"]]
    refused = [n for n, x in by_batch.items() if not x["fits"] and n > max(fitting, default=0)]
    row = {"slice": slice_, "size": f"{h}p x {f}", "trains": what,
           "HBM GiB": f"{r['hbm_available_per_device'] / GIB:.1f}"}
    column, note = "batch 1: compiler GiB (state + temp)", "" if r["batch"] == 1 else f"batch {r['batch']}: "
    if b.get("arguments") is None:  # the compiler refused it: its message says how much it needed
        row.update({column: f"{note}{b['total'] / GIB:.1f} needed", "model GiB": "", "model / compiler": ""})
    else:
        m = model_of_compiled(r)
        row.update({column: f"{note}{b['total'] / GIB:.1f} ({b['arguments'] / GIB:.1f} + "
                            f"{b['temporaries'] / GIB:.1f})",
                    "model GiB": f"{m['model_total'] / GIB:.1f}", "model / compiler": f"{m['model_total_ratio']:.2f}"})
    row["largest batch that fits (compiled)"] = (str(max(fitting)) if fitting else "none") + (
        f" ({min(refused)} does not)" if refused else "")
    rows.append(row)
if rows:
    display(html_table(rows))

# %%
for key, r in sorted(runs.items()):
    if r["batch"] == 1:  # the batch searches' commands differ only in --batch_size
        print(f"{key:26s} {r['command']}")

# %% [markdown]
# Read the table by its columns. *State* is what the step keeps from one step to the next (the bf16 weights, the
# trained parameters' fp32 master copies and AdamW moments, the batch), sharded over the slice; *temp* is what the
# compiled program allocates while it runs, mostly activations. A LoRA trains about 14 million parameters (0.17% of
# 8.3 billion, next cell), so its state is the frozen weights' share and little else, and at batch 1 it fits every
# slice listed; full fine-tuning adds 16 bytes of fp32 state per parameter, and the v5e-8's 16 GiB per chip refuse it.
# Where `benchmarks/train_compile.py` searched larger batches, the last column says where the activations, which grow
# with the batch while the state does not, stop fitting. The planner's model is lower than the compiler in every
# row it can be compared on (the "model / compiler" column): it counts the tensors the step needs, and the compiled
# program holds more at its peak, so near the limit the compiler's word decides.
#
# Why the recipe shards and recomputes at all: the planner splits one device's share of a 720p step into what it
# keeps (weights, master copies, moments) and what the backward pass needs (activations).

# %%
lora = lora_parameters(real, 8)
print(f"LoRA r8 on {lora['modules']} attention projections: {lora['params']:,} parameters "
      f"({lora['params'] / state_bytes(real, 'full')['params']:.2%} of the DiT)")
for trainable in ("lora", "full"):
    s = state_bytes(real, trainable, lora_rank=8, precision="mixed")
    print(f"{trainable:4s}: bf16 weights {s['params'] * 2 / GIB:5.1f} GiB, fp32 master + moments of the trained "
          f"parameters {(s['master'] + s['optimizer']) / GIB:5.1f} GiB, fp32 gradients {s['gradients'] / GIB:5.1f} GiB")
acts = {remat: activation_phases(real, height, width, frames, trainable="lora", lora_rank=8, remat=remat)
        for remat in (True, False)}
print(f"\none sample of {height}x{width}x{frames} ({acts[True]['tokens_per_device']:,} video tokens), "
      f"LoRA, on one device:")
for remat, a in acts.items():
    p = a["parts"]
    print(f"  remat {'on ' if remat else 'off'}: 54 blocks hold {p['held'] / GIB:6.1f} GiB for the backward, peak "
          f"{a['peak'] / GIB:6.1f} GiB ({a['peak_phase']})")
print(f"  one block: its inputs {acts[True]['parts']['block_inputs'] / GIB:.2f} GiB, everything its backward needs "
      f"{(acts[True]['parts']['block_saved'] + acts[True]['parts']['block_inputs']) / GIB:.2f} GiB")

# %% [markdown]
# Without remat every block keeps what its backward pass reads: the normalised inputs, q and k before and after
# their norms, the attention output, the MLP's wide activations. Over 54 blocks that is the "remat off" line, far
# beyond any accelerator. With remat a block keeps only its input and recomputes the rest when the backward pass
# reaches it, so the 54 blocks hold 54 inputs (the "remat on" line), and one block's full set comes on top while
# that block's backward runs: about one extra forward pass of compute for a factor of about 18 in what the blocks
# hold (the two "hold" figures). The official trainer and MindSpeed-MM
# both checkpoint every block for this reason.
#
# That is a model. `benchmarks/gpu_check.py --sections train` measured the real thing: the 8.3B DiT's train step
# (random bf16 weights, `hyv_lib`'s torch step, rank-16 LoRA or every weight) on one NVIDIA H200, torch's peak
# allocated memory beside the step time. The next cell reads that file and recomputes the planner's figure for each
# row now (`train_step_memory` with the torch recipe on a GPU; it was not fitted to these runs).

# %%
measured = sorted(glob.glob("../benchmarks/results/gpu_check_*_train.json"))
if measured:
    check = json.load(open(measured[-1]))
    command = re.sub(r"--output \S+/", "--output $OUT/", check["command"])  # the GPU machine's output folder
    print(f"{os.path.basename(measured[-1])}: {command}")
    rows = []
    for r in check["sections"]["train"]["rows"]:
        h, w, f = r["size"]
        model = train_step_memory("720p_t2v" if h == 720 else "480p_t2v", height=h, width=w, video_length=f,
                                  trainable=r["trainable"], lora_rank=r["lora_rank"] or 16, remat=r["remat"],
                                  precision="torch", device="gpu")
        planned = model["allocated"] / GIB
        rows.append({"step (one H200, batch 1)": r["name"], "s per step": f"{r['s_per_step']:.2f}",
                     "measured peak GiB": f"{r['peak_allocated_gib']:.2f}", "planner GiB": f"{planned:.2f}",
                     "planner / measured": f"{planned / r['peak_allocated_gib']:.3f}"})
    display(html_table(rows))
else:
    print("no saved GPU training measurements: python benchmarks/gpu_check.py --sections train writes them")

# %% [markdown]
# The planner's figure and the card's peak agree row by row (last column), which is what lets the layouts below,
# which nobody has measured, be read from the model. The third row is the remat comparison on real hardware:
# without recomputation the 480p, 33-frame LoRA step peaks at several times the memory of the first LoRA row, and runs
# faster, because the backward pass no longer repeats each block's forward. At 720p and 121 frames even the LoRA step
# with remat needs two thirds of an H100's 80 GiB.
#
# Remat alone does not make every 720p step fit one chip: the LoRA step still peaks at about 50 GiB (more than a v5e
# or v6e chip holds, within a v5p's 95 GiB), and full fine-tuning's optimizer state is 16 bytes per parameter. The figure below is the planner's per-device peak for the layouts of
# its table (batch 1; `mixed` is the TPU recipe of the compiled step): for each layout its total (dark gray, the
# number beside it) and, under it, the three parts that add up to it, with the HBM of one device of each kind
# (dotted). FSDP divides the state by the number of devices, and Ulysses (the `sequence` axis) divides the
# activations.

# %%
layouts = {lay.name: train_step_memory(real, height=height, width=width, video_length=frames,
                                        trainable=lay.trainable, lora_rank=8, remat=lay.remat, fsdp=lay.fsdp,
                                        data_parallel=lay.data_parallel, sequence_parallel=lay.sequence_parallel,
                                        precision="mixed", device="tpu") for lay in TRAIN_LAYOUTS}
parts = {"total (the peak)": lambda m: m["total"],
         "weights (bf16)": lambda m: m["weights"] + m["buffers"],
         "master + moments (fp32)": lambda m: m["master"] + m["optimizer"],
         "activations, gradients, batch": lambda m: m["transient"] + m["inputs"]}
colours = ("#444444", "#3b73b9", "#f0a040", "#5aa05a")
fig, ax = plt.subplots(figsize=(9, 4.6))
rows_y = np.arange(len(layouts))
bar = 0.8 / len(parts)
for k, ((label, part), colour) in enumerate(zip(parts.items(), colours)):  # side by side: a log axis cannot stack
    values = np.array([part(m) / GIB for m in layouts.values()])
    ax.barh(rows_y + (k - (len(parts) - 1) / 2) * bar, values, height=bar, color=colour, label=label)
    if k == 0:
        for y, v in zip(rows_y, values):
            ax.text(v * 1.05, y - 1.5 * bar, f"{v:.0f} GiB", va="center", fontsize=8)
for chip in ("v5e", "v6e", "v5p"):
    spec = CHIPS[chip]
    hbm = spec.hbm_bytes / spec.devices_per_chip / GIB
    ax.axvline(hbm, color="gray", ls=":", lw=1)
    ax.text(hbm, 1.01, f"{chip}\n{hbm:.0f} GiB", transform=ax.get_xaxis_transform(), ha="center", va="bottom",
            fontsize=8, color="gray")
ax.set_yticks(rows_y, list(layouts))
ax.set(xscale="log", xlim=(0.1, 2000), xlabel="GiB per device (log scale)")
ax.set_title(f"{real.name}, {height}x{width}x{frames}: planner's train-step peak per device, and its parts",
             pad=28, fontsize=10)
ax.invert_yaxis()
ax.legend(fontsize=8, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.14), frameon=False)
fig.tight_layout()
plt.show()
html_table([{"layout": name, "GiB per device": f"{m['total'] / GIB:.1f}", "peak in": m["peak_phase"]}
            for name, m in layouts.items()])

# %% [markdown]
# The first two rows are the remat comparison again, now with the weights. The third row is full fine-tuning on
# one device, more than any of these chips holds. Sharding it over 8 devices (FSDP, fourth row) brings the
# state down to about an eighth, and splitting the 720p sequence over the same 8 devices (Ulysses, fifth row) cuts
# the activations about as much; the compiled slices above use both. That is the recipe's "FSDP plus context parallel plus
# recomputation", derived rather than assumed.
#
# ## Live: teaching hyv-tiny a colour
#
# hyv-tiny was trained on five colours (chapter 7). Orange is not one of them, and its frozen text encoder has never
# seen the word: its tokenizer spells "orange" with pieces it knows. The data first. Before any training, check what
# the VAE does with orange: the DiT can only learn latents the decoder turns back into orange. One clip per
# background goes through the shipped VAE, and `quality.read_video` reads the colour of the shape that comes back,
# with orange added to its palette.

# %%
if LIVE:
    torch.set_num_threads(1)  # tiny models: one thread is steadier than two on a shared 2-core CPU
    pipe = hyv_lib.load_pipeline("tiny_trained", progress=False)
    palette = {**data.COLORS, "orange": data.UNSEEN_COLORS["orange"]}
    checks = []
    for background in data.BACKGROUNDS:
        clip = torch.from_numpy(data.render_clip(data.Combo("orange", "circle", "right", background), seed=3))
        back = to_uint8_frames(train.reconstruct(pipe.components["vae"], clip[None])[0])
        rgb = quality.foreground_rgb(back)
        checks.append({"background": background, "shape's RGB after the VAE": [round(float(v), 2) for v in rgb],
                       "read as": quality.read_video(back, colors=palette).color})
    display(html_table(checks))
else:
    print(f"{requested.name}: the live section runs only on hyv-tiny (tiny_trained); at real size the commands of "
          "the first section are what it would run")

# %% [markdown]
# On black and purple the decoded shape stays orange. On gray it comes back a dull red (its blue channel raised
# towards the background's), and reads as red. Clips of orange on gray would teach the DiT latents that decode
# red, so the orange clips here use the black and purple backgrounds only.
#
# The data, as a reader would bring it: 16 orange captions (3 shapes x 4 directions x 2 backgrounds, every third
# held out), two renders each, and one clip each of 16 known-colour captions from hyv-tiny's training set, for
# {term}`prior preservation`. Every clip is written as an H.264 mp4 and listed in a MindSpeed-style `data.json`. The
# 8 held-out orange captions and 9 held-out known-colour captions are the probe.

# %%
ORANGE = [data.Combo("orange", s, d, b) for s in data.SHAPES for d in data.DIRECTIONS for b in ("black", "purple")]
held_out_orange = ORANGE[0::3]
train_orange = [c for c in ORANGE if c not in held_out_orange]
train_known, held_out_known = data.split_combos()
prior = train_known[::8][:16]
probe = held_out_orange + held_out_known[::5][:9]
workdir = tempfile.mkdtemp(prefix="hyv_ch9_")  # removed at the end of the chapter
if LIVE:
    dataset = os.path.join(workdir, "dataset")
    os.makedirs(os.path.join(dataset, "videos"))
    # First renders, prior clips, second renders (the order the chapter's rates were measured with).
    clips = [(c, 0) for c in train_orange] + [(c, 0) for c in prior] + [(c, 1) for c in train_orange]
    entries = []
    for i, (combo, _) in enumerate(clips):
        path = f"videos/{i:03d}.mp4"
        write_mp4(to_uint8_frames(data.render_clip(combo, seed=1000 + i)), os.path.join(dataset, path),
                  fps=pipe.preset.fps)
        entries.append({"path": path, "cap": combo.caption, "num_frames": data.FRAMES, "fps": pipe.preset.fps,
                        "resolution": {"height": data.HEIGHT, "width": data.WIDTH}})
    with open(os.path.join(dataset, "data.json"), "w") as f:
        json.dump(entries, f, indent=1)
    print(f"{len(entries)} clips ({2 * len(train_orange)} orange, {len(prior)} prior) in dataset/videos (a temporary folder); "
          f"data.json entry 0:\n{json.dumps(entries[0])}")
    fig, axes = plt.subplots(1, 6, figsize=(12, 1.3))
    for ax, i in zip(axes, (0, 5, 10, 16, 24, 30)):
        ax.imshow(read_mp4(os.path.join(dataset, entries[i]["path"]))[0][4])
        ax.set_title(entries[i]["cap"].replace(" moving", "\nmoving"), fontsize=6)
        ax.axis("off")
    plt.show()

# %% [markdown]
# `extract_features` reads each mp4 with ffmpeg, crops it to the preset's bucket (64x112 for hyv-tiny), encodes it
# with the VAE (latents times the scaling factor) and its caption with the two text encoders, and writes shards of
# safetensors with an index. It runs in-process here through `hyv_lib.cli.commands.run`, the function behind
# `python -m hyv_lib`.

# %%
if LIVE:
    features = os.path.join(workdir, "features")
    start = time.perf_counter()
    code = run(["extract_features", "--data_json", os.path.join(dataset, "data.json"), "--preset", "tiny_trained",
                "--output_dir", features, "--quiet"])
    index = json.load(open(os.path.join(features, "features.safetensors.index.json")))
    shards = sorted(set(index["weight_map"].values()))
    print(f"exit code {code}: {len(index['clips'])} clips in {time.perf_counter() - start:.0f} s, "
          f"{len(index['failed'])} failed; {len(shards)} files ({', '.join(shards)})")
    print(f"latents per clip {index['clips'][0]['latent_shape']} (C, T, h, w); keys of one clip: "
          + ", ".join(k.split(".", 1)[1] for k in index["weight_map"] if k.startswith(index["clips"][0]["id"])))

# %% [markdown]
# Nine frames of 64x112 become a latent of 16 channels, 3 latent frames of 4x7: the 16x/4x compression of the real
# VAE. Training reads only this folder; the VAE and the text encoders are not loaded again.
#
# `train --lora_rank 16 --lora_targets attn` attaches a rank-16 adapter (peft, through diffusers' `add_adapter`) to
# the attention projections of both streams in every block, and trains only it with HunyuanVideo-1.5's flow-matching
# objective: logit-normal noise levels with the shift of 3, caption dropout to the empty prompt for {term}`CFG`,
# AdamW, a linear warmup. The settings differ from chapter 7's LoRA: that notebook's loop decays the learning rate to
# zero and draws the noise level uniformly, while this cell asks `train` for the official trainer's constant rate
# after warmup (`--lr_schedule constant`) and its caption-dropped clips trained on their own data (`--dropout_target
# data`; hyv-tiny's own defaults, at the end of the chapter, differ); 500 steps
# of 8 clips at 5e-3, training seed 0, is what taught orange in the measurements of `tests/test_finetune_gate.py`
# (other seeds, below, learn less).

# %%
if LIVE:
    lora_dir = os.path.join(workdir, "lora")
    start = time.perf_counter()
    code = run(["train", "--features", features, "--preset", "tiny_trained", "--lora_rank", "16",
                "--steps", str(LORA_STEPS), "--learning_rate", "5e-3", "--batch_size", "8", "--warmup_steps", "20",
                "--lora_targets", "attn", "--lr_schedule", "constant", "--dropout_target", "data",
                "--no_gradient_checkpointing", "--output_dir", lora_dir, "--quiet"])
    seconds = time.perf_counter() - start
    log = [json.loads(line) for line in open(os.path.join(lora_dir, "train_log.jsonl"))]
    weights = read_lora(lora_dir)
    size = os.path.getsize(os.path.join(lora_dir, "pytorch_lora_weights.safetensors"))
    print(f"exit code {code}: {len(log)} steps in {seconds:.0f} s; loss {np.mean([r['loss'] for r in log[:25]]):.3f} "
          f"-> {np.mean([r['loss'] for r in log[-25:]]):.3f} (mean of 25 steps)")
    print(f"{os.path.basename(weights.path)}: {len(weights.layers)} adapted layers, rank {weights.rank}, "
          f"{sum(l.down.numel() + l.up.numel() for l in weights.layers.values()):,} parameters, {size / 1e3:.0f} kB")
    losses = np.array([r["loss"] for r in log])
    smooth = np.convolve(losses, np.ones(25) / 25, mode="valid")
    fig, ax = plt.subplots(figsize=(6, 2.6))
    ax.plot(np.arange(1, len(losses) + 1), losses, lw=0.5, alpha=0.4, label="each step")
    ax.plot(np.arange(25, len(losses) + 1), smooth, label="mean of 25 steps")
    ax.set(xlabel="step", ylabel="flow-matching loss", title="train --lora_rank 16 on hyv-tiny")
    ax.legend(fontsize=8)
    fig.tight_layout()
    plt.show()

# %% [markdown]
# The loss falls by less than a fifth (the two means of 25 steps printed above), and says little by itself: most of a
# flow-matching loss is the noise the model cannot predict, and a colour is a small part of each clip. Whether the adapter learned anything shows in what the model draws.
#
# The probe: the 17 held-out captions, generated with the same seeds with and without the adapter,
# `load_pipeline("tiny_trained", lora=...)` for the second (the LoRA is merged into the weights as it loads), and
# each video's colour read with orange in the palette, so that a known colour drifting to orange counts as a miss.

# %%
if LIVE:
    def colour_probe(pipeline):
        videos = [pipeline.generate(c.caption, seed=7 + i, num_inference_steps=PROBE_STEPS, progress=False).frames
                  for i, c in enumerate(probe)]
        return videos, [quality.read_video(v, colors=palette).color for v in videos]

    start = time.perf_counter()
    before_videos, before = colour_probe(pipe)
    tuned = hyv_lib.load_pipeline("tiny_trained", lora=lora_dir, progress=False)
    after_videos, after = colour_probe(tuned)
    n = len(held_out_orange)
    rates = {name: (sum(r == c.color for r, c in zip(reads[:n], probe[:n])),
                    sum(r == c.color for r, c in zip(reads[n:], probe[n:]))) for name, reads in
             (("before", before), ("after", after))}
    print(f"{2 * len(probe)} videos ({PROBE_STEPS or pipe.preset.default_steps} steps) in "
          f"{time.perf_counter() - start:.0f} s")
    display(html_table([{"probe": f"orange, {n} held-out orange captions", "before LoRA": f"{rates['before'][0]}/{n}",
                 "after LoRA": f"{rates['after'][0]}/{n}"},
                {"probe": f"colour right, {len(probe) - n} held-out known-colour captions",
                 "before LoRA": f"{rates['before'][1]}/{len(probe) - n}",
                 "after LoRA": f"{rates['after'][1]}/{len(probe) - n}"}]))
    display(html_table([{"caption": c.caption, "read before": b, "read after": a}
                        for c, b, a in zip(probe, before, after)]))
    known = list(zip(probe[n:], before[n:], after[n:]))
    lost = [f"{c.color} -> {a}" for c, b, a in known if b == c.color and a != c.color]
    gained = [f"{b} -> {c.color}" for c, b, a in known if b != c.color and a == c.color]
    print(f"known-colour captions right before the adapter and wrong after: {', '.join(lost) or 'none'}; "
          f"wrong before and right after: {', '.join(gained) or 'none'}")

# %% [markdown]
# Before the adapter, no held-out orange caption comes out orange: the model draws colours it knows, mostly blue
# and green, or no shape at all (`None`). After it, the held-out orange captions come out orange (8 of 8 in the run
# above), for combinations of shape, direction and background it never saw in orange. The known-colour row is the
# one prior preservation protects; compare it before and after, caption by caption in the second table, rather
# than with hyv-tiny's gates (other seeds, and orange in the palette here: a dull yellow can read as orange). Its
# count hides changes in both directions; the line under the second table names them: the known-colour captions the
# adapter turned wrong, and those it turned right.
#
# One held-out caption, frame by frame, through the command line this time: `generate` without and with `--lora`,
# same seed. `generation_config.json` records the LoRA it merged; the last line gives the shape's colour read from
# each video and its mean RGB, to set beside the clips' orange, (1.0, 0.5, 0.05), and the VAE's round trip of it in
# the first table of this section.

# %%
if LIVE:
    caption = held_out_orange[0].caption
    shown = {}
    for name, extra in (("before", []), ("after", ["--lora", lora_dir])):
        out = os.path.join(workdir, f"generate_{name}")
        assert run(["generate", "--preset", "tiny_trained", "--prompt", caption, "--seed", "7",
                    "--output_dir", out, "--quiet", *extra]) == 0
        shown[name] = read_mp4(os.path.join(out, "output_video.mp4"))[0]
    config = json.load(open(os.path.join(workdir, "generate_after", "generation_config.json")))
    print({k: (os.path.basename(v) if k == "lora" else v) for k, v in config.items() if k.startswith("lora")})
    frame_grid(shown["before"], columns=5, title=f"before: {caption}", scale=1.3)
    frame_grid(shown["after"], columns=5, title=f"after (--lora): {caption}", scale=1.3)
    print("; ".join(f"{name}: {quality.read_video(v, colors=palette).color}, RGB "
                    f"{[round(float(x), 2) for x in quality.foreground_rgb(v)]}" for name, v in shown.items()))

# %% [markdown]
# The learned orange is a yellower one than the clips' (its green channel in the last line). How reliable is all
# this? One training seed ran live above. Four seeds of it, through the same three commands with the probe at 10
# denoising steps and 8 known-colour captions, take several minutes here, so the next cell reads what
# `benchmarks/finetune_gate.py` measured (2-core CPU): chapter 9's recipe on these 48 clips, and the plain
# command a user tries first (`train --lora_rank 8 --steps 500`, every other setting at its default) on 12 orange clips alone (12 of the 16
# training captions, one clip each). Each cell gives the held-out orange captions drawn orange, and in brackets the
# known-colour captions drawn in their own colour.

# %%
def per_seed(seeds, key="new"):
    return ", ".join(str(r[key]) for r in seeds)


WORDS = {"defaults": "defaults", "cosine": "cosine decay", "linear0": "linear decay", "all": "every linear layer",
         "attnmlp": "attention + MLP", "nodrop": "caption dropout 0", "uniform": "uniform noise levels",
         "uncondbase": "empty prompt → base model", "cosine0": "cosine decay to 0", "word": "the word",
         "diagonally": "'diagonally'", "attnmlptext": "attention + MLP + text embedder",
         "text": "the caption's path only", "tinydefaults": "hyv-tiny's defaults"}
NUMBERS = {"lr": "lr {}", "bs": "batch {}", "steps": "{} steps", "drop": "caption dropout {}", "shift": "shift {}",
           "ema": "EMA {}", "guided": "guided target {}", "rank": "rank {}", "prior": "prior weight {}",
           "captions": "{} prior captions"}


def readable(name):
    """A sweep configuration's saved name ("issue-lr3e-3-attnmlp") as a label ("lr 3e-3, attention + MLP")."""
    parts = re.findall(r"lr[\d.]+e-\d+|[a-z]+[\d.]*", name.split("-", 1)[1].replace("cyanword-", ""))
    labels = []
    for part in parts:
        prefix, number = re.fullmatch(r"(lr|[a-z]+?)([\d.]+(?:e-\d+)?)?", part).groups()
        labels.append(NUMBERS[prefix].format(number) if number and prefix in NUMBERS else WORDS.get(part, part))
    return ", ".join(labels)



gate_runs = sorted(glob.glob("../benchmarks/results/finetune_gate_*.json"))
if gate_runs:
    measured = json.load(open(gate_runs[-1]))
    print(f"{os.path.basename(gate_runs[-1])}: {measured['machine']}")
    rows = []
    for name, r in measured["recipes"].items():
        b = r["before"]
        row = {"recipe": {"gate": "chapter 9's (48 clips)", "issue": "the plain command (12 clips)"}[name],
               "train flags": " ".join(r["train_args"]),
               "before the LoRA": f"{b['new']}/{b['new_total']} ({b['known']}/{b['known_total']})"}
        row.update({f"seed {x['seed']}": f"{x['new']}/{x['new_total']} ({x['known']}/{x['known_total']})"
                    for x in r["seeds"]})
        row["criterion met"] = "yes" if r["met"] else "no"
        rows.append(row)
    display(html_table(rows))
else:
    print("no saved gate runs: python benchmarks/finetune_gate.py --output benchmarks/results/... writes them")

# %% [markdown]
# Chapter 9's recipe drew orange for 8, 3, 3 and 4 of the 8 held-out captions with training seeds 0 to 3, and the
# plain command (its flags as recorded, at the official trainer's settings) for none: a new concept that one seed learns and the next does not. A recipe to rely on would give at
# least 6 of 8 for every seed. `tools/finetune_sweep.py` trains a recipe for several seeds on the 12 orange clips (or
# chapter 9's 48) and probes it in-process the same way; the next cell lists every configuration it ran, with what
# it changed against the plain command.

# %%
sweeps = sorted(glob.glob("../benchmarks/results/finetune_sweep_*.json"))
if sweeps:
    sweep = json.load(open(sweeps[-1]))
    extras = {"schedule": "constant", "uncond_target": "data", "ema": 0.0, "guided_target": 0.0, "prior_weight": 0.0}
    reference = {**extras, **next(r for r in sweep["runs"] if r["name"] == "issue-defaults")["recipe"]}
    configs = {}
    for r in sweep["runs"]:
        key = (r["name"], r["dataset"], r.get("word") or "orange")
        configs.setdefault(key, {"recipe": {**extras, **r["recipe"]}, "seeds": []})["seeds"] += r["seeds"]
    rows = []
    for (name, dataset, word), c in configs.items():
        changed = {k: v for k, v in c["recipe"].items() if k in reference and v != reference[k]}
        seeds = sorted(c["seeds"], key=lambda x: x["seed"])
        rows.append({"configuration": readable(name), "clips": {"issue": "12 orange", "chapter9": "chapter 9's 48", "twins": "12 orange + 12 twins"}.get(dataset, dataset) + ("" if word == "orange" else f", word '{word}'"),
                     "changed": ", ".join(f"{k}={v}" for k, v in changed.items()) or "(none)",
                     "seeds": f"{seeds[0]['seed']}-{seeds[-1]['seed']}",
                     "new colour per seed": per_seed(seeds), "known per seed": per_seed(seeds, "known"),
                     "lowest": min(x["new"] for x in seeds)})
    print(f"{os.path.basename(sweeps[-1])}: {len(rows)} configurations; before any LoRA "
          f"{sweep['before']['new']}/8 orange, {sweep['before']['known']}/8 known colours right; the plain command "
          "trains rank 8 for 500 steps at the official trainer's settings (hyv-tiny's defaults until the motion "
          "recipe below)")
    display(html_table(rows))
    print(f"configurations with at least 6 of 8 for every seed: {sum(r['lowest'] >= 6 for r in rows)}")
else:
    print("no saved sweep: python tools/finetune_sweep.py writes benchmarks/results/finetune_sweep_<date>.json")

# %% [markdown]
# Read the table from the top. At the default learning rate, 1e-4 (the official trainer's, for a DiT 2048 wide;
# hyv-tiny's is 64), 500 single-clip steps leave every held-out caption as before: 0 of 8 for every seed, on either
# dataset. From 1e-3 up the adapter learns something, and the spread appears: 1e-3 gave 4, 2, 3, 3; 3e-3 gave 5, 3,
# 3, 4 for seeds 0-3 and 3, 0, 1, 3 for seeds 4-7. Nothing else in the list lifts the lowest seed to 6: a cosine or
# linear decay, a weight average (`ema`), uniform noise levels or a shift of 1, caption dropout of 0, 0.3 or 0.5,
# the feed-forward layers or every linear layer as targets, full rank, batches of 8, 2,000 steps. Nor is it the
# tokenizer: captions that call the same orange clips "cyan", a word hyv-tiny's tokenizer has one token for (and the
# DiT never saw), learned no better than "orange", which it spells in five pieces (the words after it change
# features, the next cell shows, but that is not what decides). Neither did training the empty prompt towards the
# frozen model (`uncond_target=base`) or training the caption's prediction for guidance 4.5 (`guided_target`). Known
# colours mostly drop with the 12 orange clips alone (blue drifts to green, yellow to red) and hold with chapter 9's
# prior clips.
#
# Where the colour gets lost is the next cell's question, from `tools/finetune_diagnostics.py`: the base model and
# four LoRAs (3e-3, seeds 0-3, the 12 orange clips) denoise 6 training clips' own latents, noised to a level sigma,
# with CFG; and the same LoRAs' held-out rate at other guidance scales.

# %%
diagnostics = sorted(glob.glob("../benchmarks/results/finetune_diagnostics_*.json"))
if diagnostics:
    diag = json.load(open(diagnostics[-1]))
    display(html_table([{"model": name, **{f"from sigma {s}": f"{sum(r == 'orange' for r in reads)}/{len(reads)}"
                                           for s, reads in by_start.items()}}
                        for name, by_start in diag["start"]["reads_by_start_sigma"].items()]))
    display(html_table([{"guidance scale": g, "held-out orange per seed": ", ".join(map(str, v))}
                        for g, v in diag["guidance"]["new_colour_by_guidance"].items()]))
    words = diag["tokens"]
    print("'orange' is", words["pieces"]["orange"], "; cosine of the later words' features against a 'red' caption: "
          + ", ".join(f"{w} {v['mean']}" for w, v in words["suffix_cosine_vs_red"].items()))
if sweeps:
    print("the empty prompt (guidance 1, seeds 7-14), before any LoRA:",
          ", ".join(map(str, sweep["before"]["empty_prompt_reads"])))
    for r in configs[("issue-lr3e-3", "issue", "orange")]["seeds"]:
        if "empty_prompt_reads" in r:
            print(f"  after the 3e-3 LoRA of seed {r['seed']}:", ", ".join(map(str, r["empty_prompt_reads"])))
if not diagnostics:
    print("no saved diagnostics: python tools/finetune_diagnostics.py writes them")

# %% [markdown]
# Noised to sigma 0.3, an orange clip stays orange with every LoRA (5 or 6 of 6), where the base model keeps 1 of 6:
# the adapters did learn to draw orange. From pure noise they get it in 0 or 1 of 6 of their own training clips.
# The colour is chosen in the first few steps, where classifier-free guidance multiplies the difference between the
# caption's prediction and the empty prompt's, and the adapters move the empty prompt as well (three of the four
# seeds in the last lines: mostly red and orange where it drew mostly green). Orange lies between two
# colours hyv-tiny knows, red and yellow, so a small error in that difference, amplified 4.5 times, lands on either
# side; no guidance scale in the second table reaches 6 of 8 for every seed either. What seed 0 of chapter 9's recipe
# got is one landing of that lottery; none of the training settings tried here makes it a reliable one.

# %% [markdown]
# ## A new motion: the concept the VAE can draw
#
# Orange fails partly in the VAE, so the same question was asked of a concept the VAE draws as well as anything
# hyv-tiny knows: a direction it never saw. hyv-tiny's shapes move left, right, up or down; the new clips move
# "up-right", at 45 degrees (`hyv_lib.tiny.motion_gate`). The first-hour recipe again: 12 clips (3 shapes x 4 known
# colours), 8 held-out captions that recombine their shapes, colours and backgrounds, and 8 known-direction
# captions hyv-tiny never trained on. The reader follows the shape's centroid from its first to its last frame and
# names the nearest of eight compass directions, so a path at 20 degrees reads "right", not "up-right". The runs
# come from `tools/finetune_sweep.py --gate motion`; the second option, `--dataset prior`, adds 8 clips of hyv-tiny's
# own training captions (two per known direction) to the 12, as chapter 9's colour recipe adds its prior clips
# (`prior4`: 4 of them). The two "text embedder" rows adapted a group defined for those runs only, the text
# embedder and its token refiner beside attention and MLP (its pattern is in the results file's notes).

# %%
motions = sorted(glob.glob("../benchmarks/results/finetune_motion_*.json"))  # one file per sweep session, same probe
if motions:
    sweeps = [json.load(open(path)) for path in motions]
    motion = {"before": next(m["before"] for m in sweeps if "before" in m),
              "runs": [r for m in sweeps for r in m["runs"]]}
    by_recipe = {}
    for r in motion["runs"]:
        entry = by_recipe.setdefault((r["name"], r["dataset"]), {"recipe": r["recipe"], "seeds": {}})
        entry["seeds"].update({s["seed"]: s for s in r["seeds"]})
    base = next(r for r in motion["runs"] if r["name"] == "issue-defaults")["recipe"]
    rows = []
    for (name, dataset), entry in by_recipe.items():
        seeds = [entry["seeds"][k] for k in sorted(entry["seeds"])]
        reference = {"prior_weight": 0.0, **base}  # runs recorded before prior captions had none
        changed = {k: v for k, v in entry["recipe"].items() if k in reference and v != reference[k]}
        label = re.sub(r"^defaults", "the plain command", readable(name)).replace("word, ", "word ")
        rows.append({"configuration": label,
                     "clips": {"issue": "12 up-right", "prior": "12 + 8 prior", "prior4": "12 + 4 prior",
                               "twins": "12 + 12 twins", "drawn": "12 + 12 drawn twins"}[dataset],
                     "changed": ", ".join(f"{k}={v}" for k, v in changed.items()) or "(none)",
                     "seeds": ", ".join(str(x["seed"]) for x in seeds),
                     "up-right per seed": per_seed(seeds), "known per seed": per_seed(seeds, "known"),
                     "lowest": f"{min(x['new'] for x in seeds)} / {min(x['known'] for x in seeds)}"})
    print(f"{', '.join(os.path.basename(m) for m in motions)}: before any LoRA {motion['before']['new']}/8 up-right, "
          f"{motion['before']['known']}/8 known directions right")
    display(html_table(rows))
    print("configurations with at least 6 of 8 up-right and 6 of 8 known for every seed: "
          f"{sum(min(min(x['new'], x['known']) for x in e['seeds'].values()) >= 6 for e in by_recipe.values())}")

    shown = {("issue-defaults", "issue"): "the plain command",
             ("issue-lr3e-3-attnmlp-bs4", "issue"): "lr 3e-3, attention + MLP, batch 4",
             ("issue-lr1e-3-all-bs4", "issue"): "lr 1e-3, every linear layer, batch 4",
             ("prior-lr1e-3-all-bs4", "prior"): "the same + 8 prior clips",
             ("twins-lr3e-3-all-bs8", "twins"): "12 twins, every linear layer, lr 3e-3, batch 8",
             ("twins-lr3e-3-text-bs8-steps1000", "twins"): "12 twins, the caption's path, batch 8, 1,000 steps",
             ("twins-lr3e-3-text-bs8-steps1000-cosine0", "twins"): "the same, cosine decay (hyv-tiny's defaults)"}
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ax.add_patch(plt.Rectangle((5.5, 5.5), 3, 3, color="tab:green", alpha=0.12, lw=0))
    ax.text(8.4, 8.4, "the goal, for every seed", ha="right", va="top", fontsize=8, color="tab:green")
    taken = {}
    for key, label in shown.items():
        if key not in by_recipe:
            continue
        xs, ys = [], []
        for x in by_recipe[key]["seeds"].values():
            point = (x["new"], x["known"])
            shift = 0.13 * taken.get(point, 0)  # seeds that land on the same point sit side by side
            taken[point] = taken.get(point, 0) + 1
            xs.append(point[0] + shift), ys.append(point[1])
        ax.scatter(xs, ys, label=label, s=30, alpha=0.85)
    ax.set_xlabel("held-out captions moving up-right (of 8)")
    ax.set_ylabel("known-direction captions kept (of 8)")
    ax.set_xlim(-0.5, 8.5), ax.set_ylim(-0.5, 8.5)
    ax.set_xticks(range(9)), ax.set_yticks(range(9))
    ax.legend(fontsize=7, loc="lower left")
    ax.set_title("Each point: one training seed's LoRA")
    fig.tight_layout()
    plt.show()

    for key in (("twins-lr3e-3-all-bs8", "twins"), ("twins-lr3e-3-text-bs8-steps1000", "twins"),
                ("twins-lr3e-3-text-bs8-steps1000-cosine0", "twins")):
        if key in by_recipe:
            seeds = list(by_recipe[key]["seeds"].values())
            new, known, total = sum(x["new"] for x in seeds), sum(x["known"] for x in seeds), 8 * len(seeds)
            print(f"{key[0]}: pooled over {len(seeds)} seeds, {new}/{total} up-right ({new / total:.2f}), "
                  f"{known}/{total} known kept ({known / total:.2f})")
    for p in (0.8, 0.88, 0.93):
        print(f"each caption right with probability {p}: 6 of 8 for one seed {at_least_chance(6, 8, p):.2f}, "
              f"for four seeds {at_least_chance(6, 8, p) ** 4:.2f}")
    # Caption by caption over every twins run at a constant 1e-3 to 3e-3: is a miss the seed's or the caption's?
    twin_seeds = [x for (name, dataset), e in by_recipe.items() if dataset == "twins"
                  and e["recipe"]["learning_rate"] <= 3e-3 and e["recipe"]["schedule"] == "constant"
                  and not e["recipe"]["ema"] for x in e["seeds"].values()]
    if twin_seeds:
        rows = []
        for i, combo in enumerate(motion_gate.HELD_OUT):
            reads = [x["reads"][i] for x in twin_seeds]
            misses = collections.Counter(r or "no moving shape" for r in reads if r != "up-right")
            rows.append({"held-out caption": combo.caption, "up-right": f"{reads.count('up-right')} of {len(reads)}",
                         "no moving shape": reads.count(None),
                         "most common miss": misses.most_common(1)[0][0] if misses else "-"})
        display(html_table(rows))
        print("the twins' directions:", dict(collections.Counter(c.direction for c in motion_gate.TWINS)))
    if LIVE:  # hyv-tiny without a LoRA: the hardest caption's shape and background, moving the ways it trained on
        trained_on = set(data.split_combos()[0])
        hard = [c for c in (data.Combo("green", "triangle", d, "gray") for d in data.DIRECTIONS) if c in trained_on]
        own_way = [motion_gate.read_direction(pipe.generate(c.caption, seed=seed, progress=False,
                                                            num_inference_steps=motion_gate.PROBE_STEPS).frames)
                   == c.direction for c in hard for seed in (7, 8, 10, 11)]
        print(f"hyv-tiny without a LoRA, a green triangle on gray moving {', '.join(c.direction for c in hard)} "
              f"(its training captions), seeds 7, 8, 10, 11: {sum(own_way)} of {len(own_way)} move their own way")
else:
    print("no saved motion sweep: python tools/finetune_sweep.py --gate motion writes it")

# %% [markdown]
# Before any LoRA, 1 of the 8 held-out captions moves up-right and 7 of the 8 known ones move their own way. The
# plain command, run at the official trainer's settings (1e-4, batches of 1, the attention projections, a constant
# rate: `train`'s defaults for hyv-tiny until the end of this section), moves 2, 4, 3 and 2 up-right for seeds 0-3
# and keeps 7 known for each: it changes little. Two
# settings matter most, more clips per update and more layers. Batches of 4 at 3e-3 on attention and MLP give 6, 6,
# 4, 5, 5, 7, 6, 5 over seeds 0-7. Adapting every linear layer (`lora_targets=all`, the official trainer's choice)
# at 1e-3 with batches of 4 is the first recipe with at least 6 for every seed: 7, 6, 6, 7. The known captions pay
# for it: 4, 4, 5 and 6 of 8 keep their direction. Twelve clips that all move up-right do not tell the adapter
# whether the motion belongs to the new word or to every caption, and it learns some of both: the known captions it
# gets wrong often gain a part of the new motion (left reads up-left, up reads up-right, down reads down-right) or
# stop moving.
#
# Prior clips tell it, and the known captions hold: with hyv-tiny's own 8 clips beside the 12, 8, 7 and 8 of 8 keep
# their direction. The new motion falls to 4, 2 and 4, and most of its misses now read up or right, the two known
# directions it lies between; the new word also shares its first token, "up", with one of them. Twice the updates,
# 1,000 steps, bring it to 6, 6, 4, 6 with 7, 7, 6, 6 known, one seed short; 1,500
# steps went no further (6 and 5 for seeds 0 and 1, with 5 and 8 known). Calling the motion "diagonally", a word
# without the shared token, did not help (1, 4 and 2 of 8 with the prior clips). No configuration reaches the green
# corner for every seed with these clips.
#
# The prior clips above are other captions. Twins are the same captions with the direction word changed: each of the
# 12 up-right clips gets a clip of its own colour, shape and background moving a direction hyv-tiny trained on
# (`--dataset twins`, `motion_gate.TWINS`: 2 up, 4 right, 4 left, 2 down). A pair that differs in one word says which
# word the motion belongs to. With twins the known captions mostly hold: at 1e-3 to 3e-3 no seed of any recipe kept
# fewer than 5 of 8 (1e-2 broke them: 2 of 8 for one seed), where the 12 clips alone went down to 3 and 4. The new
# motion then needs more clips per update: batches of 8 over every linear layer at 3e-3 move 7, 6, 6 and 7 of 8
# up-right with 6, 5, 7 and 7 known. A new target group, `--lora_targets text`,
# adapts only the caption's path (the text embedder, its refiner, the ByT5 mapping and each block's text stream): it
# reaches the video tokens only through what the caption says to them. With twins it kept 7, 7, 7 and 7 known at 500 steps, as many as
# hyv-tiny itself; batches of 8 and 1,000 steps bring the new motion to 7, 6, 5 and 6 with 7, 8, 7 and 8 kept. Without
# twins the same group moved the known captions (5, 5, 3, 5 kept): the twins, not the layers, keep them. The four
# closest recipes each miss the corner by one caption on one seed.
#
# The misses are not spread evenly over the captions (the table under the binomial lines, every twins run at 1e-3 to
# 3e-3). Each probe video starts from the same noise in every run (seed 7 plus the caption's index), so a caption the
# model finds hard stays hard: "a green triangle moving up-right on a gray background" came out up-right in 12 of 52
# videos, and in most of its misses no moving shape was found at all; three more captions, two of them on gray, were
# right about half the time; the other four in 41 to 49 of 52. The green triangle on gray is hard for hyv-tiny
# itself: moving the three directions it was trained on, at four seeds, it went its own way in 6 of 12 videos (the
# last line under the table). With the green triangle missed and the four reliable ones right, 6 of 8 on every seed
# needs two of the three half-right captions every time.
#
# That is about what chance allows at these rates. Pooled over the four seeds, the two rows in the plot are right for
# 75-81% of the up-right captions and 78-94% of the known ones (the lines under the plot). If each caption came out right
# with probability 0.8, independently, one seed would reach 6 of 8 about 80% of the time and four seeds together
# about 40%; passing nine times in ten takes about 0.93 per caption. Twins are where the two halves stop pulling
# against each other; what was still missing is below.
#
# **A rate that decays.** Every recipe so far kept the learning rate constant after the warmup, the official
# trainer's choice: the adapter saved is wherever the last updates left it, and at 3e-3 the last updates still move
# it. `train --lr_schedule cosine` decays the rate to zero at the last step (diffusers' cosine schedule; `linear` is
# the other shape). On the twins, every linear layer with batches of 8 then keeps 8, 7, 8 and 8 known (6, 5, 7, 7 at
# a constant rate) and moves 8, 6, 7 and 5 up-right; an average of the last weights (EMA 0.99, a setting of the
# sweep only) does about the same, 7, 7, 7, 5 up-right with 7, 8, 8, 8 known. Seed 3 stays one caption short in
# both. The caption's path with batches of 8, 1,000 steps and the cosine decay moves 8, 6, 7 and 7 of 8 up-right
# with 8, 7, 7 and 8 known for seeds 0-3, and 7, 7, 8, 6 with 7, 8, 6, 7 for seeds 4-7: all eight seeds in the
# green corner, the first recipe here to get there. Pooled over the eight seeds that is 56 of 64 up-right and 58 of
# 64 known (the third pooled line). At 0.88 per caption one half passes on four seeds about 78% of the time (the
# binomial lines): eight passing seeds out of eight is a good recipe, not a guarantee.
#
# What did not get there: fewer updates (500 steps of 8: 6, 4, 7 up-right for seeds 0-2; 500 of 16: 8, 5), a higher
# rate (5e-3 over every linear layer: 8, 6, 7, 4), 1,000 steps over every linear layer (7, 6, 6, 5). Without twins
# the known captions go again, decay or not: on the 12 clips alone every linear layer kept 5, 4, 4, 6 and the
# caption's path 6 and 3 (seeds 0 and 1). Twins drawn by hyv-tiny itself instead of rendered ones (`python -m
# hyv_lib prior_clips`, the model's own clip of each caption with a known word, as DreamBooth draws its class images)
# failed on seed 0: 5 up-right and 3 known. hyv-tiny moves 8 of those 12 twin captions the way they say, and the
# adapter learns the other four paths as well.
#
# **Prior captions: keeping without clips.** What a twin gives the adapter is a second caption for the same kind of
# noisy latents, and the answer for it. For a caption it knows, the frozen model already has an answer, without anyone
# drawing a clip: its own prediction. `extract_features` encodes a preset's prior captions once, beside the clips
# (`--prior_captions FILE`; hyv-tiny's default is 32 of its own training captions, none of them a probe caption; the
# real presets have none), and `train` gives each batch a prior half: the same noisy latents with a prior caption's
# text, trained towards what the model predicts with its adapter switched off (`--prior_weight`, default 1: the loss
# is the mean of the two halves). It is DreamBooth's prior preservation with the model's predictions in place of the
# clips it would draw, so a caption hyv-tiny gets wrong is kept as it was rather than taught; the price is a batch
# twice the size plus one forward pass without gradients, about twice the training time.
#
# The recipe is now hyv-tiny's training defaults (`Preset.train_defaults` of `tiny_trained`: learning rate 3e-3,
# batches of 8, `--lr_schedule cosine`, `--lora_targets text` and those prior captions; the real presets keep the
# official trainer's 1e-4, batches of 1, constant, `attn`, and none), so `train --lora_rank 8 --steps 1000` on the 12
# up-right clips alone is the whole command. The next cell reads two recipes as a user would run them, through the
# command line with the videos read back from their mp4 files (`benchmarks/finetune_gate.py --gate motion`, seeds
# 0-3): `--recipe taught`, the twins with the settings above and no prior captions, and `--recipe defaults`, the 12
# clips alone with every default.

# %%
taught_runs = sorted(glob.glob("../benchmarks/results/finetune_cli_motion_*.json"))
cli_recipes = [(os.path.basename(path), key, recipe) for path in taught_runs  # every run, oldest file first
               for key, recipe in json.load(open(path))["recipes"].items()]
if cli_recipes:
    for source, key, taught in cli_recipes:
        if key not in ("motion-taught", "motion-defaults"):
            continue
        print(f"{source}: train {' '.join(taught['train_args'])} on the {taught['dataset']} clips")
        print(f"  before the LoRA: {taught['before']['new']}/8 up-right, {taught['before']['known']}/8 known")
        for x in taught["seeds"]:
            print(f"  seed {x['seed']}: {x['new']}/8 up-right, {x['known']}/8 known ({x['seconds']:.0f} s)")
        print(f"  criterion ({taught['criterion']}): {'met' if taught['met'] else 'not met'}")
else:
    print("no saved run: benchmarks/finetune_gate.py --gate motion --recipe taught writes it")

# %% [markdown]
# Through the command line the twins recipe moves 7, 6, 7 and 7 of 8 held-out captions up-right and keeps 8, 7, 7
# and 8 of the known directions, against 1 and 7 before the LoRA; the sweep, which reads the frames before they are
# written to mp4, had 8, 6, 7, 7 and 8, 7, 7, 8 for the same four seeds. The first run of the defaults
# (`finetune_cli_motion_2026-12-02_cpu.json`, made before `--dropout_target frozen` below joined them): the 12 clips
# alone with the prior captions moved 6, 7, 6 and 6 of 8 up-right and kept 7, 6, 5 and 6 known, the goal on three
# seeds of four; seed 2 kept one known caption too few (two captions moving right read up-right and down-right, one
# moving up read up-left). Without the prior half the caption's path had kept 6 and 3 (seeds 0 and 1, the sweep). A
# heavier prior half (`--prior_weight 2`, the "prior weight 2" row of the table above) kept 5 and 5 for seeds 0 and
# 1, and all 135 of hyv-tiny's training captions as prior captions instead of 32 left seed 2 at 6 up-right and 5
# known (the "135 prior captions" row). Three more variants did no better (`finetune_screens_2026-12-02_cpu.json`):
# pairing each clip with the prior captions nearest its own (its twins' captions; 4, 6, 7, 5 known for seeds 0-3
# in run order), hyv-tiny's own drawn videos as the prior half's latents (7, 5, 5 known), and the prior half at high
# noise levels (5 known for seed 2).
#
# **Guidance's other half.** The misses lean away from the new motion as often as towards it: right turned
# down-right, up turned up-left. Guidance computes $v_\text{neg} + g(v_\text{pos} - v_\text{neg})$, and
# $v_\text{neg}$ is the model's answer for the empty prompt. Caption dropout trains one clip in ten on the empty
# prompt, and with the 12 clips alone every such clip moves up-right, so the unconditional model learns to drift
# up-right and guidance pushes the other captions away from it (twins, half of them known directions, balance the
# dropped clips). `train --dropout_target frozen` trains a caption-dropped clip towards the frozen model's own
# prediction for the empty prompt instead of its data, and it is hyv-tiny's default now. In the sweep (the "empty
# prompt → base model" row of the table above) seeds 0-3 moved 8, 7, 6, 6 up-right and kept 7, 8, 7, 8 known;
# through the command line (the last block of the cell above) 6, 7, 6, 7 and 7, 7, 7, 7: the goal on all four seeds
# from the 12 clips alone, with every default. Pooled over the eight runs that is 53 of 64 up-right (0.83) and 59 of
# 64 known (0.92), the known half now as reliable as with twins; the up-right half, at 0.83, still passes on four
# seeds only about half the time by the binomial lines.
#
# The same defaults do not teach orange. On the 12 orange clips of the sweep's first dataset, hyv-tiny's settings
# at 1,000 steps without prior captions drew orange for 2, 3, 2 and 1 of 8 held-out captions (seeds 0-3, the fourth
# row from the bottom of the colour sweep's table). Twins of the orange clips (each caption again in red, green, blue
# or yellow, the colour gate's `--dataset twins`) keep the known colours, 7, 7, 7 and 6 of 8, and orange still does
# not come: 2, 2, 3 and 1 with the same settings, 4, 3, 1 and 3 over every linear layer (the second and third rows
# from the bottom). The prior captions keep the known colours too, 7, 8, 8 and 6 of 8 (hyv-tiny itself gets 5), and draw
# orange for 3, 1, 3 and 1 (the last row). A decaying rate and a prior half do not change what the diagnostics found for
# orange: guidance pushes a colour that lies between two known ones past it. And for most other colours the VAE
# alone rules it out: of seven colours hyv-tiny never saw, each on each background, through its VAE and back, only
# 4 of 21 clips return as their own colour (orange on black and purple, brown on gray, lime on black); magenta and
# pink come back green, cyan and violet blue (`python tools/finetune_diagnostics.py --sections vae`,
# `benchmarks/results/finetune_vae_colours_2026-12-02_cpu.json`). A fine-tune of the DiT cannot draw what the
# decoder cannot return.

# %%
shutil.rmtree(workdir, ignore_errors=True)

# %% [markdown]
# ## Summary
#
# * The fine-tuning recipe at real size (MindSpeed-MM's guides, Tencent's `train.py`) is: a `data.json` of clips,
#   features extracted once, training on the features with sharded weights and recomputed activations, a LoRA,
#   merged for inference. In `hyv_lib` that is `extract_features`, `train` (torch with FSDP2, or a jitted JAX step
#   with FSDP over a mesh), and `generate --lora`; `compile --train` checks a slice without having one.
# * Feature extraction takes the 7B text encoder and the VAE out of the training step. A LoRA takes the optimizer
#   state out (about 14 million trained parameters of 8.3 billion at rank 8), leaving the frozen bf16 weights.
# * The activations of the backward pass are the other wall: without remat one 720p sample's 54 blocks would hold
#   hundreds of GiB; with it, their inputs. Ulysses divides those across devices, FSDP divides the weights and
#   optimizer state. The TPU compiler, run on a CPU, says which slices hold the step; the planner's model sits
#   below it in every compiled row, a bound to check against the compiler near the limit. On one H200 the planner
#   matches the measured peak of the torch step, with and without remat.
# * Live, on a 2-core CPU in a few minutes: 48 clips as mp4 files and a `data.json`, `extract_features`, 500 steps of
#   `train --lora_rank 16`, and `generate --lora` teach hyv-tiny a colour it never saw, on held-out captions, for
#   one training seed in four: no training setting of the sweep made every seed draw it, because guidance amplifies
#   a colour between two known ones past it. The known colours do not all hold: caption by caption, the adapter turns
#   some right answers wrong (in the run above, the white square comes out blue) and some wrong ones right, which
#   the known-colour count alone hides (the line under the probe's caption table lists each change). The VAE limits
#   what can be taught too: it decodes orange on gray as red.
# * A new motion, which the VAE draws as well as any, can be taught for every seed tried. Adapting every linear
#   layer moves held-out captions up-right and turns known ones towards it; twins (each new clip's caption again
#   with a known direction) keep the known captions; a learning rate that decays to zero lets the seeds agree. The
#   caption's path only, batches of 8, 1,000 steps and a cosine decay put all eight seeds at 6 of 8 or more on both
#   halves. Twins drawn by hyv-tiny itself do not work here: it moves a third of them the wrong way. Prior captions
#   do the twins' job without clips: each batch's prior half trains known captions towards the frozen model's own
#   prediction; and caption-dropped clips trained towards the frozen model's empty-prompt prediction
#   (`--dropout_target frozen`) stop guidance pushing the known captions away from the new motion. With both,
#   hyv-tiny's training defaults now, the 12 new clips alone and `train --lora_rank 8 --steps 1000` met the goal
#   for training seeds 0-3 through the command line and in the sweep: 0.83 per caption up-right, 0.92 known.
#
# ## Exercises
#
# Marked ★ (easy) to ★★★ (hard), and *open* where no one has the answer yet ({ref}`notation-exercises`).
#
# 1. ★ Derive the number of parameters of a rank-8 LoRA on the 8.3B DiT's attention projections (8 matrices of
#    2048 x 2048 in each of 54 blocks). How many MB is its file in bf16, and in fp32?
# 2. ★ Feature extraction runs the text encoders once per clip. Why does that matter more for memory than for
#    compute in a train step at 720p? (Chapter 8 counts one CFG step at 720p and 121 frames, a forward of two
#    samples, as about 12.65 PFLOP; Qwen2.5-VL has about 7 billion parameters and reads about 1,000 tokens.)
# 3. ★★ With remat, one 720p sample's 54 block inputs stay in memory for the backward pass. Compute one block's
#    input from the token count and the width ($S = 113{,}585$ tokens, $d = 2048$, bf16), and compare with the
#    planner's line above. What does Ulysses over 8 devices make of it?
# 4. ★★ Run the live section without the prior-preservation clips (drop them from `clips`). Which row of the probe
#    table do you expect to move, and why? Try it.
# 5. ★★ Guidance computes $v_\text{neg} + g(v_\text{pos} - v_\text{neg})$ from the empty prompt's prediction
#    $v_\text{neg}$ and the caption's $v_\text{pos}$, with $g = 4.5$ for hyv-tiny. Picture it in RGB: let $v_\text{neg}$
#    be the mean of hyv-tiny's five colours and $v_\text{pos}$ a colour, and clip the result to $[0, 1]$. Where do
#    red, yellow and orange (1.0, 0.5, 0.05) land, and what if $v_\text{neg}$ is redder than orange?
# 6. ★★★ Run the same LoRA with `--runtime jax` (the JAX train step, here on the CPU backend with one device) and
#    compare its `train_log.jsonl` with the torch run's, step by step. Which differences do you expect, and from
#    where?
# 7. **Open.** Which layers should a LoRA adapt to teach a new word fastest? `hyv_lib`'s default adapts the
#    attention projections of the 54 blocks; the official trainer adapts every linear layer ("all-linear"); chapter
#    7's adapter also reached the {term}`token refiner`'s attention, the only attention that mixes the caption's
#    tokens among themselves before the joint blocks, and hyv-tiny's tokenizer spells "orange" in pieces. A start: train adapters on each
#    set (peft's `LoraConfig(target_modules=...)` with chapter 7's `train.train_dit`), count trained parameters,
#    and compare the orange rate per step and per parameter over several seeds.
# 8. **Open.** With its prior captions and `--dropout_target frozen`, hyv-tiny learns the new motion from the 12
#    up-right clips alone on training seeds 0-3, at 0.83 per caption up-right and 0.92 known. Bring the up-right half
#    to 0.93 pooled over eight seeds (nine passes in ten, by the binomial lines), or teach orange the same way.
#
# :::{admonition} Answers
# :class: dropdown
# 1. Each adapted matrix adds $r(d_\text{in} + d_\text{out}) = 8 \times 4096 = 32{,}768$ parameters; 54 blocks x 8
#    matrices = 432 matrices, $432 \times 32{,}768 = 14{,}155{,}776$, the count printed in "What fits where" (and the
#    compiled reports' trained parameters). At 2 bytes that is 28.3 MB, at 4 bytes 56.6 MB, against 16.7 GB for the
#    DiT in bf16.
# 2. Compute: a 7B model reading 1,000 tokens costs about $2 \times 7 \times 10^9 \times 1000 = 14$ TFLOP, a few
#    thousandths of one forward of one sample through the DiT (half of 12.65 PFLOP), and a train step costs about
#    three forwards. Memory: the
#    encoder's bf16 weights, about 15 GB, would sit on every training device beside the DiT, and the VAE encoder's
#    activations at 720p and 121 frames too. Extracting once also stops the same clip being encoded every epoch.
# 3. One block's input is both streams' hidden states: $S \times d \times 2$ bytes $= 113{,}585 \times 2048 \times
#    2 = 465$ MB $= 0.43$ GiB, the planner's "its inputs" line; 54 of them are 23.4 GiB. Ulysses splits the video
#    tokens 8 ways (the context tokens stay whole on every device), so about an eighth of that per device.
# 4. The known-colour row. With every batch asking for orange, nothing in the loss penalises an update that also
#    pushes other captions towards orange, and the adapter's low-rank change acts on every caption through the same
#    projections. The prior clips make such a shift cost loss. (With 9 captions and one seed, a change of one is
#    noise.)
# 5. The mean of the five colours is about (0.62, 0.62, 0.47). Red: (0.62 + 4.5 x 0.30, 0.62 - 4.5 x 0.50, ...)
#    clips to (1, 0, 0), still red; yellow clips to (1, 1, 0), still yellow: a colour at a corner of the RGB cube
#    stays in its corner however far guidance pushes. Orange sits on an edge: its green channel becomes
#    0.62 - 4.5 x 0.12 = 0.08 and it lands on red, the reads of `uncond_target=base` in the sweep. If $v_\text{neg}$
#    is redder than orange (the empty prompt after the adapters above), $v_\text{pos} - v_\text{neg}$ has a positive
#    green part and the result overshoots to yellow or green. Only a $v_\text{pos} - v_\text{neg}$ of the right size
#    lands on orange, which is why the seeds scatter.
#    (The real computation happens on latents, step by step; RGB is a caricature of it.)
# 6. The two runtimes see identical batches (the loop builds them on the host from the seed) and use the same AdamW
#    and clipping, so the losses agree to float rounding at first: the JAX step computes in another order (fused,
#    jitted), and the differences grow slowly over hundreds of updates. `tests/test_train_loop.py` and
#    `tests/test_tpu_train.py` check a few steps against a plain diffusers computation.
# 7. What is known, from the sweep's table above (12 orange clips, learning rate 3e-3, 500 steps): the attention
#    projections alone drew orange for 5, 3, 3, 4, 3, 0, 1, 3 of 8 held-out captions over seeds 0-7; attention and
#    MLP for 8, 5, 4, 1, 4, 2, 1, 4; every linear layer (`lora_targets=all`, which includes the token refiner's
#    attention) for 4, 4, 5, 2 over seeds 0-3. None reaches 6 for every seed, and the differences between the sets
#    are within the spread between seeds. Not known: how fast each set learns, per step or per parameter. Where to
#    start: `tools/finetune_sweep.py` with `--set lora_targets=...` and `--set steps=...` for 100, 200, 500 and
#    1,000 steps, 8 or more seeds each, and the orange rate plotted against steps and against trained parameters.
# 8. What is known: on the 12 clips alone without prior captions the known captions drift whatever the recipe
#    (every linear layer with the cosine decay kept 5, 4, 4, 6; the caption's path 6 and 3 for seeds 0 and 1); prior
#    clips of other captions keep them but lose the new motion (4, 2, 4 up-right); the prior half keeps both on most
#    seeds (5 to 7 of 8 known, 6 to 8 up-right, over eight seeds); weighting it 2 instead of 1 kept 5 and 5 (seeds 0
#    and 1), and all 135 training captions instead of 32 left seed 2 at 6 and 5; the twins' captions as the prior
#    half's, drawn prior latents and high noise levels did no better. What mattered was the unconditional half:
#    caption-dropped clips trained towards the frozen model keep the known captions at 7 or 8 of 8 on every seed;
#    the up-right misses left are mostly captions that read up or right. Not tried yet: 1,500 or 2,000 steps with
#    both, and a second look at rank and targets now that the known half holds. Where to start:
#    `tools/finetune_sweep.py --gate motion --set lora_rank=8 --set steps=1500`.
# :::
