"""Compile the real HunyuanVideo-1.5 train step (forward, backward, AdamW) for 8-chip-class TPU slices on this CPU, and
find what fits: for each slice x resolution x LoRA/full, the largest batch at 121 frames, or the longest video
(4n+1 frames) at batch 1 when 121 frames do not fit. Not a unit test:

    .venv/bin/python benchmarks/train_compile.py                 # the grid, resumable (each compile takes minutes)
    .venv/bin/python benchmarks/train_compile.py --table         # rewrite the markdown table from the saved JSON

Each compile is one ``python -m hyv_lib compile --train ... --json`` child process (the public CLI); its report and
command are saved as they finish in benchmarks/results/train_compile_<date>_cpu_libtpu.json, and a rerun skips those
already there. The search (see :func:`search`): 121 frames at batch 1 everywhere, then per configuration the largest
batch at 121 frames (or, where 121 frames do not fit, the longest video at batch 1) by doubling and bisection; the
mesh is compile's default for the batch. What the compiler reports is a memory and collective check, not a timing.
"""

from __future__ import annotations

import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import compile_runs  # noqa: E402  (benchmarks/compile_runs.py, beside this script)

DATE = "2026-11-26"
STEM = os.path.join(HERE, "results", f"train_compile_{DATE}_cpu_libtpu")
SLICES = {"v5p-8": "v5p:2x2x1", "v6e-8": "v6e:2x4", "v5e-8": "v5e:2x4"}
SIZES = {"480p": "480p_t2v", "720p": "720p_t2v"}
TRAIN = ("lora", "full")
FRAMES = 121
MAX_BATCH = 16


def load() -> dict:
    return compile_runs.load(STEM)


def save(results: dict) -> None:
    compile_runs.save(STEM, results, table)


def compile_child(slice_: str, size: str, train: str, frames: int, batch: int) -> dict:
    """One ``python -m hyv_lib compile --train`` child: its report with the command, or the error it ended with."""
    return compile_runs.compile_child(["--preset", SIZES[size], "--topology", SLICES[slice_], "--train", train,
                                       "--video_length", str(frames), "--batch_size", str(batch)])


