"""Nothing lost when things go wrong: killed runs, a full disk, a folder in use, an edited prompts file."""

import errno
import json
import os
import random
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hyv_lib.base.files import PARTIAL_FILE, atomic_path
from hyv_lib.base.lock import FolderInUseError, folder_lock
from hyv_lib.cli.commands import run
from hyv_lib.pipeline import stages
from hyv_lib.pipeline.batch import BatchRunner, run_lock, run_prompts_file
from hyv_lib.pipeline.stage_io import STAGE2_FILE, update_config

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import faults  # noqa: E402  (benchmarks/faults.py: the fault-injection harness)

SETTINGS = dict(video_length=5, num_inference_steps=2, quiet=True)
FLAGS = ["--preset", "tiny", "--video_length", "5", "--num_inference_steps", "2", "--quiet"]


def leftovers(folder):
    """Partial and lock files anywhere under ``folder``."""
    return [str(p) for p in Path(folder).rglob("*") if PARTIAL_FILE.match(p.name) or p.name.endswith(".lock")]


def listing(folder):
    return sorted((str(p.relative_to(folder)), p.stat().st_mtime_ns) for p in Path(folder).rglob("*"))


@pytest.mark.slow
def test_runs_killed_at_random_moments_resume_to_the_clean_runs_latents(tmp_path):
    """`python -m hyv_lib generate --prompts_file` SIGKILLed (process group, as a preempted VM) while it writes a file,
    rerun, killed again a random moment after it began generating, rerun to the end: every entry's latents equal a
    clean run's bit for bit; after each kill no folder claims completeness with other latents; no partial or lock
    file is left. A partial file and a lock file of a dead run planted in an entry folder are cleaned up too."""
    prompts = faults.write_prompts(str(tmp_path), 3)
    clean_dir = tmp_path / "clean"  # the clean run, in this process: same code path as the CLI's, same latents
    report = run_prompts_file(prompts, str(clean_dir), BatchRunner("tiny", stage2=SETTINGS), progress=False)
    assert [e["status"] for e in report.entries] == ["done"] * 3
    reference = faults.entries_of(str(clean_dir))
    out = str(tmp_path / "out")
    rng, kills = random.Random(31), 0
    for mid_write in (True, False):  # the first kill as soon as a file is being written, the second at random
        result = faults.run(prompts, out, kill_after=None if mid_write else rng.uniform(0, 2.0), mid_write=mid_write)
        kills += result["killed"]
        if not result["killed"]:
            break
        assert faults.wrong_complete(faults.entries_of(out), reference) == 0
    assert kills >= 1
    folder = Path(out) / "0001"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f".{STAGE2_FILE[:-12]}.0123456789ab.partial.safetensors").write_bytes(b"\0" * 100)  # a dead writer's
    (folder / ".hyv.lock").write_text(json.dumps(dict(pid=999999999, host="gone", started="then")))  # a dead run's
    final = faults.run(prompts, out)
    assert final["code"] == 0, final["stderr"]
    assert faults.lost(faults.entries_of(out), reference) == 0
    assert leftovers(out) == []


