"""SSTA's quality frontier on the trained tiny models: the measurement on hyv-tiny (dense against itself, a whole-grid
window against dense, a sparse setting), the record's self-check, and the shipped benchmark record."""

from __future__ import annotations

import copy
import json
import math
import os

import pytest

from hyv_lib import SstaConfig
from hyv_lib.base.errors import HyvInputError
from hyv_lib.tiny.quality import psnr
from hyv_lib.tiny.sparse_frontier import (
    DENSE,
    FORMAT,
    check_record,
    frontier_rows,
    held_out_combos,
    markdown_table,
    measure_sparse_frontier,
    random_qk_density,
    window_density,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results", "ssta_frontier_2026-11-27_cpu.json")
STEPS = 2
#: One-token tiles on hyv-tiny's 3 x 4 x 7 grid: no video padding and the text tiles end where the valid text does,
#: so a window over the whole grid is dense attention exactly (any bigger tile adds zero or padded text keys).
WHOLE = SstaConfig(tile=(1, 1, 1), window=(3, 5, 9), sparse_type="sta")
SPARSE = SstaConfig(tile=(1, 1, 1), window=(1, 3, 3), topk=8)


@pytest.fixture(scope="module")
def pipe():
    import hyv_lib

    return hyv_lib.load_pipeline("tiny_trained", progress=False)


@pytest.fixture(scope="module")
def measured(pipe):
    frames = {}
    record = measure_sparse_frontier(pipe, held_out_combos(1), [("whole grid", WHOLE), ("sparse", SPARSE)],
                                     num_inference_steps=STEPS, keep_frames=frames)
    return record, frames


def test_dense_against_dense_is_identical_and_the_pipeline_gets_its_attention_back(pipe, measured):
    """The dense row's video again, from the pipeline itself after the frontier ran (its attention put back)."""
    record, frames = measured
    combo = held_out_combos(1)[0]
    again = pipe.generate(combo.caption, seed=record["seed"], num_inference_steps=STEPS, progress=False)
    assert psnr(again.frames, frames[DENSE][0], peak=255.0) == math.inf
    dense = record["rows"][0]
    assert dense["name"] == DENSE and dense["psnr_db"] == math.inf and dense["density"] == 1.0


def test_a_window_over_the_whole_grid_is_dense_and_a_sparse_one_is_not(measured):
    record, frames = measured
    assert record["grid"] == [3, 4, 7] and (record["height"], record["width"]) == (64, 112)
    rows = {r["name"]: r for r in record["rows"]}
    whole, sparse = rows["whole grid"], rows["sparse"]
    assert whole["video_density"] == 1.0
    assert whole["psnr_db"] > 60, whole["psnr_db"]
    assert 0 < sparse["video_density"] < 1 and sparse["density"] < 1
    assert sparse["window_density"] <= sparse["video_density"] <= sparse["window_density"] + 4 / 84 + 1e-9
    assert math.isfinite(sparse["psnr_db"]) and 10 < sparse["psnr_db"] < whole["psnr_db"]
    assert len(frames["sparse"]) == 1 and frames["sparse"][0].shape == (9, 64, 112, 3)
    for row in record["rows"]:
        assert set(row["same_as_dense"]) == {"color", "direction", "background"}
        assert row["seconds_per_video"] > 0
    assert json.loads(json.dumps(record))["rows"][1]["ssta"]["tile"] == [1, 1, 1]  # JSON-able
    assert check_record(json.loads(json.dumps(record))) == []
    assert markdown_table(frontier_rows(record)).count("\n") == len(record["rows"]) + 1


def test_the_record_check_catches_a_wrong_density(measured):
    record = copy.deepcopy(measured[0])
    record["rows"][2]["density_random_qk"] += 0.01
    record["rows"][1]["video_density"] = 0.5  # a whole-grid window's density is 1
    problems = check_record(record)
    assert any("random q/k" in p for p in problems) and any("whole" in p or "window-only" in p for p in problems)


def test_densities_by_hand():
    """3 x 9 x 16 with 1x3x4 tiles: 3 x 3 x 4 tiles; a 1x3x3 window covers 1 x 3 x 3 of them, 9 / 36."""
    config = SstaConfig(tile=(1, 3, 4), window=(1, 3, 3), sparse_type="sta")
    assert window_density((3, 9, 16), config) == 0.25
    assert random_qk_density((3, 9, 16), config) == 0.25
    topk = SstaConfig(tile=(1, 3, 4), window=(1, 3, 3), topk=8)  # k halved to 4 at 3 latent frames
    assert 0.25 < random_qk_density((3, 9, 16), topk) <= 0.25 + 4 / 36


def test_bad_settings_are_refused(pipe):
    with pytest.raises(HyvInputError, match="settings"):
        measure_sparse_frontier(pipe, held_out_combos(1), [(DENSE, SPARSE)])
    with pytest.raises(HyvInputError, match="SstaConfig"):
        measure_sparse_frontier(pipe, held_out_combos(1), [("x", dict(tile=(1, 1, 1)))])
    with pytest.raises(HyvInputError, match="count"):
        held_out_combos(0)


@pytest.mark.skipif(not os.path.exists(RESULTS), reason="benchmarks/ssta_frontier.py has not been run")
def test_the_shipped_record_is_self_consistent():
    """Its densities recomputed with ssta_mask on each run's grid, the measured ones within the window and top-k
    bounds, dense first with an infinite PSNR, every other row finite, rates in [0, 1]."""
    with open(RESULTS) as f:
        results = json.load(f)
    assert results["runs"]
    for run in results["runs"]:
        assert run["format"] == FORMAT
        assert check_record(run) == [], run["preset"]
        assert run["rows"][0]["name"] == DENSE and len(run["rows"]) >= 3
        for row in run["rows"][1:]:
            if row["window_density"] < 1:  # a sparse setting: fewer tiles, a different video
                assert row["video_density"] < 1 and math.isfinite(row["psnr_db"]), row["name"]
            assert len(row["psnr_db_per_video"]) == run["prompts"] == len(row["readings"])
            assert all(0 <= row[k] <= 1 for k in ("color", "direction", "background"))
    grids = {run["preset"]: run["grid"] for run in results["runs"]}
    assert grids.get("tiny_trained_720p", [3, 9, 16]) == [3, 9, 16]
    assert grids.get("tiny_trained", [3, 4, 7]) == [3, 4, 7]
