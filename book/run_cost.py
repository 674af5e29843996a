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
# # What a run costs
#
# What one HunyuanVideo-1.5 video of 121 frames costs at 480p (848×480) and 720p (1280×720), 50 steps with
# {term}`CFG`, on three TPU slices (v5e-8, v5p-8, v6e-8) and on one NVIDIA H100 or H200: the checkpoint to download
# and keep on disk, the host RAM, the memory per device, the time of each part of a run, its price at list prices,
# and which `--mesh` to pass on a TPU.
#
# Every table below is computed when this page is built, from four kinds of input, and the tables say which:
#
# - **counted**: parameters of the model classes built from their configs on PyTorch's meta device (no weights);
# - **compiled**: the TPU compiler's per-device reports for these exact programs, saved in
#   `hyv_lib/compiled/tpu_compile.json` (compiled on a CPU, no TPU; a memory and collective check, not a timing;
#   {doc}`../notebooks/03_sharding` and {doc}`../notebooks/08_performance` show how);
# - **measured**: `hyv_lib` on one NVIDIA H200 with random bf16 weights, the JSON files in `benchmarks/results/`
#   (`benchmarks/results/README.md` says what each run covers);
# - **cited** or **bound**: a published number of *another* implementation with its source, or a lower bound from
#   the planner (`hyv_lib.planning.planner.bounds`: FLOPs at the chip's peak, bytes at its bandwidth).
#
# Nothing here has run with the real weights, on a TPU, or on an H100. Where a part of a run was never measured
# and nobody published it, the table says "not measured" and the price leaves it out, so each dollar figure is the
# price of the parts that are known.

# %% tags=["parameters"]
from hyv_lib.notebook.display import NOTEBOOK_SETTINGS, settings_not_used

STEPS = 50  # the presets' default (480p_t2v and 720p_t2v), and the step count of every published run cited below
# The page is arithmetic on the real presets' configurations, saved compiler reports, saved GPU measurements and
# published figures: no model is loaded, so the reader's run settings do not apply.
_ = settings_not_used({name: "this page reads saved compiler reports, saved GPU measurements and published figures "
                             "for the real presets at their default sizes and 50 steps; no weights are loaded"
                       for name in NOTEBOOK_SETTINGS})

# %%
import json
import warnings
from pathlib import Path

warnings.filterwarnings("ignore", message="IProgress not found")  # tqdm's notice, on import, without ipywidgets

import diffusers
import torch
import transformers
from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLTextConfig

import hyv_lib
from hyv_lib.notebook.display import html_table
from hyv_lib.planning.costs import param_bytes, step_flops
from hyv_lib.planning.gpu_memory import CARDS, step_memory
from hyv_lib.planning.hardware import CHIPS, CITED_STEP_TIMES, SLICES, layout_label, mfu
from hyv_lib.planning.planner import COMPILED_RESULTS, bounds
from hyv_lib.planning.run_cost import PRICES, choose_layout, prices, run_dollars, run_seconds, wire_bytes

GIB, GB = 2**30, 1e9
RESULTS = Path("../benchmarks/results")  # this page runs in book/; the files benchmarks/gpu_check.py wrote
PRESETS = {size: hyv_lib.get_preset(name) for size, name in (("480p", "480p_t2v"), ("720p", "720p_t2v"))}
SIZES = {size: (p.default_height, p.default_width, p.default_video_length) for size, p in PRESETS.items()}
with open(COMPILED_RESULTS) as f:  # saved by benchmarks/tpu_compile.py, shipped in hyv_lib/compiled/
    COMPILED = json.load(f)
RUN = {n: json.loads((RESULTS / f"gpu_check_2026-11-26_H200_run{n}.json").read_text()) for n in (2, 3, 4)}
for size, (h, w, f) in SIZES.items():
    print(f"{size}: {PRESETS[size].name}, {w}x{h}, {f} frames, {PRESETS[size].default_steps} steps by default")

