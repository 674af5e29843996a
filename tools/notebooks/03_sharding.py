"""Source of notebooks/03_sharding.ipynb: `python tools/notebooks/03_sharding.py` rewrites it.

Notebooks are authored as these scripts so reviews read plain Python; tests/test_notebooks.py checks
that every committed notebook equals what its script builds (and carries no outputs).
"""
from _nbtools import code, main, md, notebook

cells = []
cells.append(md("""# Sharding the DiT across devices

One HunyuanVideo-1.5 step at 720p and 121 frames does about 12.6 PFLOP and needs 16.7 GB of bf16 weights plus
gigabytes of activations, so it has to be spread over several chips. This chapter:

1. sizes the problem with the planner (`hyv_lib.perf`): FLOPs, bytes per chip, lower bounds on step time,
   MFU of published runs;
2. builds device meshes with `data`, `tensor` and `sequence` axes and places the weights with three rule sets
   (`tp`, `tp_replicated_out`, `fsdp`), on 8 emulated CPU devices;
3. checks every layout against diffusers' forward and counts the collectives XLA inserts;
4. runs Ulysses sequence parallelism, the GPU approach, with torch.distributed on CPU processes.

The JAX part runs on 8 CPU devices that XLA emulates (`--xla_force_host_platform_device_count=8`). The programs
are the ones a v6e-8 would run. The speed is not."""))
cells.append(code("""import os

PRESET = os.environ.get("HYV_PRESET", "tiny_trained")   # the model of the planner rows marked "this preset"
MODEL_PATH = os.environ.get("HYV_MODEL_PATH") or None  # unused: the sharding demo builds an 8-head tiny model
N_DEVICES = int(os.environ.get("HYV_N_DEVICES", "8"))   # emulated CPU devices (a real TPU VM: its chips)""",
                  metadata={"tags": ["parameters"]}))