def test_a_full_disk_stops_the_run_naming_the_file_and_leaves_no_partial(tmp_path, monkeypatch, capsys):
    """ENOSPC while entry 1 writes its latents (a patched writer: half a file, then the error): the run stops with
    that OSError naming the latents file (the CLI: one `error:` line, exit code 3), entry 0 stays complete, no partial
    file is left, and a rerun with space skips entry 0 and makes the rest."""
    real = stages.save_tensors

    def full_disk(tensors, path, metadata=None):
        if path.endswith(os.path.join("0001", STAGE2_FILE)):
            with atomic_path(path) as tmp:
                Path(tmp).write_bytes(b"\0" * 64)
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(tensors, path, metadata)

    monkeypatch.setattr(stages, "save_tensors", full_disk)
    prompts = faults.write_prompts(str(tmp_path), 3)
    out = tmp_path / "out"
    runner = BatchRunner("tiny", stage2=SETTINGS)
    with pytest.raises(OSError) as caught:
        run_prompts_file(prompts, str(out), runner, progress=False)
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(out / "0001" / STAGE2_FILE)
    assert sorted(p.name for p in out.iterdir()) == ["0000", "0001"] and leftovers(out) == []
    assert not (out / "0001" / STAGE2_FILE).exists()
    code = run(["generate", "--prompts_file", prompts, "--output_dir", str(out), *FLAGS])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 3 and err == [f"error: {out / '0001' / STAGE2_FILE}: No space left on device"]
    assert leftovers(out) == []
    monkeypatch.setattr(stages, "save_tensors", real)
    again = run_prompts_file(prompts, str(out), runner, progress=False)
    assert [e["status"] for e in again.entries] == ["skipped", "done", "done"]


def test_a_second_run_on_a_folder_in_use_stops_at_once_naming_the_holder(tmp_path, capsys):
    """Another process holds the output folder (as a running `generate --prompts_file` does): a second run exits
    with code 2 and one `error:` line naming the folder and the holder's pid and host, before any model loads, and
    changes nothing there. Once the holder is gone (its lock dropped by the OS, its lock file left), a run goes on."""
    out = tmp_path / "out"
    (out / "0000").mkdir(parents=True)
    (out / "0000" / "keep.txt").write_text("x")
    prompts = faults.write_prompts(str(tmp_path), 1)
    code = (f"import sys; from hyv_lib.base.lock import folder_lock\nwith folder_lock({str(out)!r}, part='the whole "
            "prompts file'):\n print('held', flush=True); sys.stdin.read()")
    holder = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = listing(out)
        code = run(["generate", "--prompts_file", prompts, "--output_dir", str(out), *FLAGS])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and err[0].startswith(f"error: --output_dir: {str(out)!r} is in use")
        assert f"pid {holder.pid} on host " in err[0] and "the whole prompts file" in err[0]
        assert listing(out) == before
    finally:
        holder.kill()  # SIGKILL: no `finally` in the holder, its lock file stays
        holder.wait()
    assert (out / ".hyv.lock").exists()
    with folder_lock(str(out)):  # the OS dropped the dead holder's lock
        pass
    assert not (out / ".hyv.lock").exists()


def test_shards_share_a_folder_but_a_shard_or_the_whole_file_runs_once(tmp_path):
    """Shard 0/2 and 1/2 hold one folder together; a second shard 0/2, or a run of the whole file, stops with a
    FolderInUseError naming the holder (threads of one process are separate runs: the lock is flock's, per open
    file). Nothing is left behind when they end."""
    out = str(tmp_path / "out")
    held, release = threading.Event(), threading.Event()

    def shard_zero():
        with run_lock(out, (0, 2)):
            held.set()
            release.wait(30)

    thread = threading.Thread(target=shard_zero)
    thread.start()
    try:
        assert held.wait(30)
        with run_lock(out, (1, 2)):  # the other shard is not blocked
            pass
        with pytest.raises(FolderInUseError, match=r"shard 0/2") as same_shard:
            with run_lock(out, (0, 2)):
                pass
        assert same_shard.value.argument == "shard" and same_shard.value.holders[0]["pid"] == os.getpid()
        with pytest.raises(FolderInUseError, match=r"in use by another run \(pid \d+ on host .*shard 0/2") as whole:
            with run_lock(out, None):
                pass
        assert whole.value.argument == "output_dir"
    finally:
        release.set()
        thread.join()
    with run_lock(out, None):
        pass
    assert os.listdir(out) == []