# %% [markdown]
# ## Download, disk and host RAM
#
# The diffusers-format folder (`hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-720p_t2v`, and its `480p_t2v`
# twin) holds the transformer, the VAE and the two text encoders. Their sizes below are parameter counts times bytes
# per parameter, from meta-device builds of each class (no weights): the DiT and VAE from the presets' own configs,
# Qwen2.5-VL-7B's language model and ByT5 from their published configs (cited under the table). The bytes per
# parameter are an assumption for the text encoders (the configs' own `torch_dtype`); the hub's file listing of the
# diffusers folders was not found in a citable source, so the download is this sum, not a listing. Two checks: the
# VAE's 5.04 GB is the size of its fp32 file in Tencent's own repository
# (https://huggingface.co/tencent/HunyuanVideo-1.5/tree/refs%2Fpr%2F6/vae), and the DiT's 16.65 GB rounds to the
# "16.7 GB" that third-party listings give for the bf16 transformer.

# %%
# Qwen2.5-VL-7B-Instruct's language model: the text config of Qwen's release, as copied with its "_name_or_path" in
# https://huggingface.co/unsloth/Qwen2.5-VL-7B-Instruct/blob/main/config.json (torch_dtype bfloat16)
QWEN = Qwen2_5_VLTextConfig(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                            num_key_value_heads=4, vocab_size=152064,
                            rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24]})
# google/byt5-small's encoder, as copied with its "_name_or_path" in
# https://huggingface.co/hugo/byt5-mono-en-v2/blob/main/config.json (torch_dtype float32 in the other copies); the
# glyph tokens HunyuanVideo-1.5's checkpoint adds to its 384-byte vocabulary are not counted (1472 weights each)
BYT5 = transformers.T5Config(d_model=1472, d_ff=3584, d_kv=64, num_layers=12, num_heads=6, vocab_size=384,
                             feed_forward_proj="gated-gelu", is_encoder_decoder=False)
with torch.device("meta"):
    counts = {
        "transformer (DiT)": param_bytes(PRESETS["720p"], "bf16")["params"],
        "vae": sum(p.numel() for p in diffusers.AutoencoderKLHunyuanVideo15(**PRESETS["720p"].vae).parameters()),
        "text_encoder (Qwen2.5-VL-7B language model)": sum(
            p.numel() for p in transformers.Qwen2_5_VLTextModel(QWEN).parameters()),
        "text_encoder_2 (ByT5-small encoder)": sum(p.numel() for p in transformers.T5EncoderModel(BYT5).parameters()),
    }
STORED = dict(zip(counts, [("bf16", 2), ("fp32", 4), ("bf16", 2), ("fp32", 4)]))  # as the configs store them
COMPONENT_BYTES = {name: n * STORED[name][1] for name, n in counts.items()}
assert param_bytes(PRESETS["480p"], "bf16")["params"] == counts["transformer (DiT)"]  # one DiT for both sizes
rows = [{"component": name, "parameters": f"{n:,}", "stored as": STORED[name][0],
         "GB": round(COMPONENT_BYTES[name] / GB, 2), "GiB": round(COMPONENT_BYTES[name] / GIB, 2)}
        for name, n in counts.items()]
DOWNLOAD = sum(COMPONENT_BYTES.values())
rows.append({"component": "total (configs and tokenizers not counted)", "parameters": f"{sum(counts.values()):,}",
             "stored as": "", "GB": round(DOWNLOAD / GB, 1), "GiB": round(DOWNLOAD / GIB, 1)})
html_table(rows)

# %% [markdown]
# So one preset's folder is about the total above to download and to keep on disk (the 480p and 720p folders each
# hold all four; two presets, twice). The disk also holds the Python environment and, on a TPU VM, the XLA compile
# cache (`HYV_COMPILE_CACHE_DIR`); neither was measured. The stage files between the stages are small next to it.
#
# Host RAM depends on how the stages run. The staged commands of the {doc}`runbook` hold one stage's models at a
# time: stage 1 the two text encoders, stage 2 the transformer (loaded on the host, then placed on the devices),
# stage 3 the VAE. `generate` and `load_pipeline` keep all of them in one process. The machines' own RAM, where a
# source gives it:

