"""What the compile benchmarks share: their saved results (JSON + markdown, merged and atomic) and one compile child."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Callable

#: The repository root, where the ``python -m hyv_lib compile`` children run.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load(stem: str) -> dict:
    """The results saved at ``stem``.json, or none yet."""
    if os.path.exists(stem + ".json"):
        with open(stem + ".json") as f:
            return json.load(f)
    return {"runs": {}}


def save(stem: str, results: dict, table: Callable[[dict], str]) -> None:
    """Write ``stem``.json and its markdown (``table(results)``), each atomically, merged with what another run of the
    same script (say on other ``--only`` configurations) saved meanwhile."""
    os.makedirs(os.path.dirname(stem), exist_ok=True)
    results["runs"] = {**load(stem)["runs"], **results["runs"]}
    for path, text in ((stem + ".json", json.dumps(results, indent=1, sort_keys=True)), (stem + ".md", table(results))):
        with open(path + ".tmp", "w") as f:
            f.write(text + "\n")
        os.replace(path + ".tmp", path)


def compile_child(args: list[str]) -> dict:
    """One ``python -m hyv_lib compile ... --json`` child (``args`` after ``compile``): its report with the command and
    wall time, or the error line it ended with."""
    cmd = ["-m", "hyv_lib", "compile", *args, "--json"]
    start = time.perf_counter()
    out = subprocess.run([sys.executable] + cmd, capture_output=True, text=True, cwd=ROOT,
                         env=dict(os.environ, JAX_PLATFORMS="cpu"))
    wall = round(time.perf_counter() - start, 1)
    command = "python " + " ".join(cmd)
    if out.returncode != 0:  # a child killed by a signal (the out-of-memory killer's 9) may print nothing
        last = out.stderr.strip().splitlines() or [f"killed by signal {-out.returncode}" if out.returncode < 0
                                                   else f"exit status {out.returncode}, no error line"]
        return dict(error=last[-1], returncode=out.returncode, command=command, wall_seconds=wall)
    return dict(json.loads(out.stdout), command=command, wall_seconds=wall)


def arguments(description: str, only_help: str) -> argparse.Namespace:
    """The compile benchmarks' command line: ``--table`` (only rewrite the markdown from the saved JSON) and
    ``--only`` (filters on the configuration names)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--table", action="store_true", help="only rewrite the markdown from the saved JSON")
    parser.add_argument("--only", default=None, help=only_help)
    return parser.parse_args()


def rewrite_table(stem: str, table: Callable[[dict], str]) -> None:
    """``--table``: the saved results written again with the current markdown table, which is printed."""
    results = load(stem)
    save(stem, results, table)
    print(table(results))


def run_configs(description: str, only_help: str, stem: str, configs: list[tuple], key: Callable[..., str],
                child: Callable[..., dict], table: Callable[[dict], str]) -> None:
    """A compile benchmark's command line: ``--table`` rewrites the markdown from the saved JSON; otherwise compile
    each of ``configs`` (``child(*config)``, saved under ``key(*config)``) that is not saved yet and matches
    ``--only``, saving after each, then print the table."""
    args = arguments(description, only_help)
    if args.table:
        rewrite_table(stem, table)
        return
    results = load(stem)
    filters = args.only.split(";") if args.only else None
    for config in configs:
        name = key(*config)
        if name in results["runs"] or (filters and not any(f in name for f in filters)):
            continue
        print(time.strftime("%H:%M:%S"), "compiling", name, flush=True)
        results["runs"][name] = child(*config)
        save(stem, results, table)
        r = results["runs"][name]
        print(time.strftime("%H:%M:%S"), " ", "error " + r["error"] if "error" in r else
              f"fits {r['fits']}, {r['per_device_bytes']['total'] / 2**30:.2f} GiB, {r['wall_seconds']} s", flush=True)
    save(stem, results, table)
    print(table(results))
