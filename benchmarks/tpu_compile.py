"""Compile the real HunyuanVideo-1.5 step for 8-chip-class TPU slices on this CPU, one table: per-device HBM vs
capacity, fits, collectives and compile time for every chip x layout x size x cache mode. Not a unit test:

    .venv/bin/python benchmarks/tpu_compile.py                     # the full grid, resumable
    .venv/bin/python benchmarks/tpu_compile.py --table             # print the table of the saved results

Each configuration is one `python -m hyv_lib compile --json` child process (the public CLI, in isolation); results
are appended to hyv_lib/compiled/tpu_compile.json as they finish, and a rerun skips what is already there. What
the compiler reports is a memory and collective check, not a timing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# Saved inside the package: the planner (hyv_lib.planning.planner.compiled_report) and the book read them from there.
RESULTS = os.path.join(os.path.dirname(HERE), "hyv_lib", "compiled", "tpu_compile.json")

#: The slices: v5e-8 and v6e-8 (8 chips, one host), v5p-8 (4 chips = 4 devices), v7x-8 (4 chips = 8 devices).
CHIPS = {"v5e-8": "v5e:2x4", "v5p-8": "v5p:2x2x1", "v6e-8": "v6e:2x4", "v7x-8": "tpu7x:2x2x1"}
#: Layout -> (rule set, mesh for n devices). The CFG pair goes on `data`; FSDP's compute splits over data and
#: sequence (its weights are gathered whole), so it gets a sequence axis; "sequence" is TP on half the devices
#: with the sequence split in two (Ulysses inside the mesh).
LAYOUTS = {
    "tp": ("tp", lambda n: f"data=2,tensor={n // 2}"),
    "tp_replicated_out": ("tp_replicated_out", lambda n: f"data=2,tensor={n // 2}"),
    "fsdp": ("fsdp", lambda n: f"data=2,sequence={n // 2}"),
    "sequence": ("tp", lambda n: f"sequence=2,tensor={n // 2}"),
}
SIZES = {"480p": ("480p_t2v", 480, 848, 121), "720p": ("720p_t2v", 720, 1280, 121)}
DEVICES = {"v5e:2x4": 8, "v5p:2x2x1": 4, "v6e:2x4": 8, "tpu7x:2x2x1": 8}
#: Beyond the grid (--extras): one v6e chip without a mesh, and a 16-chip, 4-host v6e slice.
EXTRAS = {"v6e-1/one chip/720p/uncached": ("v6e:1x1", "tp_replicated_out", "data=1", "720p"),
          "v6e-16/tp_replicated_out/720p/uncached": ("v6e:4x4", "tp_replicated_out", "data=2,tensor=8", "720p")}


def key(chip: str, layout: str, size: str, cache: bool) -> str:
    return f"{chip}/{layout}/{size}/{'deepcache' if cache else 'uncached'}"


def load() -> dict:
    if os.path.exists(RESULTS):
        with open(RESULTS) as f:
            return json.load(f)
    return {}


def save(results: dict) -> None:
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    tmp = RESULTS + ".tmp"
    with open(tmp, "w") as f:
        json.dump(results, f, indent=1, sort_keys=True)
    os.replace(tmp, RESULTS)


def run_one(chip: str, layout: str, size: str, cache: bool) -> dict:
    topology = CHIPS[chip]
    sharding, mesh = LAYOUTS[layout]
    return compile_child(topology, sharding, mesh(DEVICES[topology]), size, cache)


def compile_child(topology: str, sharding: str, mesh: str, size: str, cache: bool = False) -> dict:
    """One `python -m hyv_lib compile --json` child process: its report, or the error line it ended with."""
    preset, height, width, frames = SIZES[size]
    cmd = [sys.executable, "-m", "hyv_lib", "compile", "--preset", preset, "--topology", topology,
           "--mesh", mesh, "--sharding", sharding, "--height", str(height), "--width", str(width),
           "--video_length", str(frames), "--json"] + (["--enable_cache"] if cache else [])
    start = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=os.path.dirname(HERE))
    wall = time.perf_counter() - start
    if out.returncode != 0:
        return dict(error=(out.stderr.strip().splitlines() or ["?"])[-1], command=" ".join(cmd[1:]), wall_seconds=wall)
    report = json.loads(out.stdout)
    report.update(command="python " + " ".join(cmd[1:]), wall_seconds=round(wall, 1))
    return report


def table(results: dict) -> str:
    gib = 2**30
    lines = ["| slice | layout | mesh | size | cache | GiB per device (args + temps) | compiler's HBM limit | fits | "
             "all-reduce / all-gather / all-to-all GiB | compile s |", "|" + "---|" * 10]
    for k in sorted(results):
        r = results[k]
        chip, layout, size, cache = k.split("/")
        if "error" in r:
            lines.append(f"| {chip} | {layout} | | {size} | {cache} | error: {r['error'][:60]} | | | | |")
            continue
        b = r["per_device_bytes"]
        kinds = {c["kind"]: c["bytes"] / gib for c in r["collectives"]}
        mesh = ",".join(f"{a}={n}" for a, n in r["mesh"].items() if n > 1)
        detail = (f"{b['total'] / gib:.1f} ({b['arguments'] / gib:.1f} + {b['temporaries'] / gib:.1f})"
                  if b["arguments"] is not None else f"{b['total'] / gib:.1f} (compiler: out of HBM)")
        lines.append(
            f"| {chip} | {layout} | {mesh} | {size} | {cache} | {detail} | {r['hbm_available_per_device'] / gib:.2f} | "
            f"{'yes' if r['fits'] else 'NO'} | " + " / ".join(f"{kinds.get(k_, 0):.1f}" for k_ in
                                                              ("all-reduce", "all-gather", "all-to-all"))
            + f" | {r['compile_seconds']:.0f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chips", nargs="+", default=list(CHIPS), choices=list(CHIPS))
    parser.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--cache", nargs="+", default=["uncached", "deepcache"], choices=["uncached", "deepcache"])
    parser.add_argument("--redo", action="store_true", help="recompile configurations that are already saved")
    parser.add_argument("--table", action="store_true", help="only print the table of the saved results")
    parser.add_argument("--extras", action="store_true", help="compile only the configurations beyond the grid")
    args = parser.parse_args()
    results = load()
    if args.table:
        print(table(results))
        return
    if args.extras:
        for name, (topology, sharding, mesh, size) in EXTRAS.items():
            if args.redo or name not in results:
                results[name] = compile_child(topology, sharding, mesh, size)
                save(results)
                print(f"{name}: {results[name].get('error') or 'done'}", flush=True)
        print(table({k: results[k] for k in EXTRAS if k in results}))
        return
    todo = [(c, l, s, m == "deepcache") for s in args.sizes for c in args.chips for l in args.layouts
            for m in args.cache]
    todo = [t for t in todo if args.redo or key(*t) not in results]
    print(f"{len(todo)} configurations to compile", flush=True)
    for i, config in enumerate(todo, 1):
        report = run_one(*config)
        results[key(*config)] = report
        save(results)
        status = report.get("error") or (f"{report['per_device_bytes']['total'] / 2**30:.2f} GiB/device, "
                                          f"fits {report['fits']}, compiled in {report['compile_seconds']:.0f} s")
        print(f"[{i}/{len(todo)}] {key(*config)}: {status} (wall {report['wall_seconds']:.0f} s)", flush=True)
    print(table(results))


if __name__ == "__main__":
    main()