# %%
dit, vae_bytes, qwen, byt5 = COMPONENT_BYTES.values()
enc = qwen + byt5
staged = max(enc, dit, vae_bytes)
HOST_RAM = {  # the machine each price below rents, and its RAM as its documentation states it
    "v5e-8": ("512 GiB per host (8 chips per host)", "https://docs.cloud.google.com/tpu/docs/v5e"),
    "v5p-8": ("448 GB per VM (4 chips)", "https://docs.cloud.google.com/tpu/docs/v5p-training"),
    "v6e-8": ("1536 GiB per host (8 chips per host)", "https://docs.cloud.google.com/tpu/docs/v6e"),
    "H100": ("234 GiB (Google Cloud a3-highgpu-1g)", "https://github.com/skypilot-org/skypilot-catalog "
             "(catalogs/v8/gcp/vms.csv, the MemoryGiB of a3-highgpu-1g)"),
    "H200": ("not looked up (depends on the machine rented)", ""),
}
print(f"stage 1 (Qwen2.5-VL-7B + ByT5): {enc / GIB:.1f} GiB; stage 2 (DiT): {dit / GIB:.1f} GiB; "
      f"stage 3 (VAE, fp32): {vae_bytes / GIB:.1f} GiB")
print(f"host RAM for the models: staged, at least {staged / GIB:.1f} GiB; in one process (generate), at least "
      f"{DOWNLOAD / GIB:.1f} GiB")
html_table([{"system": s, "host RAM": ram, "source": src or "-"} for s, (ram, src) in HOST_RAM.items()])

# %% [markdown]
# Every machine whose RAM is given holds the whole checkpoint in RAM with room to spare. The runbook's warning stands
# for other setups: under `torchrun`, each process loads its own transformer on the host first.
#
# ## Memory per device
#
# On a TPU the compiler's report is the figure: the whole 54-block step, compiled for the named slice, per device,
# against what the compiler lets one program use. The grid holds four layouts per slice and size (the
# {ref}`mesh rule <run-cost-mesh>` below picks one); the default layout (`--mesh` not given) on a slice of n devices
# is `tp_replicated_out` on `data=2,tensor=n/2`. On a GPU the step runs on one card with whole weights
# (`--runtime torch`): measured on the H200, and modelled for the H100 by `hyv_lib.planning.gpu_memory.step_memory`
# (the same model is within 0.1% of the H200's measured peaks at both sizes).

# %%
SLICE_CHIPS = {f"{chip}-{2 * n if chip == 'v5p' else n}": (chip, n) for (chip, n) in SLICES}  # v5p-8 is 4 chips
TPU_SLICES = ("v5e-8", "v5p-8", "v6e-8")
LAYOUTS = ("tp", "tp_replicated_out", "fsdp", "sequence")
step_rows = {n: {r["name"]: r for r in RUN[n]["sections"]["step"]["rows"]} for n in (2, 3)}
H200_STEP = {"480p": step_rows[2]["hyv_lib 480p"], "720p": step_rows[3]["hyv_lib 720p"]}
rows = []
for slice_ in TPU_SLICES:
    for size in SIZES:
        r = COMPILED[f"{slice_}/tp_replicated_out/{size}/uncached"]
        totals = {lay: COMPILED[f"{slice_}/{lay}/{size}/uncached"]["per_device_bytes"]["total"] for lay in LAYOUTS}
        rows.append({"system": f"{slice_} ({r['chips']} chips)", "size": size,
                     "default layout (GiB)": round(totals["tp_replicated_out"] / GIB, 2),
                     "smallest layout (GiB)": f"{min(totals.values()) / GIB:.2f} ({min(totals, key=totals.get)})",
                     "usable per device (GiB)": round(r["hbm_available_per_device"] / GIB, 2),
                     "source": "compiled"})