cells.append(code("""# Emulated devices must be requested before JAX initialises its CPU backend.
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + f" --xla_force_host_platform_device_count={N_DEVICES}")
import copy
import logging
import subprocess
import sys
import warnings

warnings.filterwarnings("ignore", message="IProgress not found")
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
logging.getLogger("jax").setLevel(logging.ERROR)

import jax
import torch
from diffusers import HunyuanVideo15Transformer3DModel

import hyv_lib
from hyv_lib import perf
from hyv_lib.display import html_table
from hyv_lib.models import example_forward_kwargs
from hyv_lib.sharding import RULE_SETS, make_mesh
from hyv_lib.tpu import TpuTransformer

print(jax.device_count(), "devices:", jax.devices()[0].platform)"""))
cells.append(md("""## How big is one step?

`hyv_lib.perf.step_flops` counts the matmuls of one forward over the CFG batch of 2. The parameter shapes come
from a meta-device instance of the diffusers class, and the attention term is $4 B H S^2 D$ per block over the
joint sequence, context padding included (the kernels compute it). On the tiny config, the same count matches
the matmul FLOPs in XLA's compiled HLO exactly (a test checks it)."""))
cells.append(code("""rows = []
for name in ("480p_t2v", "720p_t2v"):
    p = hyv_lib.get_preset(name)
    f = perf.step_flops(p, p.default_height, p.default_width, 121)
    rows.append({"preset": name, "size": f"{p.default_height}x{p.default_width}x121",
                 "joint tokens S": f"{f['tokens']['joint']:,}", "PFLOP per CFG step": round(f["total"] / 1e15, 2),
                 "attention share": f"{f['attention_share']:.1%}"})
html_table(rows)"""))
cells.append(md("""At 720p nine tenths of the work is attention, which is quadratic in the 113k tokens. The weights are
what decides the *memory* layout:"""))
cells.append(code("""real = hyv_lib.get_preset("720p_t2v")
rows = []
for rules in ("replicated", "tp", "tp_replicated_out", "fsdp"):
    report = perf.param_bytes(real, "bf16", rules, mesh_shape=8)
    rows.append({"rule set (8 devices)": rules, "weights per device, GB": round(report["bytes_per_device"] / 1e9, 2)})
html_table(rows)"""))
cells.append(md("""`tp` splits the attention and MLP matrices of the 54 blocks 8 ways. `tp_replicated_out` keeps the
row-parallel ones (attention output projection, MLP `fc2`) whole on every chip. That costs about 4 GB per chip,
and in exchange those matmuls need no all-reduce of partial sums. The gpu-tpu-pedia project measured
8.12 → 7.29 s/step on a v6e-8 with this change (a single author, whose documents label the hardware
inconsistently). About a third of the parameters (the AdaLN modulation linears, 12288×2048 per stream and
block) stay replicated under both TP rule sets. They are a lever that neither rule set pulls.

The planner turns this into per-chip rows for common 8-chip systems. The bounds are *lower* bounds: compute
at peak bf16; HBM for reading the weights once plus the attention's inputs and outputs; interconnect for the
bytes each chip must send, at half its published bidirectional ICI or NVLink bandwidth (v7x has no sourced
figure here, so its bound stays empty)."""))
cells.append(code("""rows = []
for r in perf.plan_table(presets=("720p_t2v",), rules="tp_replicated_out"):
    needed = r["weights_gb_per_chip"] + r["activations_gb_per_chip"]
    rows.append({"chip x8": r["chip"], "GB needed per chip": round(needed, 1),
                 "HBM per chip, GB": round(r["hbm_gb_per_chip"], 1), "fits": r["fits"],
                 "compute bound s": round(r["compute_s"], 2), "HBM bound s": round(r["hbm_s"], 3),
                 "interconnect bound s": round(r["interconnect_s"], 2) if r["interconnect_s"] else "",
                 "cited s/step": r["cited_s"] or "", "cited MFU": f"{r['cited_mfu']:.1%}" if r["cited_mfu"] else "",
                 "source": (r["cited_source"] or "")[:60]})
html_table(rows)"""))
cells.append(md("""The same plan for the v6e-8 rule set by rule set, next to gpu-tpu-pedia's measured step times (the only
published ones for this model on TPU):"""))
cells.append(code("""cited = {"tp": 8.12, "tp_replicated_out": 7.29}  # gpu-tpu-pedia, v6e-8, 720p/121f, stock Splash [unverified]
flops = perf.step_flops(real, 720, 1280, 121)["total"]
rows = []
for rules in ("tp", "tp_replicated_out", "fsdp"):
    b = perf.bounds(real, 720, 1280, 121, "v6e", 8, rules)
    rows.append({"rule set": rules, "weights GB/chip": round(b["weights_bytes"] / 1e9, 2),
                 "activations GB/chip": round(b["activation_bytes"] / 1e9, 2),
                 "compute bound s": round(b["compute_s"], 2),
                 "interconnect bound s": round(b["interconnect_s"], 2), "measured s/step": cited.get(rules, ""),
                 "MFU": f"{perf.mfu(flops, cited[rules], 'v6e', 8):.1%}" if rules in cited else ""})
html_table(rows)"""))
cells.append(md("""Replicating the row-parallel weights costs 4 GB per chip and bought 10% in that measurement. In the planner,
plain TP all-reduces about 176 GB per chip and step, at least 0.44 s on v6e ICI, which is the traffic that
replication removes. (The planner still counts plain-TP traffic for `tp_replicated_out`, because XLA picks the
collectives there.) Both runs
sit near a quarter of peak. The bounds say where the rest could go:
compute dominates by far, so the levers are the attention kernel's efficiency (the custom exp2 Splash kernel
went from 7.29 to 5.81 s/step on the v6e-8) and fewer collectives on the critical path.

The activation figures are the planner's formula. XLA can also report them: `benchmarks/aot_memory.py`
compiles one real-size block (the 720p_t2v config with `num_layers=1`, random bf16 weights) for 720p and 121
frames on the 8 emulated devices, without running it, and reads XLA's memory analysis per device. The
temporaries are those of the XLA:CPU program with the blockwise XLA attention; on a TPU, Splash changes them.

"""))
cells.append(code("""result = subprocess.run([sys.executable, os.path.join("..", "benchmarks", "aot_memory.py")],
                        capture_output=True, text=True, check=True)
print(result.stdout)"""))
cells.append(md("""## Meshes and rule sets

A mesh names the devices' axes: `data` (the CFG pair of prompts), `tensor` (heads and matrix columns) and
`sequence` (video tokens). A rule set maps diffusers parameter names to `PartitionSpec`s. Unmatched parameters
are replicated, and a rule that matches nothing is an error. The demo model is the tiny config with 8 heads of
16, so that 8-way tensor parallelism can split the heads."""))
cells.append(code("""tiny = hyv_lib.get_preset("tiny")
torch.manual_seed(0)
oracle_model = HunyuanVideo15Transformer3DModel(
    **dict(tiny.transformer, num_attention_heads=8, attention_head_dim=16)).eval().requires_grad_(False)
# A CFG batch of 2 with real padding: 14 and 50 valid text tokens, 0 and 7 ByT5 tokens, no image (t2v).
inputs = example_forward_kwargs(tiny, seed=1, latent=(2, 4, 6), text_lengths=(14, 50), byt5_lengths=(0, 7),
                                timestep=600.0)
with torch.no_grad():
    oracle = oracle_model(**inputs).sample
for rule in RULE_SETS["tp_replicated_out"]:
    print(f"{rule.name:40s} {rule.spec}")"""))
