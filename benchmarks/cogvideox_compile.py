"""Compile the real CogVideoX1.5-5B denoising step (a CFG pair) for a v6e-8 (and a v5p-8) on this CPU: per-device
memory, fits, collectives and FLOPs for tensor=8 vs data=2 x tensor=4 and a sequence layout, at 768x1360 and 720x1280,
81 frames. Not a unit test:

    .venv/bin/python benchmarks/cogvideox_compile.py               # every configuration, resumable (minutes each)
    .venv/bin/python benchmarks/cogvideox_compile.py --only 768x1360/v6e-8/data=2,tensor=4
    .venv/bin/python benchmarks/cogvideox_compile.py --table       # rewrite the markdown from the saved JSON

Each compile is one ``python -m hyv_lib compile --json`` child process (the public CLI); its report and command are
saved as they finish in benchmarks/results/cogvideox_compile_<date>_cpu_libtpu.json, and a rerun skips those there.
The markdown holds the table, the planner's numbers beside the compiler's, and the section that reads the compiled
programs against gpu-tpu-pedia's 1.13 vs 1.79 s/step. What the compiler reports is a memory and collective check, not
a timing.
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import compile_runs  # noqa: E402  (benchmarks/compile_runs.py, beside this script)

sys.path.insert(0, os.path.dirname(HERE))
DATE = "2026-11-27"
STEM = os.path.join(HERE, "results", f"cogvideox_compile_{DATE}_cpu_libtpu")
PRESET = "cogvideox1.5_5b"
SLICES = {"v6e-8": "v6e:2x4", "v5p-8": "v5p:2x2x1"}
SIZES = {"768x1360": (768, 1360, 81), "720x1280": (720, 1280, 81)}
#: (slice, size, mesh, sharding) in the order they are compiled: the seed's pair first (its to_out and ff.net.2 are
#: sharded: hyv_lib's ``tp``), then the CLI's default rule set on the issue's command, a sequence axis, 720x1280.
CONFIGS = [
    ("v6e-8", "768x1360", "tensor=8", "tp"),
    ("v6e-8", "768x1360", "data=2,tensor=4", "tp"),
    ("v6e-8", "768x1360", "data=2,tensor=4", "tp_replicated_out"),
    ("v6e-8", "720x1280", "data=2,tensor=4", "tp_replicated_out"),
    ("v6e-8", "768x1360", "tensor=4,sequence=2", "tp"),
    ("v6e-8", "720x1280", "tensor=8", "tp"),
    ("v6e-8", "720x1280", "data=2,tensor=4", "tp"),
    ("v6e-8", "768x1360", "tensor=8", "tp_replicated_out"),
    ("v5p-8", "768x1360", "tensor=4", "tp"),
    ("v5p-8", "768x1360", "data=2,tensor=2", "tp"),
]
#: gpu-tpu-pedia's CogVideoX1.5-5B times on a v6e-8 (single author, unverified), 50 steps, CFG 6.
CITED = {("768x1360", "data=2,tensor=4"): 1.13, ("768x1360", "tensor=8"): 1.79,
         ("720x1280", "data=2,tensor=4"): 106.47 / 50}


def key(slice_: str, size: str, mesh: str, sharding: str) -> str:
    return f"{size}/{slice_}/{mesh}/{sharding}"


def compile_child(slice_: str, size: str, mesh: str, sharding: str) -> dict:
    """One ``python -m hyv_lib compile --json`` child: its report with the command, or the error it ended with."""
    height, width, frames = SIZES[size]
    return compile_runs.compile_child(["--preset", PRESET, "--topology", SLICES[slice_], "--mesh", mesh, "--sharding",
                                       sharding, "--height", str(height), "--width", str(width), "--video_length",
                                       str(frames)])


def planner_row(r: dict) -> dict:
    """The analytic planner's per-device numbers for the same configuration (hyv_lib.planning.planner.device_plan)."""
    from hyv_lib.planning.planner import device_plan

    size = r["size"]
    plan = device_plan(PRESET, size["height"], size["width"], size["video_length"], r["mesh"], r["sharding"])
    return dict(memory=plan["per_device_bytes"]["total"], flops=plan["flops"], collectives=plan["collectives"],
                sent=plan["sent_bytes"])


