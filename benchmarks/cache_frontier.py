"""Step caches on the trained hyv-tiny: denoising speed-up against quality, per cache setting, on held-out prompts.

    .venv/bin/python benchmarks/cache_frontier.py [--prompts 45] [--output results.json] [--plot frontier.png]

Every setting of :func:`hyv_lib.tiny.frontier.default_settings` (uncached, fewer steps, DeepCache, MagCache) generates
the same held-out prompts (hyv-tiny's gate prompts and seeds) at the shipped sampling settings (20 steps, flow shift
3, guidance 4.5). Speed: wall time of the denoising loop (and of the whole generation) summed over the prompts,
against the warmed, hook-free uncached pipeline, measured in one run with the settings taking turns per prompt.
Quality: colour and direction accuracy read from the frames (the gates' reader), and frame PSNR against the uncached
video. Target: a setting at >= 2.5x whose colour and direction accuracy stay within 5 points of uncached.
With --output hyv_lib/weights/hyv-tiny/cache_frontier.json the run becomes the record chapter 04 shows.
Not a unit test; absolute times only compare within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=45, help="held-out prompts to use, 1..45 (default 45)")
    parser.add_argument("--settings", default=None,
                        help="comma-separated indices into default_settings() to run (0, the uncached reference, is "
                             "always run; default: all)")
    parser.add_argument("--output", default=None, help="write the results as JSON here")
    parser.add_argument("--plot", default=None, help="save the frontier plot here (PNG)")
    args = parser.parse_args(argv)

    import hyv_lib
    from hyv_lib.tiny import data
    from hyv_lib.tiny.frontier import default_settings, frontier_table, measure_frontier, meets_goal, plot_frontier

    held_out = data.split_combos()[1]
    if not 1 <= args.prompts <= len(held_out):
        parser.error(f"--prompts: must be in 1..{len(held_out)}, got {args.prompts}")
    settings = default_settings()
    if args.settings:
        try:
            chosen = sorted({0, *(int(i) for i in args.settings.split(","))})
            settings = [settings[i] for i in chosen]
        except (ValueError, IndexError):
            parser.error(f"--settings: comma-separated integers in 0..{len(settings) - 1}, got {args.settings!r}")
    for path in (args.output, args.plot):
        if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            parser.error(f"the folder of {path!r} does not exist")
    combos = held_out[:args.prompts]
    pipe = hyv_lib.load_pipeline("tiny_trained", progress=False)
    with open(os.path.join(pipe.preset.bundled_path, "gates.json")) as f:
        seed = json.load(f)["seed"]  # the gates' seeds: the uncached row is the shipped gate run
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="DeepCache caches none")
        results = measure_frontier(pipe, [c.caption for c in combos], settings, seed=seed, combos=combos)
    rows = frontier_table(results)
    widths = {k: max(len(k), *(len(str(r[k])) for r in rows)) for k in rows[0]}
    print("  ".join(k.ljust(w) for k, w in widths.items()))
    for r in rows:
        print("  ".join(str(r[k]).ljust(w) for k, w in widths.items()))
    reference = results["rows"][0]
    met = [r["name"] for r in results["rows"][1:] if r["method"] != "uncached" and meets_goal(r, reference)]
    print(f"\n{results['prompts']} prompts, {results['machine']}. Reaching >= 2.5x denoising with colour and direction "
          f"within 5 points of uncached: {', '.join(met) if met else 'no cache setting'}")
    if args.output:
        from hyv_lib.base.files import atomic_path

        with atomic_path(args.output) as tmp, open(tmp, "w") as f:
            json.dump(results, f, indent=1)
            f.write("\n")
        print(f"wrote {args.output}")
    if args.plot:
        plot_frontier(results).savefig(args.plot, dpi=120)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
