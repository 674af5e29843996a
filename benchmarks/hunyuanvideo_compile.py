"""Compile the real HunyuanVideo (13B) denoising step at 720x1280x129 and its LoRA train step for a v6e-8 and a v5p-8 on
this CPU: per-device memory, fits, collectives and FLOPs per layout, the analytic planner's numbers beside them. Not a
unit test:

    .venv/bin/python benchmarks/hunyuanvideo_compile.py               # every configuration, resumable (minutes each)
    .venv/bin/python benchmarks/hunyuanvideo_compile.py --only step/v6e-8/tensor=8
    .venv/bin/python benchmarks/hunyuanvideo_compile.py --table       # rewrite the markdown from the saved JSON

Each compile is one ``python -m hyv_lib compile --json`` child process (the public CLI); its report and command are
saved as they finish in benchmarks/results/hunyuanvideo_compile_<date>_cpu_libtpu.json, and a rerun skips those there.
HunyuanVideo embeds its guidance (one sample per step, no CFG pair), so a step has no ``data`` axis: its layouts split
the 24 heads over tensor (and sequence). What the compiler reports is a memory and collective check, not a timing.
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import compile_runs  # noqa: E402  (benchmarks/compile_runs.py, beside this script)

sys.path.insert(0, os.path.dirname(HERE))
DATE = "2026-11-28"
STEM = os.path.join(HERE, "results", f"hunyuanvideo_compile_{DATE}_cpu_libtpu")
PRESET = "hunyuanvideo_t2v"
SLICES = {"v6e-8": "v6e:2x4", "v5p-8": "v5p:2x2x1"}
HEIGHT, WIDTH, FRAMES = 720, 1280, 129  # HunyuanVideoPipeline's defaults
#: The LoRA of the guide's HunyuanVideo recipe (MindSpeed-MM's mapped): rank 64 on the attention, MLP and
#: single-stream layers (``--lora_targets attn,mlp,single``), alpha = rank.
LORA_RANK, LORA_TARGETS = 64, "attn,mlp,single"
#: (kind, slice, mesh, sharding) in the order they are compiled: ``step`` = one denoising step (the CLI's default rule
#: set first, then Megatron ``tp``, a sequence axis, FSDP), ``lora`` = the LoRA train step (FSDP over the mesh,
#: remat per block; its default mesh: every device on ``sequence``).
CONFIGS = [
    ("step", "v6e-8", "tensor=8", "tp_replicated_out"),
    ("step", "v5p-8", "tensor=4", "tp_replicated_out"),
    ("step", "v6e-8", "tensor=8", "tp"),
    ("lora", "v6e-8", "sequence=8", "fsdp"),
    ("step", "v6e-8", "tensor=4,sequence=2", "tp_replicated_out"),
    ("lora", "v5p-8", "sequence=4", "fsdp"),
    ("step", "v6e-8", "tensor=8", "fsdp"),
]


#: What a saved run's own error line cannot say (a child killed by a signal prints nothing), with its source.
NOTES: dict[str, str] = {}


def key(kind: str, slice_: str, mesh: str, sharding: str) -> str:
    return f"{kind}/{slice_}/{mesh}/{sharding}"


def compile_child(kind: str, slice_: str, mesh: str, sharding: str) -> dict:
    """One ``python -m hyv_lib compile --json`` child: its report with the command, or the error it ended with."""
    args = ["--preset", PRESET, "--topology", SLICES[slice_], "--mesh", mesh, "--height", str(HEIGHT), "--width",
            str(WIDTH), "--video_length", str(FRAMES)]
    if kind == "lora":
        args += ["--train", "lora", "--lora_rank", str(LORA_RANK), "--lora_alpha", str(LORA_RANK),
                 "--lora_targets", LORA_TARGETS]
    else:
        args += ["--sharding", sharding]
    return compile_runs.compile_child(args)


def planner_row(kind: str, r: dict) -> dict:
    """The analytic planner's per-device numbers for the same configuration: :func:`device_plan` for a step; for a
    train step the training memory model (:func:`model_of_compiled`; it models no collectives or FLOPs)."""
    if kind != "step":
        from hyv_lib.planning.train_check import model_of_compiled

        return dict(memory=model_of_compiled(r)["model_total"], linear=None, sent=None)
    from hyv_lib.planning.planner import device_plan

    plan = device_plan(PRESET, HEIGHT, WIDTH, FRAMES, r["mesh"], r["sharding"])
    return dict(memory=plan["per_device_bytes"]["total"], linear=plan["flops"]["linear"], sent=plan["sent_bytes"])


def table(results: dict) -> str:
    from hyv_lib.planning.costs import param_bytes, step_flops

    gib = 2**30
    runs = results["runs"]
    flops = step_flops(PRESET, HEIGHT, WIDTH, FRAMES)
    tok = flops["tokens"]
    lines = [
        f"# HunyuanVideo (13B) compiled for TPU slices ({DATE}, libtpu 0.0.42.1 on a CPU, no TPU)",
        "",
        "`python benchmarks/hunyuanvideo_compile.py`: each row is `python -m hyv_lib compile --json` (its command is "
        f"in the last table). `step`: one denoising step of the {param_bytes(PRESET)['params'] / 1e9:.2f}B DiT (20 "
        "dual- + 40 single-stream blocks, unrolled) on ONE sample (the guidance is embedded, no CFG pair), bf16 "
        "weights and activations, Splash attention compiled by Mosaic; "
        f"{tok['video']:,} video tokens (33 x 45 x 80) + {tok['context']} text tokens = {tok['joint']:,} at "
        f"{HEIGHT}x{WIDTH}x{FRAMES}; {flops['total'] / 1e15:.2f} PFLOP per step, "
        f"{flops['attention_share']:.0%} of it attention. `tp` = Megatron (Q/K/V and the first MLP layer split by "
        "output features, the attention outputs and the second MLP layer, the single blocks' proj_out included, by "
        "input features); `tp_replicated_out` (the CLI's default) keeps the row-parallel ones whole; `fsdp` gathers "
        f"every block matrix. `lora`: the train step (forward, backward, AdamW) of a rank-{LORA_RANK} LoRA on "
        f"`{LORA_TARGETS}` (alpha {LORA_RANK}), FSDP over the mesh, each block recomputed in the backward pass, "
        "the 20 dual- and the 40 single-stream blocks as two `lax.scan` loops over their stacked weights, batch 1. "
        "Memory is the compiler's per-device figure; `fits` = it compiled and its total is within what the compiler "
        "lets a program use (available GiB). matmul TFLOP = XLA's dots re-counted from the HLO "
        "(hyv_lib.planning.hlo.xla_flops; Splash is a Pallas call XLA does not count); sent GB = what each device "
        "puts on the wire for all collectives, by the ring count. Planner: hyv_lib.planning.planner.device_plan for "
        "a step, the training memory model (hyv_lib.planning.train_check.model_of_compiled, memory only) for a train "
        "step. A memory and collective check, not a timing.",
        "",
        "| kind | slice | mesh | rules | fits | per device GiB (arguments / temporaries / code) | available GiB "
        "| matmul TFLOP / device | collectives (count, result GiB) | sent GB / device | planner GiB (vs compiler less "
        "code) | planner matmul TFLOP / device | planner sent GB |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for kind, slice_, mesh, sharding in CONFIGS:
        r = runs.get(key(kind, slice_, mesh, sharding))
        if r is None:
            lines.append(f"| {kind} | {slice_} | {mesh} | {sharding} | not compiled | | | | | | | | |")
            continue
        if "error" in r:
            note = NOTES.get(key(kind, slice_, mesh, sharding))
            lines.append(f"| {kind} | {slice_} | {mesh} | {sharding} | error: {r['error']}"
                         f"{' (see below)' if note else ''} | | | | | | | | |")
            continue
        m = r["per_device_bytes"]
        split = ("n/a" if m["arguments"] is None else
                 f"{m['arguments'] / gib:.2f} / {m['temporaries'] / gib:.2f} / {m['code'] / gib:.2f}")
        coll = ", ".join(f"{c['kind']} x{c['count']} {c['bytes'] / gib:.1f}" for c in r["collectives"]) or "none"
        sent = sum(op["sent_bytes"] for op in r.get("collective_ops", []))
        try:
            plan = planner_row(kind, r)
        except Exception as err:  # a configuration the planner refuses still shows the compiler's row
            plan = dict(memory=None, linear=None, sent=None, error=f"{type(err).__name__}: {err}")
        versus = ("" if plan["memory"] is None or m["code"] is None else
                  f" ({plan['memory'] / (m['total'] - m['code']) - 1:+.1%})")
        matmul = r.get("matmul_flops_per_device")

        def num(v, scale, fmt=".1f"):
            return "n/a" if v is None else format(v / scale, fmt)

        lines.append(
            f"| {kind} | {slice_} | {mesh} | {sharding} | {'yes' if r['fits'] else '**no**'} | "
            f"{m['total'] / gib:.2f} ({split}) | {r['hbm_available_per_device'] / gib:.2f} | {num(matmul, 1e12)} | "
            f"{coll} | {sent / 1e9:.1f} | {num(plan['memory'], gib, '.2f')}{versus} | {num(plan['linear'], 1e12)} | "
            f"{num(plan['sent'], 1e9)} |")
    lines += ["", "## The largest collectives of each program", "",
              "Per program, the collectives carrying the most bytes: kind, devices per group, result shape, count, "
              "GB sent per device (ring count).", ""]
    for config in CONFIGS:
        r = runs.get(key(*config))
        if r is None or "error" in r:
            continue
        ops = r.get("collective_ops", [])[:4]
        text = "; ".join(f"{o['kind']} over {o['group']}: {o['shapes']} x{o['count']} = "
                         f"{o['sent_bytes'] / 1e9:.1f} GB" for o in ops) or "none"
        lines.append(f"- {key(*config)}: {text}")
    lines += reading(runs)
    notes = [(name, note) for name, note in NOTES.items() if name in runs]
    missing = [key(*c) for c in CONFIGS if key(*c) not in runs]
    if notes or missing:
        lines += ["", "## Rows without a compiler's answer", ""]
        lines += [f"- {name}: {note}" for name, note in notes]
        if missing:
            lines.append(f"- not compiled ({', '.join(missing)}): the session's time ran out.")
    errors = [(name, r["compile_error"]) for name, r in sorted(runs.items()) if r.get("compile_error")]
    if errors:
        lines += ["", "## What the compiler said when a program did not fit", ""]
        lines += [f"- {name}: `{message}`" for name, message in errors]
    lines += ["", "## Commands", "", "| configuration | compile s (wall s) | command |", "| --- | --- | --- |"]
    for name, r in sorted(runs.items()):
        lines.append(f"| {name} | {r.get('compile_seconds', '')} ({r['wall_seconds']}) | `{r['command']}` |")
    return "\n".join(lines)


def reading(runs: dict) -> list[str]:
    """What the compiled steps say beside the planner: the single-stream blocks' all-to-alls, and how close the
    planner's collectives, matmuls and memory are (each step row)."""
    lines = ["", "## Reading the compiled steps", ""]
    for config in CONFIGS:
        r = runs.get(key(*config))
        if config[0] != "step" or r is None or "error" in r or r.get("compile_error"):
            continue
        ops = r["collective_ops"]
        sent = sum(op["sent_bytes"] for op in ops)
        a2a = sum(op["sent_bytes"] for op in ops if op["kind"] == "all-to-all")
        plan = planner_row("step", r)
        from hyv_lib.planning.planner import device_plan

        collectives = device_plan(PRESET, HEIGHT, WIDTH, FRAMES, r["mesh"], r["sharding"])["collectives"]
        kinds = {c["kind"]: c["bytes"] for c in r["collectives"]}
        worst = max(abs(v / kinds[k] - 1) if kinds.get(k) else (0 if not v else float("inf"))
                    for k, v in collectives.items())
        m = r["per_device_bytes"]
        lines.append(
            f"- {key(*config)}: all-to-alls {a2a / 1e9:.1f} of the {sent / 1e9:.1f} GB each device sends; the "
            f"planner's collectives within {worst:.1%} per kind of the compiler's, its matmuls "
            f"{plan['linear'] / r['matmul_flops_per_device'] - 1:+.2%}, its memory "
            f"{plan['memory'] / (m['total'] - m['code']) - 1:+.1%} of the compiler's total less the generated code "
            f"({m['code'] / 2**30:.2f} GiB, which the planner does not model).")
    lines += ["", "The all-to-alls come from the 40 single-stream blocks on any tensor axis: their proj_out reads "
              "[attention ; MLP] concatenated, 3072 + 12288 features, and a tensor split of that input is t contiguous "
              "chunks, not each device's attention heads followed by its MLP columns; XLA re-shards the attention "
              "output, the MLP output and the concatenation (three all-to-alls per block, "
              "2 x [1, S, (h + f) / t] in all). Splitting proj_out into its attention and MLP column blocks "
              "(two row-parallel matmuls, summed) should avoid them; hyv_lib's rule sets do not, and it was not "
              "tried here.",
              "", "The planner (hyv_lib.planning.layout) models what XLA does around the single-stream blocks: on a "
              "sequence axis the extra all-to-alls of the joint sequence and the hidden state, the text all-gather "
              "and the collective-permutes; under `fsdp` on a tensor axis, Q/K/V run on their shards (never "
              "gathered), the dual blocks' attention output is all-gathered and their MLPs run whole, and the "
              "single blocks run as under `tp`."]
    return lines


def main() -> None:
    compile_runs.run_configs(__doc__.split("\n\n")[0], "';'-separated filters on 'kind/slice/mesh/rules'", STEM, CONFIGS, key,
                             compile_child, table)


if __name__ == "__main__":
    main()
