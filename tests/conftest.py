"""Shared fixtures: one tiny end-to-end run and one saved tiny pipeline folder per test session."""

import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """A full tiny generation (stage 1-3) into a session folder; returns the folder."""
    from hyv_lib import pipeline

    out = tmp_path_factory.mktemp("tiny_run")
    pipeline.generate(preset="tiny", prompt='a red ball and the word "HI"', output_dir=str(out), quiet=True,
                      save_frames=True)
    return out


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory):
    """The tiny pipeline saved as a diffusers-format folder (model_index.json + subfolders)."""
    from hyv_lib.models import save_tiny_pipeline

    path = tmp_path_factory.mktemp("tiny_model") / "hyv-tiny"
    save_tiny_pipeline(str(path))
    return path


# `make test` runs two workers (pytest-xdist, `--dist loadfile`: a file runs whole on one worker, so its module
# fixtures are built once). Starting the longest files first keeps both workers busy to the end (longest processing
# time first); the rest keep their order. Seconds of each file alone on a 2-core machine, from
# benchmarks/suite_time.py: refresh this list when a file's time changes much.
LONGEST_FILES = ("test_notebooks_real_layout.py",  # ~250 s
                 "test_tpu_compile.py",  # ~180 s
                 "test_perf.py",  # ~150 s
                 "test_sharding.py",  # ~75 s
                 "test_multihost.py",  # ~70 s
                 "test_cli.py")  # ~65 s


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: other files keep their order
