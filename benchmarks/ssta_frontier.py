"""SSTA on the trained tiny models: quality against dense attention at a few tile densities, on held-out captions.

    .venv/bin/python benchmarks/ssta_frontier.py [--presets tiny_trained_720p,tiny_trained] [--prompts_720p 12] \\
        [--prompts_tiny 15] [--budget_s 1500] [--output benchmarks/results/ssta_frontier_2026-11-27_cpu.json]

Neither tiny model was trained with SSTA (the official's sparse checkpoints were): this measures how far each sparse
setting moves the videos of dense-trained weights, as its tile density drops. For each preset, at its trained size and
the shipped sampling settings (20 steps, guidance 4.5), every held-out caption (seed 1234 + i) is generated with
dense attention and with each SSTA setting of :func:`settings_for` (tiles scaled to the preset's token grid; one tile
size per preset, so FlexAttention compiles once), and :func:`hyv_lib.tiny.sparse_frontier.measure_sparse_frontier`
grades it: frame PSNR against the dense video, the tile density SSTA used (recorded from the run), colour /
direction / background read from the frames, seconds per video.

* hyv-tiny-720p (``tiny_trained_720p``) at 720x1280: a 3 x 9 x 16 token grid (5x5 patches); tiles 1x3x4 (3 x 3 x 4 =
  36 video tiles of 12 tokens); every 3rd held-out caption, as tools/eval_hyv_tiny_720p.py takes them.
* hyv-tiny (``tiny_trained``) at 64x112: a 3 x 4 x 7 grid; tiles 1x2x2 (the width zero-padded to 8: 3 x 2 x 4 = 24
  tiles of 4 tokens); the first held-out captions, as the gates and the step-cache frontier take them; plus a
  whole-grid window (video density 1), which measures what tiling alone costs (zero padding, whole text tiles).

``--budget_s`` is the whole run's wall-time budget: each preset starts no caption that would overrun its share (with
the default order, hyv-tiny gets a fifth and hyv-tiny-720p what is left). Writes the JSON record and a Markdown table
beside it.
Not a unit test; times are of a shared machine and only compare within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time

DEFAULT_OUTPUT = "benchmarks/results/ssta_frontier_2026-11-27_cpu.json"
#: Each preset's size, captions taken (every n-th held-out one) and share of the budget.
RUNS = {"tiny_trained": dict(every=1, share=0.2), "tiny_trained_720p": dict(every=3, share=1.0)}


def settings_for(preset: str):
    """The SSTA settings measured for ``preset``: (name, SstaConfig) pairs, tiles scaled to its token grid."""
    from hyv_lib import SstaConfig

    if preset == "tiny_trained_720p":  # grid 3 x 9 x 16, tiles 1x3x4: 3 x 3 x 4 = 36 tiles
        tile = (1, 3, 4)
        return [("window 3x3x3", SstaConfig(tile=tile, window=(3, 3, 3), sparse_type="sta")),
                ("window 1x3x3 + top-k", SstaConfig(tile=tile, window=(1, 3, 3), topk=8)),  # k 8, halved: 4
                ("window 1x1x3", SstaConfig(tile=tile, window=(1, 1, 3), sparse_type="sta"))]
    if preset == "tiny_trained":  # grid 3 x 4 x 7, tiles 1x2x2: 3 x 2 x 4 = 24 tiles
        tile = (1, 2, 2)
        return [("whole grid (tiling only)", SstaConfig(tile=tile, window=(3, 3, 5), sparse_type="sta")),
                ("window 3x3x3", SstaConfig(tile=tile, window=(3, 3, 3), sparse_type="sta")),
                ("window 1x3x3 + top-k", SstaConfig(tile=tile, window=(1, 3, 3), topk=8)),
                ("window 1x3x3", SstaConfig(tile=tile, window=(1, 3, 3), sparse_type="sta")),
                ("window 1x1x3", SstaConfig(tile=tile, window=(1, 1, 3), sparse_type="sta"))]
    raise ValueError(f"no SSTA settings for preset {preset!r}: {', '.join(RUNS)}")


def markdown(results: dict) -> str:
    """The record as a short Markdown page: one table per preset."""
    from hyv_lib.tiny.sparse_frontier import frontier_rows, markdown_table

    lines = [f"# SSTA quality frontier on the trained tiny models ({results['date']}, CPU)", "",
             f"`{results['command']}`", "",
             "Neither model was trained with SSTA: PSNR is of the uint8 frames against the dense video of the same "
             "caption and seed (pooled MSE over the captions; min: the worst video). Density: the first block's SSTA "
             "tile mask as the run built it (mean over steps, CFG batch and heads), over all tile pairs (text tiles "
             "included: the work the kernel does) and over the video tiles. Colour / direction / background: the "
             "rates read from the frames (hyv_lib.tiny.quality) against the caption; 'same reading' against the "
             "dense video's. Seconds per video on a shared 2-core machine, niced (first caption left out).", ""]
    for run in results["runs"]:
        lines += [f"## {run['preset']} at {run['height']}x{run['width']}, {run['video_length']} frames: token grid "
                  f"{'x'.join(map(str, run['grid']))}, {run['text_len']} context tokens (valid: "
                  f"{run['text_valid']} for the negative and positive prompt)", "",
                  f"{run['prompts']} held-out captions (seed {run['seed']} + i), {run['steps']} steps, guidance "
                  f"{run['guidance_scale']}; {run['wall_s']:.0f} s wall.", "",
                  markdown_table(frontier_rows(run)), ""]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--presets", default="tiny_trained,tiny_trained_720p",
                        help="comma-separated, run in this order (default: hyv-tiny, then hyv-tiny-720p)")
    parser.add_argument("--prompts_720p", type=int, default=12, help="held-out captions for hyv-tiny-720p, at most")
    parser.add_argument("--prompts_tiny", type=int, default=15, help="held-out captions for hyv-tiny, at most")
    parser.add_argument("--steps", type=int, default=None, help="denoising steps (default: the preset's, 20)")
    parser.add_argument("--budget_s", type=float, default=1500.0, help="wall-time budget of the whole run (s)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--output", default=DEFAULT_OUTPUT, help="the JSON record (a .md table is written beside it)")
    args = parser.parse_args(argv)
    presets = args.presets.split(",")
    unknown = [p for p in presets if p not in RUNS]
    if unknown:
        parser.error(f"--presets: each one of {', '.join(RUNS)}, got {', '.join(unknown)}")
    if not os.path.isdir(os.path.dirname(os.path.abspath(args.output))):
        parser.error(f"--output: the folder of {args.output!r} does not exist")

    import torch

    import hyv_lib
    from hyv_lib.base.files import atomic_path
    from hyv_lib.tiny.sparse_frontier import check_record, frontier_rows, held_out_combos, measure_sparse_frontier

    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    runs = []
    for preset in presets:
        left = args.budget_s - (time.perf_counter() - start)
        budget = left * (RUNS[preset]["share"] if preset != presets[-1] else 1.0)
        count = args.prompts_720p if preset == "tiny_trained_720p" else args.prompts_tiny
        combos = held_out_combos(count, every=RUNS[preset]["every"])
        print(f"{preset}: up to {len(combos)} captions, budget {budget:.0f} s", flush=True)
        pipe = hyv_lib.load_pipeline(preset, progress=False)
        record = measure_sparse_frontier(pipe, combos, settings_for(preset), seed=1234, num_inference_steps=args.steps,
                                         budget_s=budget, log=lambda line: print(line, flush=True))
        problems = check_record(record)
        if problems:
            print("inconsistent record:\n  " + "\n  ".join(problems), flush=True)
            return 1
        for row in frontier_rows(record):
            print("  ".join(f"{k}={v}" for k, v in row.items()), flush=True)
        runs.append(record)
        del pipe
    command = "nice -n 10 .venv/bin/python benchmarks/ssta_frontier.py " + " ".join(map(shlex.quote, sys.argv[1:]
                                                                                          if argv is None else argv))
    results = dict(format="hyv_lib.ssta_frontier_runs/1", date=runs[0]["date"], command=command.strip(),
                   wall_s=round(time.perf_counter() - start, 1), runs=runs)
    with atomic_path(args.output) as tmp, open(tmp, "w") as f:
        json.dump(results, f, indent=1)
        f.write("\n")
    md = os.path.splitext(args.output)[0] + ".md"
    with atomic_path(md) as tmp, open(tmp, "w") as f:
        f.write(markdown(results))
    print(f"wrote {args.output} and {md} ({results['wall_s']:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
