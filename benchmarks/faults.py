"""Fault injection: SIGKILL `python -m hyv_lib generate --prompts_file` at random moments, rerun it, count what is lost.

    .venv/bin/python benchmarks/faults.py [--trials 20] [--entries 4] [--max_kills 2] [--mid_write 0.5] [--seed 0]
                                          [--json out.json]

One clean run of a prompts file (tiny preset, 5 frames, 2 steps) gives the reference latents and its timing. Each
trial then starts from an empty folder: it runs the same command and kills its process group (SIGKILL, as a
preempted VM does: no handler or ``finally`` runs) 1 to ``--max_kills`` times, each time rerunning; then it reruns to
completion. A kill lands a random moment after the run began generating (within the clean run's generating time),
or, for a ``--mid_write`` fraction of them, while a file is being written (as soon as a partial file shows up).
After every kill, each folder that says it is complete for its entry's inputs must hold the clean run's latents bit
for bit (``wrong complete``); after the last run every entry must (``entries lost``), and no partial file
(``.NAME.<hex>.partial.EXT``) or lock file may be left. ``partial files after kills`` counts the partial files the
kills left for the reruns to clean up: evidence that kills landed mid-write. tests/test_faults.py runs a few trials
of the same harness.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import torch
from safetensors.torch import load_file

from hyv_lib.base.files import PARTIAL_FILE
from hyv_lib.base.lock import read_holder
from hyv_lib.pipeline.batch import RECORD_KEY
from hyv_lib.pipeline.stage_io import CONFIG_FILE, STAGE2_FILE, VIDEO_FILE

PROMPTS = ["a red circle moving left on a gray background", "a blue square moving up on a gray background",
           '{"prompt": "a green triangle moving right", "seed": 7}', "a yellow circle moving down",
           '{"prompt": "a red square moving left", "negative_prompt": "blur"}', "a blue circle moving right"]
SETTINGS = ["--preset", "tiny", "--video_length", "5", "--num_inference_steps", "2", "--quiet"]


def write_prompts(folder: str, entries: int) -> str:
    """A prompts file of ``entries`` lines (plain and JSON) in ``folder``."""
    path = os.path.join(folder, "prompts.txt")
    with open(path, "w") as f:
        f.write("\n".join(PROMPTS[i % len(PROMPTS)] + ("" if i < len(PROMPTS) else f" {i}") for i in range(entries)))
        f.write("\n")
    return path


def command(prompts: str, out: str) -> list[str]:
    """The command a user runs (in its own process, on this Python)."""
    return [sys.executable, "-m", "hyv_lib", "generate", "--prompts_file", prompts, "--output_dir", out, *SETTINGS]


def _env() -> dict[str, str]:
    return {**os.environ, "JAX_PLATFORMS": "cpu", "TOKENIZERS_PARALLELISM": "false"}


def generating(out: str, pid: int) -> bool:
    """Whether process ``pid`` holds an entry folder of ``out`` (its lock file names it): it is generating."""
    try:
        names = os.listdir(out)
    except FileNotFoundError:
        return False
    return any(read_holder(os.path.join(out, n, ".hyv.lock")).get("pid") == pid for n in names if n.isdigit())


def partial_files(out: str) -> set[str]:
    """The partial files (writes in progress, or left by a killed writer) in the entry folders of ``out``."""
    found = set()
    for name in os.listdir(out) if os.path.isdir(out) else []:
        folder = os.path.join(out, name)
        if name.isdigit() and os.path.isdir(folder):
            found |= {os.path.join(folder, n) for n in os.listdir(folder) if PARTIAL_FILE.match(n)}
    return found


def run(prompts: str, out: str, kill_after: float | None = None, mid_write: bool = False) -> dict:
    """Run the command; with ``kill_after``, SIGKILL its process group that many seconds after it began generating,
    or with ``mid_write`` as soon as a partial file appears once it began (unless it finished first). Returns whether
    it was killed, its exit code, and the seconds to the first entry and to the end."""
    start = time.perf_counter()
    proc = subprocess.Popen(command(prompts, out), env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)  # its own process group: ffmpeg children die with it
    began, stale = None, partial_files(out)  # a killed run's leftovers are not writes of this one
    while proc.poll() is None:
        if began is None and generating(out, proc.pid):
            began = time.perf_counter()
        if began is not None and ((kill_after is not None and time.perf_counter() - began >= kill_after)
                                  or (mid_write and partial_files(out) - stale)):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            proc.stderr.close()
            return dict(killed=True, code=proc.returncode, began_s=began - start, total_s=time.perf_counter() - start)
        time.sleep(0.005)
    stderr = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    return dict(killed=False, code=proc.returncode, began_s=None if began is None else began - start,
                total_s=time.perf_counter() - start, stderr=stderr)


def left_files(out: str) -> tuple[list[str], list[str]]:
    """Partial files and lock files anywhere under ``out``."""
    partial, locks = [], []
    for root, _, names in os.walk(out):
        partial += [os.path.join(root, n) for n in names if PARTIAL_FILE.match(n)]
        locks += [os.path.join(root, n) for n in names if n.endswith(".lock")]
    return partial, locks


def entries_of(out: str) -> dict[str, dict]:
    """Per entry folder: its record's inputs digest (None unless complete) and latents (None if absent)."""
    found = {}
    for name in sorted(n for n in os.listdir(out) if n.isdigit()) if os.path.isdir(out) else []:
        folder = os.path.join(out, name)
        try:
            with open(os.path.join(folder, CONFIG_FILE)) as f:
                config = json.load(f)
        except (OSError, ValueError):
            config = {}
        complete = "stage3_time_s" in config and os.path.isfile(os.path.join(folder, VIDEO_FILE))
        digest = (config.get(RECORD_KEY) or {}).get("inputs_sha256") if complete else None
        latents_path = os.path.join(folder, STAGE2_FILE)
        latents = load_file(latents_path)["latents"] if os.path.isfile(latents_path) else None
        found[name] = dict(digest=digest, latents=latents)
    return found