for gpu, card in (("H100", CARDS[80]), ("H200", CARDS[141])):
    for size, (h, w, f) in SIZES.items():
        modelled = step_memory(PRESETS[size].name, h, w, f)["allocated"]
        measured = H200_STEP[size]["peak_allocated_gib"] if gpu == "H200" else None
        rows.append({"system": f"one {gpu}", "size": size,
                     "default layout (GiB)": measured if measured is not None else round(modelled / GIB, 2),
                     "smallest layout (GiB)": "-", "usable per device (GiB)": round(card.usable_bytes / GIB, 1),
                     "source": "measured (peak allocated)" if measured is not None else "modelled (step_memory)"})
html_table(rows)

# %%
tight = min(((r["hbm_available_per_device"] - r["per_device_bytes"]["total"], k) for k, r in COMPILED.items()
             if "/" in k and k.split("/")[0] in TPU_SLICES), key=lambda t: t[0])
cache_gap = max(abs(COMPILED[k]["per_device_bytes"]["total"] - COMPILED[k.replace("/uncached", "/deepcache")]
                    ["per_device_bytes"]["total"]) for k in COMPILED if k.endswith("/uncached")
                and k.split("/")[0] in TPU_SLICES)
decode = json.loads((Path(COMPILED_RESULTS).parent / "tpu_vae_decode.json").read_text())["720p_t2v/v6e:2x4/121f"]
print(f"least headroom in the grid: {tight[0] / GIB:.2f} GiB ({tight[1]}); DeepCache's programs differ from the "
      f"uncached ones by at most {cache_gap / GIB:.2f} GiB")
print(f"stage 3 on one chip (the 720p decode, one {decode['tile_pixels'][0]} px tile, bf16), compiled for a v6e: "
      f"{decode['per_device_bytes']['total'] / GIB:.1f} GiB per device")

# %% [markdown]
# Everything fits, the tightest by the headroom printed above. The VAE decode is the exception on a v5e: one
# 256-pixel tile of the 720p decode needs more than a 16 GiB chip holds (the figure above), so a v5e decodes on the
# host (`--runtime torch`, the runbook's troubleshooting).
#
# (run-cost-time)=
# ## Time per step and per video
#
# A run is: load the weights, encode the prompt (stage 1), compile (TPU), the 50 steps, and the VAE decode. What is
# known of each part:

# %%
vae = RUN[2]["sections"]["vae"]["rows"][0]
offload = RUN[4]["sections"]["offload"]["rows"][0]
cited = {c["chip"]: c for c in CITED_STEP_TIMES if c["preset"] == "720p_t2v" and c["rules"] == "tp_replicated_out"
         and c["chip"] == "v6e" and "stock" in c["label"]}
print(f"H200, measured: 480p step {H200_STEP['480p']['s_per_step']} s (run 2), 720p step "
      f"{H200_STEP['720p']['s_per_step']} s (run 3); VAE decode {vae['name'].split()[-1]} {vae['seconds']} s "
      f"({vae['dtype']}, {vae['tile_px']} px tiles, run 2)")
print(f"H200, measured: the transformer's copy from host RAM to the GPU {offload['to_device_s']} s "
      f"({offload['allocated_on_device_gib']} GiB, run 4); reading it from disk: not measured")
for gpu in ("H100", "H200"):
    b = bounds(PRESETS["720p"], *SIZES["720p"], gpu, 1, "replicated")
    print(f"{CHIPS[gpu].name}: {CHIPS[gpu].peak_bf16_flops / 1e12:.0f} TFLOP/s bf16, HBM "
          f"{CHIPS[gpu].hbm_bandwidth / 1e12:.2f} TB/s; the planner's 720p step bound on one: "
          f"{b['step_s']:.1f} s, {b['limit'][:-2]}-bound")
c = cited["v6e"]
print(f"v6e-8, cited: {c['seconds']} s per 720p step ({c['label']}, {layout_label(c['mesh'], c['rules'])}; "
      f"{c['source']})")

