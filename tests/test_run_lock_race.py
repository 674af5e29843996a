"""One run per output folder, whatever the timing: a folder that does not exist yet is created and locked before any
work, generate holds it across its three stages, and the refused run names the flag the user gave."""

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from hyv_lib.base.errors import HyvInputError
from hyv_lib.base.lock import LOCK_FILE, folder_lock, is_held
from hyv_lib.cli.commands import run
from hyv_lib.pipeline import stages

RACE = ["--preset", "tiny_trained", "--num_inference_steps", "2"]
RUNS = {"red": ("a red circle moving left on a gray background", 1),
        "blue": ("a blue square moving up on a gray background", 2)}
# The second run imports everything first, then waits for the word to go: it reaches the lock milliseconds after
# it is told, while the first run is surely still inside generate. Then it runs `python -m hyv_lib`'s own entry.
WAITING_RUN = ("import sys\nfrom hyv_lib.cli.commands import main\nprint('ready', flush=True)\nsys.stdin.readline()\n"
               "sys.argv = ['hyv_lib', *sys.argv[1:]]\nmain()\n")


def _argv(out, name):
    prompt, seed = RUNS[name]
    return ["generate", *RACE, "--output_dir", out, "--prompt", prompt, "--seed", str(seed)]


def test_two_generate_processes_racing_into_a_new_folder_one_runs_one_is_refused(tmp_path):
    """The issue's race: a second `generate` starts while the first is inside its stage 1 of a folder that did not
    exist. Exactly one exits 0; the other exits 2 with one `error: --output_dir: ... in use by another run (pid ...)`
    line (never --input_dir, a flag it was not given) and runs no stage; the folder holds the winner's video and
    config. (Before, both could exit 0, or the first was refused after its stage 1 naming --input_dir.)"""
    out = str(tmp_path / "out_race")
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "TOKENIZERS_PARALLELISM": "false"}
    second = subprocess.Popen([sys.executable, "-c", WAITING_RUN, *_argv(out, "blue")], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    first = None
    try:
        assert second.stdout.readline().strip() == "ready"
        first = subprocess.Popen([sys.executable, "-m", "hyv_lib", *_argv(out, "red")], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, env=env)
        deadline = time.monotonic() + 120
        while not os.path.isdir(out):  # the first run has begun generate: the folder is made (and locked) first
            assert first.poll() is None and time.monotonic() < deadline, first.stderr.read()[-3000:]
            time.sleep(0.005)
        second.stdin.write("go\n")
        second.stdin.flush()
        results = {}
        for name, proc in (("red", first), ("blue", second)):
            _, err = proc.communicate(timeout=300)
            results[name] = (proc.returncode, err, proc.pid)
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    codes = sorted(code for code, _, _ in results.values())
    assert codes == [0, 2], {k: (c, e[-2000:]) for k, (c, e, _) in results.items()}
    winner = next(k for k, (c, _, _) in results.items() if c == 0)
    loser = next(k for k in results if k != winner)
    _, err, _ = results[loser]
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: --output_dir: {out!r} is in use by another run"), err
    assert f"(pid {results[winner][2]} on host " in errors[0]
    assert "stage 1:" not in err and "generate: done" not in err  # refused before any stage ran
    config = json.loads((tmp_path / "out_race" / "generation_config.json").read_text())
    assert (config["prompt"], config["seed"]) == RUNS[winner]
    assert (tmp_path / "out_race" / "output_video.mp4").stat().st_size > 0
    assert not (tmp_path / "out_race" / LOCK_FILE).exists()  # the winner let go at the end


def _hold(folder, held, release):
    with folder_lock(folder):
        held.set()
        release.wait(60)


def test_a_generate_whose_folder_another_run_holds_is_refused_before_stage1(tmp_path, capsys, monkeypatch):
    """Another run (here another thread: a separate run, as flock's locks are per open file) holds the folder:
    generate stops before stage 1, with one error line naming --output_dir and the holder's pid, and writes
    nothing. From Python the error names the parameter."""
    out = tmp_path / "out"
    called = []
    monkeypatch.setattr(stages, "stage1", lambda **kw: called.append(kw))
    held, release = threading.Event(), threading.Event()
    holder = threading.Thread(target=_hold, args=(str(out), held, release))
    holder.start()
    try:
        assert held.wait(30)
        before = sorted(os.listdir(out))
        code = run(["generate", "--preset", "tiny", "--output_dir", str(out), "--prompt", "x"])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1, err
        assert err[0].startswith(f"error: --output_dir: {str(out)!r} is in use by another run (pid {os.getpid()} ")
        with pytest.raises(HyvInputError) as caught:
            stages.generate(preset="tiny", prompt="x", output_dir=str(out), quiet=True)
        assert caught.value.argument == "output_dir"
        assert called == [] and sorted(os.listdir(out)) == before == [LOCK_FILE]
    finally:
        release.set()
        holder.join()
    assert os.listdir(out) == []


def _lock_seen(out, seen):
    """A stand-in for stage 1's encoders that records whether the folder's run lock is held while it works."""
    def encode(*args, **kwargs):
        seen.append(is_held(os.path.join(out, LOCK_FILE)))
        raise RuntimeError("stop here")
    return encode


def test_a_stage_run_alone_locks_a_folder_it_creates_and_torchrun_ranks_above_0_do_not(tmp_path, monkeypatch):
    """stage1 into a folder that did not exist holds its lock while it works (it used to create the folder
    unlocked); one that refuses its input leaves no folder it made. Under torchrun only rank 0 locks."""
    seen = []
    out = str(tmp_path / "new")
    monkeypatch.setattr(stages, "encode_pair", _lock_seen(out, seen))
    with pytest.raises(RuntimeError, match="stop here"):
        stages.stage1(preset="tiny", prompt="x", output_dir=out)
    assert seen == [True]  # locked while working
    with pytest.raises(HyvInputError, match="dtype"):  # bad input: refused, and the folder it made is gone
        stages.stage1(preset="tiny", prompt="x", output_dir=str(tmp_path / "other"), dtype="fp7")
    assert not (tmp_path / "other").exists()
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(RuntimeError, match="stop here"):
        stages.stage1(preset="tiny", prompt="x", output_dir=out)
    assert seen == [True, False]


def test_generate_nests_its_stages_inside_a_lock_this_thread_holds(tmp_path, monkeypatch):
    """A caller holding the folder's lock (a prompts file's run) calls generate: its stages nest, nobody is refused."""
    out = str(tmp_path / "out")
    calls = []
    for name in ("stage1", "_denoise_into", "stage3"):  # stage 2's work, with the settings generate resolved
        monkeypatch.setattr(stages, name, lambda *args, _name=name, **kw: calls.append(_name))
    monkeypatch.setattr(stages, "_read_stage1", lambda *args: calls.append("read stage 1") or ({}, {}, None))
    with folder_lock(out):
        stages.generate(preset="tiny", prompt="x", output_dir=out, quiet=True)
        assert is_held(os.path.join(out, LOCK_FILE))
    assert calls == ["stage1", "read stage 1", "_denoise_into", "stage3"]
    assert not os.path.exists(os.path.join(out, LOCK_FILE))


def test_prompts_file_run_refused_by_a_holder_leaves_the_folder_it_made(tmp_path, capsys):
    """generate --prompts_file into a folder another run just made and holds: refused with one --output_dir line,
    and the folder (with the holder's lock) is left as it is."""
    out = tmp_path / "out"
    prompts = tmp_path / "p.txt"
    prompts.write_text("a red ball\n")
    held, release = threading.Event(), threading.Event()
    holder = threading.Thread(target=_hold, args=(str(out), held, release))
    holder.start()
    try:
        assert held.wait(30)
        code = run(["generate", "--preset", "tiny", "--prompts_file", str(prompts), "--output_dir", str(out)])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and err[0].startswith("error: --output_dir: "), err
        assert os.listdir(out) == [LOCK_FILE] and is_held(str(out / LOCK_FILE))
    finally:
        release.set()
        holder.join()