def search(results: dict, slice_: str, size: str, train: str, log, base_only: bool = False) -> None:
    """Compile what the search needs for one configuration (skipping saved compiles); ``base_only``: only 121 frames
    at batch 1 (the first pass over the grid).

    Where 121 frames fit at batch 1: batches 2, 4, 8, 16 until one does not fit, then bisection between the last that
    fits and the first that does not. Where they do not: 9 frames, then bisection over the latent frames between."""

    def run(frames: int, batch: int) -> dict:
        key = f"{slice_}/{size}/{train}/F{frames}/B{batch}"
        if key not in results["runs"]:
            log(f"compiling {key} ...")
            results["runs"][key] = compile_child(slice_, size, train, frames, batch)
            save(results)
            r = results["runs"][key]
            log(f"  {key}: {'error ' + r['error'] if 'error' in r else ('fits' if r['fits'] else 'does not fit')}"
                f", {r.get('per_device_bytes', {}).get('total', 0) / 2**30:.2f} GiB, {r['wall_seconds']} s")
        return results["runs"][key]

    def fits(r: dict) -> bool:
        return "error" not in r and r["fits"]

    def bisect(lo: int, hi: int, fits_at) -> None:
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits_at(mid) else (lo, mid)

    base = run(FRAMES, 1)
    if "error" in base or base_only:
        return
    if fits(base):  # the largest batch at 121 frames
        lo, hi = 1, None
        while hi is None and 2 * lo <= MAX_BATCH:
            lo, hi = (2 * lo, None) if fits(run(FRAMES, 2 * lo)) else (lo, 2 * lo)
        if hi is not None:
            bisect(lo, hi, lambda b: fits(run(FRAMES, b)))
    elif fits(run(9, 1)):  # the longest video at batch 1, in latent frames (frames = 4 (t - 1) + 1)
        bisect(3, (FRAMES - 1) // 4 + 1, lambda t: fits(run(4 * (t - 1) + 1, 1)))


def summary(results: dict) -> list[dict]:
    """Per configuration: the largest (frames, batch) that fits and its report, and how many compiles it took."""
    rows = []
    for slice_ in SLICES:
        for size in SIZES:
            for train in TRAIN:
                prefix = f"{slice_}/{size}/{train}/"
                runs = {k[len(prefix):]: r for k, r in results["runs"].items() if k.startswith(prefix)}
                if not runs:
                    continue
                ok = [(r["size"]["video_length"], r["batch"], r) for r in runs.values() if "error" not in r and
                      r["fits"]]
                best = max(ok, key=lambda t: (t[0] * t[1], t[0]))[2] if ok else None
                smallest_bad = [r for r in runs.values() if "error" not in r and not r["fits"]]
                rows.append(dict(slice=slice_, size=size, train=train, best=best, compiles=len(runs),
                                 failed=min(smallest_bad, key=lambda r: r["size"]["video_length"] * r["batch"])
                                 if smallest_bad else None))
    return rows


def table(results: dict) -> str:
    gib = 2**30

    def g(n):
        return "n/a" if n is None else f"{n / gib:.1f}"

    lines = [
        f"# The HunyuanVideo-1.5 train step compiled for TPU slices ({DATE}, libtpu on a CPU, no TPU)",
        "",
        "`python benchmarks/train_compile.py`: each row is `python -m hyv_lib compile --train ... --json` (commands "
        "below), the whole update (forward, backward with each block recomputed, AdamW) of the 8.3B DiT, bf16 weights "
        "and activations, fp32 AdamW moments and fp32 master weights for the trained parameters, FSDP over every "
        "device (mesh: data = the largest count dividing both the devices and the batch, sequence = the rest), the "
        "blocks as one scan, "
        "Splash attention (forward and backward kernels, Mosaic). LoRA: rank 8, alpha 16 (the official train.py's), "
        "on the attention q/k/v/out projections of both streams in the 54 blocks. Memory is the compiler's per-device "
        "figure; `fits` = it compiled and its total is within what the compiler lets a program use. A memory check, "
        "not a timing. 16:9 buckets: 480p = 480x848, 720p = 720x1280.",
        "",
        "## What fits",
        "",
        "| slice | size | train | largest that fits (frames x batch) | per device: total (weights+state / "
        "temporaries) GiB | HBM available GiB | matmul TFLOP per device and step | compiles | smallest that "
        "does not fit |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in summary(results):
        b, bad = row["best"], row["failed"]
        bad_text = "" if bad is None else (f"{bad['size']['video_length']} x {bad['batch']}: "
                                           f"{g(bad['per_device_bytes']['total'])} GiB")
        if b is None:
            lines.append(f"| {row['slice']} | {row['size']} | {row['train']} | nothing fits | | | | "
                         f"{row['compiles']} | {bad_text} |")
            continue
        m = b["per_device_bytes"]
        flops = b.get("matmul_flops_per_device")
        cap = " (the search's cap)" if b["batch"] == MAX_BATCH else ""
        lines.append(f"| {row['slice']} | {row['size']} | {row['train']} | "
                     f"{b['size']['video_length']} x {b['batch']}{cap} "
                     f"| {g(m['total'])} ({g(m['arguments'])} / {g(m['temporaries'])}) | "
                     f"{g(b['hbm_available_per_device'])} | {'n/a' if flops is None else f'{flops / 1e12:,.0f}'} | "
                     f"{row['compiles']} | {bad_text} |")
    lines += ["", "## Every compile", "",
              "| configuration | mesh | fits | total GiB | arguments GiB | temporaries GiB | collectives | "
              "compile s | command |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for key, r in sorted(results["runs"].items()):
        if "error" in r:
            lines.append(f"| {key} | | error: {r['error']} | | | | | {r['wall_seconds']} | `{r['command']}` |")
            continue
        m = r["per_device_bytes"]
        mesh = ",".join(f"{a}={n}" for a, n in r["mesh"].items() if n > 1)
        coll = ", ".join(f"{c['kind']} x{c['count']}" for c in r["collectives"]) or "n/a"
        lines.append(f"| {key} | {mesh} | {'yes' if r['fits'] else 'no'} | {g(m['total'])} | {g(m['arguments'])} | "
                     f"{g(m['temporaries'])} | {coll} | {r['compile_seconds']} | `{r['command']}` |")
    return "\n".join(lines)


def main() -> None:
    args = compile_runs.arguments(__doc__.split("\n\n")[0], "comma-separated filters on 'slice/size/train' (e.g. v5p-8)")
    if args.table:
        compile_runs.rewrite_table(STEM, table)
        return
    results = load()

    def log(text):
        print(time.strftime("%H:%M:%S"), text, flush=True)

    order = [(s, z, t) for z in SIZES for t in TRAIN for s in SLICES]
    filters = args.only.split(",") if args.only else None
    chosen = [c for c in order if not filters or any(f in "/".join(c) for f in filters)]
    for base_only in (True, False):  # 121 frames at batch 1 everywhere first, then the searches
        for slice_, size, train in chosen:
            search(results, slice_, size, train, log, base_only)
    save(results)
    print(table(results))


if __name__ == "__main__":
    main()