# %% [markdown]
# The table takes each part from the best source there is: the H200's measurements; for the H100, no measurement
# exists, so its row uses the H200's times as an **estimate** (the two have the same bf16 peak and the planner finds
# the step compute-bound on both, the lines above; the H100's HBM is slower); the one published TPU time (v6e-8, 720p,
# gpu-tpu-pedia's code, on its own layout); and otherwise the planner's lower bound on the layout the mesh rule
# picks, marked "≥". A TPU also compiles the step once per size and layout: the compile column is the TPU compiler's
# time for that layout on this project's 2-core CPU (a TPU VM's host has many more cores; not measured there). The
# compile cache (`HYV_COMPILE_CACHE_DIR`) keeps the program for the next video, so the per-video total leaves it out
# and the first video adds it. The GPU runs eager PyTorch: nothing to compile.

# %%
CANDIDATES = {}  # (slice, size) -> the mesh rule's candidates (used again in the mesh section)
for slice_ in TPU_SLICES:
    chip, n_chips = SLICE_CHIPS[slice_]
    for size, (h, w, f) in SIZES.items():
        cands = []
        for lay in LAYOUTS:
            full, cached = (COMPILED[f"{slice_}/{lay}/{size}/{c}"] for c in ("uncached", "deepcache"))
            b = bounds(PRESETS[size], h, w, f, chip, n_chips, "tp" if lay == "sequence" else lay,
                       mesh_shape=full["mesh"])
            cands.append(dict(layout=lay, rules=full["sharding"], mesh=full["mesh"],
                              fits=full["fits"] and cached["fits"],
                              memory_bytes=max(full["per_device_bytes"]["total"], cached["per_device_bytes"]["total"]),
                              compute_s=b["compute_s"], interconnect_s=b["interconnect_s"], bound_s=b["step_s"],
                              wire_bytes=wire_bytes(full["collectives"]), compile_s=full["compile_seconds"]))
        CANDIDATES[slice_, size] = cands
CHOSEN = {key: choose_layout(cands) for key, cands in CANDIDATES.items()}

VIDEOS, rows = {}, []
for system in (*TPU_SLICES, "H100", "H200"):
    for size in SIZES:
        if system in TPU_SLICES:
            pick = CHOSEN[system, size]
            chip = SLICE_CHIPS[system][0]
            known = cited.get(chip) if size == "720p" else None
            step, kind = (known["seconds"], "cited") if known else (pick["bound_s"], "bound (≥)")
            compile_s = pick["compile_s"]
            parts = {"load": None, "stage 1": None, f"{STEPS} steps": STEPS * step, "decode": None}
        else:
            step, kind = H200_STEP[size]["s_per_step"], "measured" if system == "H200" else "estimate (H200's)"
            compile_s = 0.0
            parts = {"load": None, "stage 1": None, f"{STEPS} steps": STEPS * step,
                     "decode": vae["seconds"] if size == "720p" else None}
        run = run_seconds(parts)
        VIDEOS[system, size] = dict(run, kind=kind, compile_s=compile_s)
        rows.append({"system": system, "size": size, "s/step": round(step, 2), "step from": kind,
                     f"{STEPS} steps (s)": round(STEPS * step),
                     "decode (s)": parts["decode"] if parts["decode"] is not None else "not measured",
                     "per video, known (s)": round(run["known_s"]), "not measured": ", ".join(run["missing"]),
                     "first video: + compile (s)": round(compile_s)})
html_table(rows)

# %% [markdown]
# Stage 1 (Qwen2.5-VL-7B and ByT5 on two prompts) and loading the weights from disk were measured nowhere; nor were
# the 480p decode and any decode on a TPU. The 720p decode on the H200 is a small part of its run (17.3 of 1,254 s).
#
# ## Price per video
#
# The price of the known part of each run, at each list price found (on demand, no commitment; the price sources
# are in the last table). A "≥" row rests on a lower bound and costs at least that much; the H100 rows rest on the
# estimate above.

