"""Shared fixtures: a tiny end-to-end run and a saved tiny pipeline folder per session, and the probe runner."""

import copy
import json
import os
import subprocess
import sys

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def run_probe():
    """``run_probe(*args, timeout=600)``: run ``python *args`` in its own process without this one's XLA_FLAGS (a probe
    that needs 8 emulated CPU devices sets them before JAX starts) and return the JSON of its last stdout line; a
    failing probe fails the test with the end of its stderr."""

    def run(*args: str, timeout: float = 600):
        env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
        out = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, env=env)
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    return run


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """A full tiny generation (stage 1-3) into a session folder; returns the folder."""
    from hyv_lib.pipeline.stages import generate

    out = tmp_path_factory.mktemp("tiny_run")
    generate(preset="tiny", prompt='a red ball and the word "HI"', output_dir=str(out), quiet=True,
             save_frames=True)
    return out


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory):
    """The tiny pipeline saved as a diffusers-format folder (model_index.json + subfolders)."""
    from hyv_lib.models.components import save_tiny_pipeline

    path = tmp_path_factory.mktemp("tiny_model") / "hyv-tiny"
    save_tiny_pipeline(str(path))
    return path


@pytest.fixture(scope="session")
def compile_once():
    """``hyv_lib.planning.tpu_compile.compile_step`` remembered for the session: one libtpu compile takes 10-15 s here, and
    the planner test and the TPU compile tests check some of the same programs. Each caller gets its own copy."""
    from hyv_lib.planning.tpu_compile import compile_step

    reports = {}

    def compiled(preset, topology, **kwargs):
        key = json.dumps([repr(preset), topology, kwargs], sort_keys=True, default=str)
        if key not in reports:
            reports[key] = compile_step(preset, topology, **kwargs)
        return copy.deepcopy(reports[key])
    return compiled