cells.append(md("""Now each layout runs on its mesh. `TpuTransformer(model, mesh=..., sharding=...)` places the weights by
the rules. It also puts the CFG batch on `data` and keeps the video tokens split along `sequence` between
blocks, and it runs attention per shard: `shard_map` with the heads on `tensor`. That last part is needed
because Splash is a Pallas kernel, which XLA's partitioner cannot split by itself. XLA inserts every
collective on its own."""))
cells.append(code("""from torchax.interop import jax_view

cases = [("tp", dict(tensor=8), "xla"), ("tp_replicated_out", dict(tensor=8), "xla"),
         ("tp_replicated_out", dict(data=2, tensor=4), "splash"), ("fsdp", dict(sequence=2, tensor=4), "xla")]
rows, steps = [], {}
for rules, axes, attention in cases:
    mesh = make_mesh(**axes)
    step = TpuTransformer(copy.deepcopy(oracle_model), mesh=mesh, sharding=rules, attention=attention)
    out = step(**inputs)
    weight = jax_view(step.jitted.buffers["model.transformer_blocks.0.attn.to_out.0.weight"])
    hlo = step.lower(**inputs).compile().as_text()
    steps[(rules, tuple(axes.items()))] = step
    rows.append({"rules": rules, "mesh": ",".join(f"{k}={v}" for k, v in axes.items()), "attention": attention,
                 "max |out - oracle|": f"{(out - oracle).abs().max():.1e}",
                 "to_out.0 shard": str(list(weight.addressable_shards[0].data.shape)),
                 **{op: c["count"] for op, c in perf.hlo_collectives(hlo).items() if c["count"]}})
html_table(rows)"""))
cells.append(md("""JAX can draw how an array is laid out over the devices. Here is the attention output projection
under `tp` on `tensor=8`: eight column blocks, one per device."""))
cells.append(code("""tp_step = steps[("tp", (("tensor", 8),))]
jax.debug.visualize_array_sharding(jax_view(tp_step.jitted.buffers["model.transformer_blocks.0.attn.to_out.0.weight"]))"""))
cells.append(md("""Every layout reproduces the oracle to float32 rounding. The shard shape of the attention output
projection (full size 128×128) shows the rules at work: split by input features under `tp`, whole under
`tp_replicated_out`, split by rows under `fsdp`. The collective counts come from the compiled program. They
are what XLA decided, and a layout that looks cheaper on paper can still get extra reshards.

For plain `tp` the planner's prediction is exact: one all-reduce per row-parallel output and stream in every
block, except the last block's context stream, whose output nothing reads (XLA drops it), and the bytes match
(a test checks this). At full size, the planner predicts how much these collectives move (a ring all-reduce
moves $2(n-1)/n$ of the buffer per device):"""))
cells.append(code("""rows = []
for strategy in ("tp", "ulysses", "fsdp"):
    cb = perf.collective_bytes(real, 720, 1280, 121, strategy=strategy, mesh_shape=8)
    rows.append({"strategy (720p, 121 frames, 8 devices)": strategy,
                 "GB moved per device per step": round(cb["bytes_per_device"] / 1e9, 1)})
html_table(rows)"""))
cells.append(md("""## Ulysses: sequence parallelism on GPUs

The official GPU code parallelises differently. Each of N processes holds the whole model and 1/N of the video
tokens. In each attention, an all-to-all turns sequence shards into head shards, so every rank attends over
all tokens with H/N heads, and a second all-to-all turns them back. The text tokens are small, so they are
replicated and only head-sliced. `hyv_lib.parallel.UlyssesTransformer` does this on torch.distributed (nccl on
GPUs). Here it runs on gloo, with CPU processes:"""))
cells.append(code("""from hyv_lib.parallel import run_distributed, ulysses_forward

ulysses_model = copy.deepcopy(oracle_model)
rows = []
for world in (2, 4):
    out = run_distributed(ulysses_forward, world, ulysses_model, inputs)
    rows.append({"ranks": world, "heads per rank": 8 // world, "video tokens per rank": -(-48 // world),
                 "max |out - oracle|": f"{(out - oracle).abs().max():.1e}"})
html_table(rows)"""))
cells.append(md("""On real hardware it is one command per node:

```bash
torchrun --nproc_per_node=8 -m hyv_lib stage2 --input_dir out --runtime ulysses --num_inference_steps 50
```

and on a TPU VM:

```bash
python -m hyv_lib stage2 --input_dir out --runtime tpu --mesh data=2,tensor=4 --sharding tp_replicated_out
```

## Summary

- At 720p and 121 frames one CFG step is about 12.6 PFLOP, 90% of it attention. The bf16 weights take
  16.7 GB, 7.1 GB per chip under 8-way `tp`, or 11.1 GB with the row-parallel weights replicated.
- `hyv_lib.sharding` gives meshes (`data`, `tensor`, `sequence`) and rule sets from diffusers names to
  `PartitionSpec`s. It reports what each rule placed, and a rule that matches nothing is an error.
- `TpuTransformer(..., mesh, sharding)` matches diffusers' forward on every layout tested here. XLA inserts
  the collectives, and the compiled HLO shows which ones.
- Ulysses (all-to-all between sequence and head shards) gives the same output on 2 and 4 processes.
- Published runs reach about 24–30% MFU on a v6e-8 (planner arithmetic on cited times). Compute is the bound,
  so the attention kernel is the lever.

## Exercises

1. Why must the number of heads be divisible by the `tensor` axis, and what would you do for 16 heads on
   a 12-chip system?

:::{admonition} Answer
:class: dropdown
Attention runs per shard with whole heads on each device (Splash works on [heads, sequence, head_dim]
blocks). 16 heads cannot split 12 ways. You could use `tensor=4` with `data=3` (which needs a batch
divisible by 3) or `sequence=3`, or 8 of the 12 chips. `TpuTransformer` and `UlyssesTransformer` raise a
clear error instead of guessing.
:::

2. Using `perf.param_bytes`, how much memory per chip would splitting the AdaLN modulation linears
   (`norm1.linear`, `norm1_context.linear`) save under `tp` on 8 chips?

:::{admonition} Answer
:class: dropdown
Each is 12288×2048 (+bias) per block and stream: 2 × 54 × 25.18 M ≈ 2.72 B parameters ≈ 5.44 GB in bf16.
Split 8 ways, that is 0.68 GB per chip instead of 5.44, so `tp` would drop from about 7.1 to about 2.4 GB per
chip. Try it with a custom rule list, such as
`RULE_SETS["tp"] + [Rule("tp/adaln", r"transformer_blocks\\.\\d+\\.norm1(_context)?\\.linear\\.(weight|bias)", ("tensor", None))]`.
:::

3. Ulysses moves the video q, k, v and output through all-to-alls. Why is it attractive on GPUs, where TP
   is the usual choice for large language models?

:::{admonition} Answer
:class: dropdown
Here the sequence is long (about 112k tokens) while the model is modest (8.3B), so activations dominate and the
weights fit on one GPU. Ulysses keeps the weights whole, which means no all-reduce after every matmul. Per
block it moves only the attention inputs and outputs, and each all-to-all sends 1/N of them to each peer.
The planner's estimate at 720p is about 22 GB per device per step for Ulysses, against about 176 GB for
plain TP.
:::"""))


def build():
    return notebook(cells)


if __name__ == "__main__":
    main(build, "notebooks/03_sharding.ipynb")