# %%
rows = []
for p in PRICES:
    row = {"system": p.system, "machine": p.machine, "$/hour": p.usd_per_hour}
    for size in SIZES:
        v = VIDEOS[p.system, size]
        mark = "≥ " if v["kind"].startswith("bound") else "~ " if v["kind"].startswith("estimate") else ""
        row[f"$ per {size} video"] = f"{mark}{run_dollars(v['known_s'], p.usd_per_hour):.2f}"
    first = VIDEOS[p.system, "720p"]["compile_s"]
    row["first 720p video: + compile $"] = round(run_dollars(first, p.usd_per_hour), 2)
    rows.append(row)
html_table(rows)

# %%
v6e, h200 = VIDEOS["v6e-8", "720p"], VIDEOS["H200", "720p"]
print(f"720p: v6e-8 {v6e['known_s']:.0f} s ({v6e['kind']} steps, decode not measured) = "
      f"{run_dollars(v6e['known_s'], prices('v6e-8')[0].usd_per_hour):.2f} $; one H200 {h200['known_s']:.0f} s "
      f"(measured steps and decode) = {run_dollars(h200['known_s'], prices('H200')[0].usd_per_hour):.2f} $; "
      f"the v6e-8's steps take {STEPS * H200_STEP['720p']['s_per_step'] / (v6e['known_s']):.1f}x less time")
flops = step_flops(PRESETS["720p"], *SIZES["720p"])["total"]
share = mfu(flops, cited["v6e"]["seconds"], "v6e", SLICE_CHIPS["v6e-8"][1])
cache = RUN[2]["sections"]["cache"]["rows"][0]
schedule = cache["deepcache_default"]
print(f"DeepCache ({schedule['schedule']}): {schedule['full_steps']} full and {schedule['cached_steps']} cached "
      f"steps; a cached 480p step took {cache['cached_over_full']:.1%} of a full one on the H200 (run 2)")
print(f"the cited v6e-8 step ran at {share:.0%} of the chips' bf16 peak (MFU); a lower bound assumes 100%, so a real "
      f"step near that MFU takes about {1 / share:.1f}x its bound")

# %%
html_table([{"system": p.system, "machine": p.machine, "region": p.region or "-", "read": p.read, "source": p.source,
             "how": p.note} for p in PRICES])

# %% [markdown]
# On these figures a 720p video's known part costs a little more on a v6e-8 (cited steps) than on one H200 (measured
# steps and decode, at the Nebius price), and the v6e-8 finishes its 50 steps 3.4 times sooner (the lines above). The
# GPU's price depends more on where it is rented than on the card: the three H100 prices differ by more than 2x.
# The 480p TPU rows and everything on a v5e-8 or v5p-8 are lower bounds: the planner
# assumes every FLOP at the chip's peak, and the one published TPU run of this model reached the share of it printed
# above, so at that efficiency those rows would cost about that factor more ({doc}`../notebooks/08_performance`
# tabulates the MFU of every published run). A price with a commitment or on Spot capacity is lower than these, and a
# region other than the one named can be higher. Two levers change the bill more than the hardware: DeepCache (half
# of the 50 steps become cached steps that cost a few percent of a full one, the lines above;
# {doc}`../notebooks/04_deepcache` measures what it does to the video) and the sparse 720p checkpoints
# ({doc}`../notebooks/11_sparse_attention`).
#
# (run-cost-mesh)=
# ## Choosing a mesh
#
# **The rule.** Among the layouts the TPU compiler says fit (both of DeepCache's programs too), keep those whose
# planner compute bound is within 5% of the smallest, and take the one whose compiled program moves the fewest
# collective bytes (an all-reduce counted twice); on a tie, the least memory. `hyv_lib.planning.run_cost.choose_layout`
# applies it to the compiled grid:

# %%
rows = []
for (slice_, size), cands in CANDIDATES.items():
    pick = CHOSEN[slice_, size]
    for c in cands:
        rows.append({"slice": slice_, "size": size, "layout": c["layout"],
                     "--mesh / --sharding": f"{layout_label(c['mesh'])} / {c['rules']}",
                     "fits": c["fits"], "GiB per device": round(c["memory_bytes"] / GIB, 2),
                     "compute bound (s)": round(c["compute_s"], 3),
                     "collectives (GB)": round(c["wire_bytes"] / GB, 1),
                     "chosen": "✔" if c["layout"] == pick["layout"] else ""})