def wrong_complete(found: dict[str, dict], reference: dict[str, dict]) -> int:
    """Folders that say they are complete for their reference entry's inputs but hold other latents."""
    return sum(1 for name, entry in found.items() if entry["digest"] is not None
               and entry["digest"] == reference[name]["digest"]
               and (entry["latents"] is None or not torch.equal(entry["latents"], reference[name]["latents"])))


def lost(found: dict[str, dict], reference: dict[str, dict]) -> int:
    """Reference entries missing, incomplete or with other latents."""
    return sum(1 for name, ref in reference.items() if name not in found or found[name]["digest"] != ref["digest"]
               or found[name]["latents"] is None or not torch.equal(found[name]["latents"], ref["latents"]))


def clean_reference(work: str, entries: int) -> dict:
    """The clean run: its folder's entries and its timing (seconds to the first entry, in all)."""
    prompts = write_prompts(work, entries)
    out = os.path.join(work, "clean")
    result = run(prompts, out)
    if result["code"] != 0:
        raise RuntimeError(f"the clean run failed ({result['code']}): {result['stderr']}")
    reference = entries_of(out)
    assert len(reference) == entries and all(e["digest"] for e in reference.values())
    return dict(prompts=prompts, reference=reference, began_s=result["began_s"], total_s=result["total_s"])


def trial(clean: dict, out: str, rng: random.Random, kills: int, mid_write: float = 0.0) -> dict:
    """One trial into the empty folder ``out``: up to ``kills`` killed runs, each checked, then a run to the end;
    each kill lands mid-write with probability ``mid_write``."""
    window = clean["total_s"] - clean["began_s"]  # how long the clean run generated
    row = dict(kills=0, wrong_complete=0, partial_after_kills=0, runs=0)
    for _ in range(kills):
        if rng.random() < mid_write:
            result = run(clean["prompts"], out, mid_write=True)
        else:
            result = run(clean["prompts"], out, kill_after=rng.uniform(0, window))
        row["runs"] += 1
        if not result["killed"]:  # it finished first: nothing left to kill
            break
        row["kills"] += 1
        row["wrong_complete"] += wrong_complete(entries_of(out), clean["reference"])
        row["partial_after_kills"] += len(left_files(out)[0])
    final = run(clean["prompts"], out)
    row["runs"] += 1
    row["final_code"] = final["code"]
    partial, locks = left_files(out)
    row.update(entries_lost=lost(entries_of(out), clean["reference"]), partial_left=len(partial),
               locks_left=len(locks))
    return row


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--entries", type=int, default=4, help="prompts in the file (default 4)")
    parser.add_argument("--max_kills", type=int, default=2, help="kills per trial, 1 to this (default 2)")
    parser.add_argument("--mid_write", type=float, default=0.5,
                        help="fraction of the kills made while a file is written (default 0.5)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the kill moments (default 0)")
    parser.add_argument("--json", default=None, help="also write the rows and totals to this file")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    work = tempfile.mkdtemp(prefix="hyv-faults-")
    try:
        clean = clean_reference(work, args.entries)
        print(f"clean run: {args.entries} entries, generating from {clean['began_s']:.1f} s to "
              f"{clean['total_s']:.1f} s", file=sys.stderr)
        rows = []
        for number in range(args.trials):
            rows.append(trial(clean, os.path.join(work, f"trial{number:03d}"), rng, rng.randint(1, args.max_kills),
                              args.mid_write))
            print(f"trial {number}: {rows[-1]}", file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    totals = {key: sum(r[key] for r in rows) for key in
              ("runs", "kills", "wrong_complete", "partial_after_kills", "entries_lost", "partial_left", "locks_left")}
    totals.update(trials=len(rows), failed_final_runs=sum(r["final_code"] != 0 for r in rows),
                  entries=args.entries, clean_run_s=round(clean["total_s"], 1))
    print("| trials | runs | kills | partial files after kills | wrong complete | entries lost | partial files left "
          "| lock files left | final runs failed |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    print(f"| {totals['trials']} | {totals['runs']} | {totals['kills']} | {totals['partial_after_kills']} | "
          f"{totals['wrong_complete']} | {totals['entries_lost']} | {totals['partial_left']} | {totals['locks_left']} "
          f"| {totals['failed_final_runs']} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(totals=totals, rows=rows), f, indent=2)
    return totals


if __name__ == "__main__":
    main()
