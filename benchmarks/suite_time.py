"""Time the test suite of an older commit and of the working tree, one after the other on this machine, and print
per-file seconds and the ratio. Not a unit test:

    .venv/bin/python benchmarks/suite_time.py --base a61c01a^      # e.g. the commit before issue 20's first change

Each suite runs the way its commit's `make test` ran it: the base in one process (the default, ``--base-workers 0``),
the working tree with ``--workers`` pytest-xdist workers (default 2, as the Makefile; ``--dist loadfile``). With
workers, a file's seconds are its tests' time on a worker that shared the CPU with the other one, so the per-file
columns compare cost, and the wall time compares what a developer waits.

The base commit is checked out into a temporary git worktree and run with this checkout's .venv (PYTHONPATH points
at the worktree, so its hyv_lib is the one imported). Each run gets a fresh, empty JAX compile cache, so neither
starts warm. Files present in only one of the two suites are listed apart: the like-for-like ratio is over the files
both have (a file's tests may have changed in between; the counts are printed next to the times).
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_suite(tree: str, junit: str, cache: str, workers: int = 0) -> float:
    """pytest over ``tree``/tests with this .venv; returns the wall seconds (any exit code but 'no tests' is fine:
    a failing test still took its time, and the report says how many failed)."""
    env = dict(os.environ, PYTHONPATH=tree, HYV_COMPILE_CACHE_DIR=cache, JAX_PLATFORMS="cpu")
    start = time.perf_counter()
    code = subprocess.call([sys.executable, "-m", "pytest", "tests", "-q", "-p", "no:cacheprovider",
                            f"--junitxml={junit}", *(["-n", str(workers), "--dist", "loadfile"] if workers else [])],
                           cwd=tree, env=env, stdout=subprocess.DEVNULL)
    if code == 5:
        raise SystemExit(f"pytest collected no tests in {tree}")
    return time.perf_counter() - start


def per_file(junit: str) -> dict[str, dict[str, float]]:
    """test file -> {seconds, tests, failed} from a junit XML report."""
    files: dict[str, dict[str, float]] = collections.defaultdict(lambda: {"seconds": 0.0, "tests": 0, "failed": 0})
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = case.get("classname", "").split(".")
        key = (name[1] if name and name[0] == "tests" and len(name) > 1 else name[0]) + ".py"
        entry = files[key]
        entry["seconds"] += float(case.get("time", 0))
        entry["tests"] += 1
        entry["failed"] += any(child.tag in ("failure", "error") for child in case)
    return dict(files)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", required=True, help="a commit (e.g. a61c01a^)")
    parser.add_argument("--workers", type=int, default=2, help="pytest-xdist workers for the working tree (0: none)")
    parser.add_argument("--base-workers", type=int, default=0, help="pytest-xdist workers for the base (0: none)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="suite-time-") as tmp:
        base_tree = os.path.join(tmp, "base")
        subprocess.check_call(["git", "worktree", "add", "--detach", "-q", base_tree, args.base], cwd=ROOT)
        try:
            walls, files = {}, {}
            for label, tree, workers in (("base", base_tree, args.base_workers), ("now", ROOT, args.workers)):
                junit = os.path.join(tmp, f"{label}.xml")
                walls[label] = run_suite(tree, junit, os.path.join(tmp, f"cache-{label}"), workers)
                files[label] = per_file(junit)
                print(f"{label}: {walls[label]:.0f} s wall ({workers or 'no'} workers)", flush=True)
        finally:
            subprocess.call(["git", "worktree", "remove", "--force", base_tree], cwd=ROOT)
    both = sorted(set(files["base"]) & set(files["now"]))
    print(f"\n| file | base s (tests) | now s (tests) |\n|---|---|---|")
    for name in sorted(set(files["base"]) | set(files["now"])):
        cells = [f"{files[k][name]['seconds']:.0f} ({files[k][name]['tests']})" if name in files[k] else "-"
                 for k in ("base", "now")]
        print(f"| {name} | {cells[0]} | {cells[1]} |")
    common = {k: sum(files[k][n]["seconds"] for n in both) for k in ("base", "now")}
    failed = {k: sum(f["failed"] for f in files[k].values()) for k in ("base", "now")}
    tests = {k: sum(f["tests"] for f in files[k].values()) for k in ("base", "now")}
    print(f"\nwhole suite: base {walls['base']:.0f} s ({tests['base']} tests, {failed['base']} failed), now "
          f"{walls['now']:.0f} s ({tests['now']} tests, {failed['now']} failed): now/base = "
          f"{walls['now'] / walls['base']:.2f}")
    print(f"files in both ({len(both)}): base {common['base']:.0f} s, now {common['now']:.0f} s: now/base = "
          f"{common['now'] / common['base']:.2f}")


if __name__ == "__main__":
    main()