html_table(rows)

# %%
summary = [{"slice": s, "size": z, "pass": f"--mesh {layout_label(p['mesh'])} --sharding {p['rules']}",
            "why": p["reason"]} for (s, z), p in CHOSEN.items()]
html_table(summary)

# %%
gathers = {k: next(c["count"] for c in COMPILED[k]["collectives"] if c["kind"] == "all-gather")
           for k in (f"{s}/{lay}/720p/uncached" for lay in ("tp_replicated_out", "fsdp") for s in ("v5e-8", "v6e-8"))}
print("all-gathers in the compiled 720p step:", ", ".join(f"{k.rsplit('/', 2)[0]} {n}" for k, n in gathers.items()))
ratio = max(c["interconnect_s"] / c["compute_s"] for cands in CANDIDATES.values() for c in cands)
print(f"largest interconnect bound in the grid: {ratio:.1%} of its layout's compute bound")

# %% [markdown]
# Read the rule's outcome with its limits. Every layout fits, and the planner puts their compute within 5% of each
# other on every slice, so the choice falls to communication, and there the compiled programs differ from slice to
# slice in ways the planner does not model: the v5e-8's programs hold 2.5 to 4.5 times as many all-gathers as the
# v6e-8's for the same layout (printed above), so the two slices get different picks at 480p (plain `tp` on the
# v5e-8, `tp_replicated_out` on the v6e-8). The planner's interconnect bound is at most the share of the compute
# bound printed last: if the collectives ran at the interconnect's full bandwidth and none of them overlapped
# compute, the layouts of a row would differ by less than that share of a step. No layout has been timed on a TPU;
# {doc}`../notebooks/03_sharding` ends on that open question. The {doc}`runbook`'s commands use the default layout,
# which the rule picks at 480p on the v5p-8 and v6e-8; at 720p it fits too, and the rule prefers `fsdp` only for its
# fewer collective bytes. On a GPU there is no mesh to choose: one GPU runs `--runtime torch`, several run
# `torchrun ... --runtime ulysses` ({doc}`runbook`). A CFG-distilled preset
# (guidance 1, one sample per step) has no use for a `data` axis and refuses one; its layouts are `tensor` and
# `sequence` only.
#
# ## Summary
#
# - One preset's folder is about 36.7 GB (34.2 GiB) of weights: the DiT in bf16, the VAE in fp32, Qwen2.5-VL-7B's
#   language model in bf16 and ByT5. The staged commands need host RAM for the largest stage (15.5 GiB, the DiT),
#   `generate` in one process for all of them at once; every machine whose RAM is documented has far more.
# - Every compiled layout fits the v5e-8, v5p-8 and v6e-8 at 480p and 720p; one GPU peaks at about 20 GiB (480p) or
#   26 GiB (720p), within an H100's 79.6 GiB. A v5e chip cannot hold the 720p decode: decode on the host.
# - Measured on one H200, a 720p video's 50 steps and decode take 1,254 s; the one published v6e-8 figure puts the 50
#   steps at 364 s. At the list prices found (dated and sourced in the table), the known part of a 720p video costs
#   1.88 $ on an H200, 1.49 to 3.82 $ on an H100 (the H200's times, an estimate) and 2.19 $ on a v6e-8; the load and
#   the text encoders were measured nowhere, and the other TPU rows are lower bounds.
# - The mesh rule (compiled grid and planner: of the layouts that fit with equal compute, the fewest collective
#   bytes) gives `--mesh data=2,sequence=n/2 --sharding fsdp` at 720p on all three slices, and at 480p the default
#   `tp_replicated_out` on `data=2,tensor=n/2` for the v5p-8 and v6e-8 and plain `tp` for the v5e-8. None of this
#   was timed on a TPU.