def test_concurrent_config_updates_are_all_kept(tmp_path):
    """update_config's read-modify-write holds the config's lock: 4 threads each adding 25 fields to one
    generation_config.json lose none of them (without the lock, updates raced and overwrote each other)."""
    update_config(str(tmp_path), base={})

    def add(name):
        for i in range(25):
            update_config(str(tmp_path), **{f"{name}{i}": i})

    threads = [threading.Thread(target=add, args=(f"t{n}_",)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    config = json.loads((tmp_path / "generation_config.json").read_text())
    assert len(config) == 100 and leftovers(tmp_path) == []


def test_an_edited_prompts_file_redoes_exactly_the_changed_entries(tmp_path):
    """Line 2 edited: entry 1 alone is redone (its latents those of a separate generate with its prompt and seed),
    entry 0 is skipped; the bad line 3, fixed, fills its own number 2 without moving the others. A line inserted
    before the last renumbers the entries from there on: their folders hold other prompts and seeds, so they are
    redone, while the entries before it are skipped."""
    prompts = tmp_path / "p.txt"
    prompts.write_text("a red ball\na blue cube\n{broken\n")
    out = tmp_path / "out"
    runner = BatchRunner("tiny", stage2=SETTINGS)
    first = run_prompts_file(str(prompts), str(out), runner, seed=5, progress=False)
    assert [(e["index"], e["status"]) for e in first.entries] == [(0, "done"), (1, "done")]
    assert [(b["line"], b["number"]) for b in first.bad_lines] == [(3, 2)]
    entry0 = load_file(out / "0000" / STAGE2_FILE)["latents"]
    prompts.write_text('a red ball\na blue cube in the rain\n{"prompt": "a fixed line"}\n')
    second = run_prompts_file(str(prompts), str(out), runner, seed=5, progress=False)
    assert [(e["index"], e["status"], e.get("replaced")) for e in second.entries] == [
        (0, "skipped", None), (1, "done", True), (2, "done", False)]
    assert torch.equal(load_file(out / "0000" / STAGE2_FILE)["latents"], entry0)
    stages.generate(preset="tiny", prompt="a blue cube in the rain", output_dir=str(tmp_path / "single"), seed=6,
                    **SETTINGS)
    assert torch.equal(load_file(out / "0001" / STAGE2_FILE)["latents"],
                       load_file(tmp_path / "single" / STAGE2_FILE)["latents"])
    prompts.write_text('a red ball\na blue cube in the rain\nan inserted line\n{"prompt": "a fixed line"}\n')
    third = run_prompts_file(str(prompts), str(out), runner, seed=5, progress=False)
    assert [(e["index"], e["status"], e.get("replaced")) for e in third.entries] == [
        (0, "skipped", None), (1, "skipped", None), (2, "done", True), (3, "done", False)]
    config = json.loads((out / "0003" / "generation_config.json").read_text())
    assert (config["prompt"], config["seed"], config["batch_entry"]["line"]) == ("a fixed line", 8, 4)


def test_a_single_stage_run_holds_its_folder_and_clears_partials(tiny_run, tmp_path, capsys):
    """stage1/2/3 and generate (not only prompts files) hold the folder's run lock: a second run on a folder in use
    is one error line (exit 2) and changes nothing; the next run removes the partial files a killed writer left."""
    import os
    import shutil
    import subprocess
    import sys

    from hyv_lib.cli.commands import run as cli

    folder = tmp_path / "run"
    shutil.copytree(tiny_run, folder)
    partial = folder / ".stage2_latents.0123456789ab.partial.safetensors"
    partial.write_bytes(b"cut short")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom hyv_lib.base.lock import folder_lock\n"
         f"with folder_lock({str(folder)!r}):\n    print('held', flush=True)\n    time.sleep(60)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
        assert cli(["stage3", "--input_dir", str(folder)]) == 2
        assert f"is in use by another run (pid {holder.pid}" in capsys.readouterr().err
        assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == before
    finally:
        holder.kill()
        holder.wait()
    assert cli(["stage3", "--input_dir", str(folder)]) == 0
    assert not partial.exists() and not any(n.endswith(".lock") for n in os.listdir(folder))
