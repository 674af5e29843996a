"""Time the test suite of an older commit and of the working tree, one after the other on this machine, and print
per-file seconds and the ratio. Not a unit test:

    .venv/bin/python benchmarks/suite_time.py --base a61c01a^      # e.g. the commit before issue 20's first change

The base commit is checked out into a temporary git worktree and run with this checkout's .venv (PYTHONPATH points
at the worktree, so its hyv_lib is the one imported). Each run gets a fresh, empty JAX compile cache, so neither
starts warm. Files present in only one of the two suites are listed apart. Two like-for-like ratios: over the files
both have (a file may have gained or lost tests in between; the counts are printed next to the times), and over the
test ids both have (the same test by name: its check may have been strengthened since, never dropped silently).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_suite(tree: str, junit: str, cache: str) -> float:
    """pytest over ``tree``/tests with this .venv; returns the wall seconds (any exit code but 'no tests' is fine:
    a failing test still took its time, and the report says how many failed)."""
    env = dict(os.environ, PYTHONPATH=tree, HYV_COMPILE_CACHE_DIR=cache, JAX_PLATFORMS="cpu")
    start = time.perf_counter()
    code = subprocess.call([sys.executable, "-m", "pytest", "tests", "-q", "-p", "no:cacheprovider",
                            f"--junitxml={junit}"], cwd=tree, env=env, stdout=subprocess.DEVNULL)
    if code == 5:
        raise SystemExit(f"pytest collected no tests in {tree}")
    return time.perf_counter() - start


def per_test(junit: str) -> dict[str, float]:
    """test id (classname::name) -> seconds, from a junit XML report."""
    return {f"{case.get('classname')}::{case.get('name')}": float(case.get("time", 0))
            for case in ET.parse(junit).getroot().iter("testcase")}


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
    parser.add_argument("--save", default=None, help="also write the per-test seconds of both runs here (JSON)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="suite-time-") as tmp:
        base_tree = os.path.join(tmp, "base")
        subprocess.check_call(["git", "worktree", "add", "--detach", "-q", base_tree, args.base], cwd=ROOT)
        try:
            walls, files, tests_by_id = {}, {}, {}
            for label, tree in (("base", base_tree), ("now", ROOT)):
                junit = os.path.join(tmp, f"{label}.xml")
                walls[label] = run_suite(tree, junit, os.path.join(tmp, f"cache-{label}"))
                files[label] = per_file(junit)
                tests_by_id[label] = per_test(junit)
                print(f"{label}: {walls[label]:.0f} s wall", flush=True)
        finally:
            subprocess.call(["git", "worktree", "remove", "--force", base_tree], cwd=ROOT)
    if args.save:
        with open(args.save, "w") as f:
            json.dump(dict(base=args.base, walls=walls, tests=tests_by_id), f, indent=1)
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
    same = set(tests_by_id["base"]) & set(tests_by_id["now"])
    same_s = {k: sum(tests_by_id[k][t] for t in same) for k in ("base", "now")}
    print(f"tests in both, by id ({len(same)} of the base's {len(tests_by_id['base'])}): base {same_s['base']:.0f} s, "
          f"now {same_s['now']:.0f} s: now/base = {same_s['now'] / same_s['base']:.2f}")


if __name__ == "__main__":
    main()