def table(results: dict) -> str:
    gib = 2**30
    runs = results["runs"]
    lines = [
        f"# CogVideoX1.5-5B compiled for TPU slices ({DATE}, libtpu 0.0.42.1 on a CPU, no TPU)",
        "",
        "`python benchmarks/cogvideox_compile.py`: each row is `python -m hyv_lib compile --json` (its command is in "
        "the last table): one denoising step of the 5.57B DiT on a CFG pair (batch 2), bf16 weights and activations, "
        "Splash attention compiled by Mosaic (head_dim 64 zero-padded to 128, blocks 2048/2048/1024), the 42 blocks "
        "unrolled. Tokens: 226 T5 + 11 x 48 x 85 = 44,880 video at 768x1360x81 (45,106 joint), 11 x 45 x 80 = 39,600 "
        "at 720x1280x81 (39,826). `tp` = Megatron (to_q/k/v and ff.net.0 split by output features, to_out.0 and "
        "ff.net.2 by input features: what gpu-tpu-pedia shards); `tp_replicated_out` (the CLI's default) keeps "
        "to_out.0 and ff.net.2 whole. Memory is the compiler's per-device figure; `fits` = it compiled and its total "
        "is within what the compiler lets a program use. matmul TFLOP = XLA's dots re-counted from the HLO "
        "(hyv_lib.planning.hlo.xla_flops); attention TFLOP = the analytic count divided over data x tensor x sequence "
        "(XLA does not count a Pallas kernel). sent GB = what each device puts on the wire for all collectives, by "
        "the ring count. A memory and collective check, not a timing.",
        "",
        "| size | slice | mesh | rules | fits | per device GiB (weights+inputs / temporaries) | matmul TFLOP / device "
        "| attention TFLOP / device | collectives (count, result GiB) | sent GB / device | planner GiB, matmul TFLOP "
        "| cited s/step |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    from hyv_lib.planning.costs import step_flops

    for slice_, size, mesh, sharding in CONFIGS:
        r = runs.get(key(slice_, size, mesh, sharding))
        if r is None:
            continue
        if "error" in r:
            lines.append(f"| {size} | {slice_} | {mesh} | {sharding} | error: {r['error']} | | | | | | | |")
            continue
        m = r["per_device_bytes"]
        h, w, f = SIZES[size]
        n = r["devices"]
        attention = step_flops(PRESET, h, w, f)["attention"] / n
        coll = ", ".join(f"{c['kind']} x{c['count']} {c['bytes'] / gib:.1f}" for c in r["collectives"]) or "none"
        sent = sum(op["sent_bytes"] for op in r.get("collective_ops", []))
        try:
            plan = planner_row(r)
        except Exception as err:  # a layout the planner refuses still shows the compiler's row
            plan = dict(memory=float("nan"), flops=dict(linear=float("nan")), error=str(err))
        matmul = r.get("matmul_flops_per_device")
        # gpu-tpu-pedia's layouts shard to_out and ff.net.2 as `tp` does; its 720x1280 figure is end to end / 50
        cited = CITED.get((size, mesh)) if slice_ == "v6e-8" and sharding == "tp" else None
        lines.append(
            f"| {size} | {slice_} | {mesh} | {sharding} | {'yes' if r['fits'] else 'no'} | {m['total'] / gib:.2f} "
            f"({m['arguments'] / gib:.2f} / {m['temporaries'] / gib:.2f}) | "
            f"{'n/a' if matmul is None else f'{matmul / 1e12:.1f}'} | {attention / 1e12:.1f} | {coll} | "
            f"{sent / 1e9:.1f} | {plan['memory'] / gib:.2f}, {plan['flops']['linear'] / 1e12:.1f} | "
            f"{'' if cited is None else f'{cited:.2f}' + (' (end to end / 50)' if size == '720x1280' else '')} |")
    lines += ["", "## The largest collectives of each program", "",
              "Per program, the collectives carrying the most bytes: kind, devices per group, result shape, count, "
              "GB sent per device (ring count).", ""]
    for slice_, size, mesh, sharding in CONFIGS:
        r = runs.get(key(slice_, size, mesh, sharding))
        if r is None or "error" in r:
            continue
        ops = r.get("collective_ops", [])[:4]
        text = "; ".join(f"{o['kind']} over {o['group']}: {o['shapes']} x{o['count']} = "
                         f"{o['sent_bytes'] / 1e9:.1f} GB" for o in ops) or "none"
        lines.append(f"- {size} {slice_} {mesh} {sharding}: {text}")
    lines += ["", "## Commands", "", "| configuration | compile s (wall s) | command |", "| --- | --- | --- |"]
    for name, r in sorted(runs.items()):
        lines.append(f"| {name} | {r.get('compile_seconds', '')} ({r['wall_seconds']}) | `{r['command']}` |")
    lines += ["", *explain(runs)]
    return "\n".join(lines)


def sequence_lines(runs: dict, sent: dict) -> list[str]:
    """The sequence layout beside the pair: its collectives by kind."""
    r = runs.get(key("v6e-8", "768x1360", "tensor=4,sequence=2", "tp"))
    if r is None or "error" in r:
        return []
    total = sum(op["sent_bytes"] for op in r["collective_ops"])
    kinds = ", ".join(f"{c['count']} {c['kind']}s of {c['bytes'] / 2**30:.1f} GiB" for c in r["collectives"])
    return ["", f"The sequence layout, tensor=4 x sequence=2 (the CFG pair together, the joint sequence halved), sits "
                f"between them: {total / 1e9:.1f} GB sent per device ({kinds}). Its all-reduces are "
                "data=2 x tensor=4's (both samples, half the sequence each, over 4 devices), and on top of them the "
                "all-to-alls move full-width [2, S/2, 3072] activations as well as q, k, v and the attention output "
                "between the sequence halves: CogVideoX's MLP runs on [text ; video] concatenated, which XLA "
                f"re-shards every block. Same matmul work ({r['matmul_flops_per_device'] / 1e12:.1f} TFLOP); by the "
                f"fit above it would land near {compute_at(sent, total):.2f} s/step."]


def compute_at(sent: dict, total: float) -> float:
    """The step time the two-point fit (compute + sent / bandwidth) gives for ``total`` bytes sent per device."""
    slow, fast = CITED[("768x1360", "tensor=8")], CITED[("768x1360", "data=2,tensor=4")]
    bandwidth = (sent["t8"] - sent["d2"]) / (slow - fast)
    return fast + (total - sent["d2"]) / bandwidth


def v5p_lines(runs: dict) -> list[str]:
    """The same pair on a v5p-8 (4 chips), where XLA's cost model does return a time for the program."""
    rows = [runs.get(key("v5p-8", "768x1360", mesh, "tp")) for mesh in ("tensor=4", "data=2,tensor=2")]
    if any(r is None or "error" in r or r.get("compiler_estimate_seconds") is None for r in rows):
        return []
    (t4, d2), sent = rows, [sum(op["sent_bytes"] for op in r["collective_ops"]) for r in rows]
    return ["", f"On a v5p-8 (4 chips), where XLA's cost model does return a time (it prices the Splash kernels by "
                f"their bytes only, so attention is missing from it): tensor=4 "
                f"{t4['compiler_estimate_seconds']:.2f} s vs data=2 x tensor=2 {d2['compiler_estimate_seconds']:.2f} s "
                f"({t4['compiler_estimate_seconds'] / d2['compiler_estimate_seconds']:.2f}x), sending "
                f"{sent[0] / 1e9:.1f} vs {sent[1] / 1e9:.1f} GB per device for the same matmuls "
                f"({t4['matmul_flops_per_device'] / 1e12:.1f} vs {d2['matmul_flops_per_device'] / 1e12:.1f} TFLOP). "
                "The compiler's own model thus sees the tensor-only layout as slower for its collectives, but by "
                f"{t4['compiler_estimate_seconds'] / d2['compiler_estimate_seconds'] - 1:.0%} on a v5p's 1,200 GB/s "
                "ICI, not by a factor like 1.58."]


def explain(runs: dict) -> list[str]:
    """The section that reads the two compiled 768x1360 programs (tensor=8 vs data=2 x tensor=4, ``tp``) against
    gpu-tpu-pedia's 1.79 vs 1.13 s/step."""
    from hyv_lib.planning.costs import step_flops
    from hyv_lib.planning.hardware import CHIPS

    t8, d2 = (runs.get(key("v6e-8", "768x1360", mesh, "tp")) for mesh in ("tensor=8", "data=2,tensor=4"))
    if not t8 or not d2 or "error" in t8 or "error" in d2:
        return ["## Why data=2 x tensor=4 beat tensor=8 (1.13 vs 1.79 s/step)", "", "(not compiled yet)"]
    chip = CHIPS["v6e"]
    attention = step_flops(PRESET, 768, 1360, 81)["attention"] / 8
    work = {name: r["matmul_flops_per_device"] + attention for name, r in (("t8", t8), ("d2", d2))}
    sent = {name: sum(op["sent_bytes"] for op in r["collective_ops"]) for name, r in (("t8", t8), ("d2", d2))}
    slow, fast = CITED[("768x1360", "tensor=8")], CITED[("768x1360", "data=2,tensor=4")]
    # t = compute + sent / bandwidth, collectives not overlapped: the one (compute, bandwidth) through both times
    bandwidth = (sent["t8"] - sent["d2"]) / (slow - fast)
    compute = fast - sent["d2"] / bandwidth
    egress = chip.interconnect_bandwidth / 2
    peak_ratio = (work["d2"] / chip.peak_bf16_flops + sent["t8"] / egress) / (
        work["d2"] / chip.peak_bf16_flops + sent["d2"] / egress)

    def big(r):
        op = r["collective_ops"][0]
        return f"{op['count']} x {op['shapes']} over {op['group']} devices"

    return [
        "## Why data=2 x tensor=4 beat tensor=8 (1.13 vs 1.79 s/step), read from the compiled programs", "",
        "gpu-tpu-pedia (single author, unverified) measured CogVideoX1.5-5B at 768x1360x81 on a v6e-8 at 1.13 s/step "
        "with data=2 x tensor=4 and 1.79 s/step with tensor=8 (1.58x). Its rules shard to_q/k/v, to_out, ff.net.0 and "
        "ff.net.2; the rows compared here are hyv_lib's `tp` (Megatron: the same four matrices split, column then "
        "row). What the two compiled programs hold, per device and step:", "",
        f"- **The same work.** matmuls {d2['matmul_flops_per_device'] / 1e12:.1f} vs "
        f"{t8['matmul_flops_per_device'] / 1e12:.1f} TFLOP (XLA's dots, data=2 x tensor=4 vs tensor=8), attention "
        f"{attention / 1e12:.1f} TFLOP in both (Splash, 12 heads x 1 sample vs 6 heads x 2 samples per device): "
        f"{work['d2'] / 1e12:.0f} TFLOP, {work['d2'] / chip.peak_bf16_flops:.2f} s at the v6e's 918 TFLOP/s peak. "
        "Neither layout gives a device more FLOPs; attention (71% of the step) splits perfectly either way.",
        f"- **Memory is not the limit.** {d2['per_device_bytes']['total'] / 2**30:.1f} vs "
        f"{t8['per_device_bytes']['total'] / 2**30:.1f} GiB of 31.25 usable: both fit with room.",
        f"- **2.33x the collectives.** Both programs all-reduce the row-parallel outputs three times per block "
        f"(to_out of the video and of the text tokens, ff.net.2 of the joint sequence): 126 all-reduces, nothing "
        f"else. tensor=8 all-reduces both CFG samples over 8 devices ({big(t8)}); data=2 x tensor=4 one sample over 4 "
        f"({big(d2)}): twice the bytes per all-reduce, and a ring over 8 sends 2 x 7/8 of them instead of 2 x 3/4. "
        f"Each device sends {sent['t8'] / 1e9:.1f} GB per step at tensor=8 vs {sent['d2'] / 1e9:.1f} GB "
        f"({sent['t8'] / sent['d2']:.2f}x).",
        "", "**Does that explain 1.58x?** Only if the collectives are slow and not hidden behind compute. With "
        f"equal compute, the step times differ by communication alone: if a step is compute + sent / bandwidth, the "
        f"only pair through both measurements is {compute:.2f} s of compute ({work['d2'] / compute / 1e12:.0f} "
        f"TFLOP/s, {work['d2'] / compute / chip.peak_bf16_flops:.0%} of peak) and an effective "
        f"{bandwidth / 1e9:.0f} GB/s per device for the all-reduces. That bandwidth is "
        f"{bandwidth / egress:.0%} of the v6e's published egress ({egress / 1e9:.0f} GB/s, half of 800 GB/s "
        "bidirectional per chip); if that 800 GB/s is four links' worth, 71 GB/s is most of one link in one "
        "direction, which a ring laid over a 2x4 grid gets per hop (a guess about the slice's wiring, not checked "
        "here). At the full published figure the same bytes would cost "
        f"{sent['d2'] / egress:.2f} vs {sent['t8'] / egress:.2f} s and predict {peak_ratio:.2f}x at peak compute "
        "(less at any lower MFU), not 1.58x. So: the "
        "compiled programs explain the direction and rule out compute, memory and attention as causes, and they "
        "point at the one thing that differs (the 126 all-reduces carry 2.33x the bytes at tensor=8); the size of "
        "the gap fits only if those all-reduces run near one link's bandwidth and serialise with the matmuls. The "
        "compiler cannot say which: XLA's cost model gives no time for these v6e programs (its optimal_seconds "
        "comes back negative, as for every real-size v6e compile in hyv_lib/compiled/tpu_compile.json), and no TPU "
        "here can measure the collectives. A profile on a v6e-8 "
        "(all-reduce time per block at tensor=4 vs 8) would settle it.",
        *([] if not (rep := runs.get(key("v6e-8", "768x1360", "data=2,tensor=4", "tp_replicated_out")))
          or "error" in rep else [
              "", "By the same reading hyv_lib's default rule set would gain a little more: `tp_replicated_out` on "
                f"data=2 x tensor=4 sends {sum(op['sent_bytes'] for op in rep['collective_ops']) / 1e9:.1f} GB per "
                "device (the attention output is all-gathered once before a whole to_out instead of all-reducing "
                "to_out's partial sums) for "
                f"{(rep['per_device_bytes']['arguments'] - d2['per_device_bytes']['arguments']) / 2**30:.1f} GiB "
                "more weights per device; it also runs to_out whole on every device "
                f"({rep['matmul_flops_per_device'] / 1e12:.1f} vs {d2['matmul_flops_per_device'] / 1e12:.1f} matmul "
                "TFLOP), so which is faster again depends on the bandwidth above."]),
        *sequence_lines(runs, sent),
        *v5p_lines(runs),
        "", "The 720x1280 figure (106.47 s end to end, data=2 x tensor=4) is not a step time: 106.47 / 50 = 2.13 s "
        "would make the smaller video twice as slow per step as 768x1360's 1.13 s, although its step is "
        f"{step_flops(PRESET, 720, 1280, 81)['total'] / step_flops(PRESET, 768, 1360, 81)['total']:.2f}x the FLOPs "
        "(39,826 vs 45,106 tokens) and compiles to the same collectives on smaller activations. The end-to-end time "
        "also holds the T5 encoding, the VAE decode and the first step's compilation; at 1.13 s or less per step, "
        "those would be at least 50 s of it.",
        "", "Not compiled here, and able to change the picture: gpu-tpu-pedia's own rules. Written on the torch "
        "[out, in] weights, its `to_q/k/v (None,'tp')` splits input features (the transpose of Megatron, as the "
        "project's reference notes on gpu-tpu-pedia point out, section 8), which GSPMD must meet with more or other "
        "collectives; its K-smooth and exp2 kernel change the attention, not the layout comparison.",
    ]


def main() -> None:
    compile_runs.run_configs(__doc__.split("\n\n")[0], "';'-separated filters on 'size/slice/mesh/rules'", STEM, CONFIGS, key,
                             compile_child, table)


if __name__ == "__main__":
    main()
