"""benchmarks/gpu_check.py --tiny: the real-size GPU check's own code on tiny shapes on the CPU, without torchax."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = {"environment", "attention", "model", "step", "cache", "offload", "compiled", "e2e", "vae", "distributed",
            "train", "cogvideox", "hunyuanvideo", "ssta", "ssta_backward"}


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """One --tiny run in a fresh interpreter where torchax cannot be imported (the GPU machine has none)."""
    out = tmp_path_factory.mktemp("gpu_check") / "check.json"
    hide = ("import sys, runpy; sys.modules['torchax'] = None; sys.argv = sys.argv[1:]; "
            "runpy.run_path(sys.argv[0], run_name='__main__')")
    done = subprocess.run([sys.executable, "-c", hide, str(ROOT / "benchmarks" / "gpu_check.py"), "--tiny",
                           "--output", str(out)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text()), out


def test_every_section_runs_and_is_written(report):
    data, out = report
    assert set(data["sections"]) == SECTIONS
    assert {name: s["status"] for name, s in data["sections"].items()} == {name: "ok" for name in SECTIONS}
    markdown = out.with_suffix(".md").read_text()
    assert "## attention (ok" in markdown and "| sdpa | ok |" in markdown


def test_attention_rows_match_the_fp32_reference_and_never_hold_s_by_s(report):
    section = report[0]["sections"]["attention"]
    rows = {r["name"]: r for r in section["rows"]}
    assert set(rows) == {"flash3", "flash", "torch_varlen", "sdpa", "sage", "diffusers_dense"}
    assert rows["torch_varlen"]["status"] == "skipped" and "GPU" in rows["torch_varlen"]["reason"]
    for name in ("sdpa", "diffusers_dense"):
        # bf16 inputs, outputs within a few bf16 ulps of O(1) values of the fp32 reference (measured: 0.003)
        assert rows[name]["status"] == "ok" and rows[name]["max_error"] < 0.02
    assert 0 < rows["sdpa"]["largest_tensor_elements"] < section["s_squared"]
    # the SDPA kernel a profiled call ran (one call per sample: the CFG batch of 2), and torch's own choice
    assert rows["sdpa"]["sdpa_ops"] == {"flash (cpu)": 2}
    assert report[0]["sections"]["environment"]["sdpa_kernel_bf16_d128"] == "flash"
    assert section["shape"]["valid_tokens"][0] > section["shape"]["valid_tokens"][1]  # padding differs per sample


def test_step_rows_compare_hyv_lib_with_diffusers_stock_forward(report):
    section = report[0]["sections"]["step"]
    rows = {r["name"]: r for r in section["rows"]}
    assert {r["status"] for r in rows.values()} == {"ok"} and len(rows) == 4
    for row in rows.values():
        assert row["finite"] and row["s_per_step"] > 0
    # at the large tiny size S x S outgrows every other tensor: diffusers' stock forward builds its [B,1,S,S] mask,
    # hyv_lib's attention nothing that large
    hyv, stock = rows["hyv_lib large"], rows["diffusers large"]
    assert hyv["backend"] == "sdpa" and hyv["largest_tensor_elements"] < hyv["s_squared"]
    assert stock["largest_tensor_elements"] >= 2 * stock["s_squared"]
    for compare in section["compare"].values():
        # the same bf16 model, two attention paths: they differ by bf16 rounding (measured ~0.5% relative L2),
        # and attention does move the output (an output independent of the mask would compare equal)
        assert 0 < compare["relative_l2"] < 0.02 and compare["max_abs_output"] > 0.1


def test_cache_rows_and_the_cli_errors(report, capsys):
    row = report[0]["sections"]["cache"]["rows"][0]
    # which step is faster is the GPU run's to measure (at tiny size one timing is noise on a loaded machine); here:
    # both ran, and the 50-step projection is the schedule's mix of the two times
    assert row["finite"] and row["full_step_s"] > 0 and row["cached_step_s"] > 0
    default = row["deepcache_default"]
    assert default["full_steps"] == 25 and default["cached_steps"] == 25
    assert default["projected_50_step_s"] == pytest.approx(25 * row["full_step_s"] + 25 * row["cached_step_s"],
                                                           abs=0.06)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_check

    assert gpu_check.main(["--tiny", "--sections", "attention,bogus"]) == 2
    assert "error: --sections: unknown bogus" in capsys.readouterr().err


def test_torchrun_rows_equal_the_one_process_stage2(report):
    """The distributed section's torchrun launch (Ulysses + FSDP, one rank; gloo here, nccl on a GPU) wrote the
    latents the same stage 2 computes in this process (measured: identical)."""
    rows = report[0]["sections"]["distributed"]["rows"]
    assert [r["name"] for r in rows] == ["torchrun 1 rank, ulysses + fsdp"]
    assert rows[0]["status"] == "ok" and rows[0]["max_abs_diff"] <= 1e-5, rows[0]


def test_train_rows_run_the_torch_train_step_beside_the_memory_model(report):
    """The train section on the tiny model: a full fine-tune, then a rank-16 LoRA with and without remat, each through
    TorchTrainStep; finite losses; torch's live tensor bytes of a step beside the model's (transient + inputs). At
    these sizes the CPU attention kernel's fixed work buffers (about 1.5 MB, as large as the blocks' tensors here)
    and the per-sample tensors the model leaves out weigh: measured within -40% / +10% of the model (measured: full
    0.0%, LoRA -31% and -21%); tests/test_train_memory.py checks the model closely at widths where tokens dominate."""
    section = report[0]["sections"]["train"]
    assert section["attention"] == "sdpa" and section["lora_rank"] == 16
    rows = section["rows"]
    assert [r["name"] for r in rows] == ["full small 9f", "lora small 9f", "lora small 9f no remat"]
    for row in rows:
        assert row["status"] == "ok" and row["finite"] and row["s_per_step"] > 0, row
        for key in ("trainable", "size", "remat", "lora_rank", "modelled_gib", "modelled_peak_phase",
                    "modelled_parts_gib", "live_peak_mib", "modelled_live_mib", "trained_params", "planned_s"):
            assert key in row, (row["name"], key)
        assert 0.6 < row["modelled_live_mib"] / row["live_peak_mib"] < 1.1, row
    full, lora, no_remat = rows
    assert full["trained_params"] > 100 * lora["trained_params"]
    assert no_remat["live_peak_mib"] > lora["live_peak_mib"]  # what remat saves


@pytest.mark.parametrize("model", ["cogvideox", "hunyuanvideo"])
def test_model_sections_compare_with_diffusers(report, model):
    """The second and third models' sections: the tiny model with hyv_lib's attention against diffusers' fp32
    forward, and the step rows (diffusers' stock forward vs hyv_lib's attention on the same weights) with their
    output difference. HunyuanVideo's rows run one sample per step (embedded guidance), with padded text."""
    section = report[0]["sections"][model]
    assert section["tiny"]["max_abs_diff"] <= 1e-5 * max(1.0, section["tiny"]["max_abs_output"])
    assert section["parameters"] > 0 and {r["status"] for r in section["rows"]} == {"ok"}
    assert [r["name"] for r in section["rows"]][-1] == f"{model} hyv_lib compiled small"
    assert {r["batch"] for r in section["rows"] if "batch" in r} == {2 if model == "cogvideox" else 1}
    for size, compare in section["compare"].items():
        if size.startswith("compiled "):  # fp32: the compiled blocks within float rounding of the eager ones
            # (measured: relative L2 1.7e-7, max 1.2e-6 of outputs up to 4.7), with both ratios recorded
            assert compare["relative_l2_vs_eager"] < 1e-6 and compare["max_abs_diff_vs_eager"] < 1e-5
            assert compare["speedup_vs_eager"] > 0 and compare["speedup_vs_diffusers"] > 0
        else:  # the same SDPA kernel on the CPU: equal outputs
            assert compare["max_abs_diff"] <= 1e-5 * max(1.0, compare["max_abs_output"])


def test_ssta_rows_equal_their_float32_reference_and_cover_every_row(report):
    """The ssta section at tiny size: each sparse attention row within bf16 rounding of a float32 softmax over exactly
    its attended tiles (measured 0.004 of outputs up to ~1), sparser than dense, and every step row finite."""
    section = report[0]["sections"]["ssta"]
    rows = {r["name"]: r for r in section["rows"]}
    assert {r["status"] for r in rows.values()} == {"ok"}
    for name in ("ssta small", "sta window only small"):
        row = rows[name]
        assert 0 < row["tile_density"] < 1 and row["max_error"] < 0.02 * max(1.0, row["max_reference"])
    assert rows["sta window only small"]["tile_density"] <= rows["ssta small"]["tile_density"]
    steps = [r for r in rows.values() if "s_per_step" in r]
    assert len(steps) == 4 and all(r["finite"] for r in steps)  # dense, ssta, the batch of one, compiled
    assert 0 < section["compare"]["step small"]["relative_l2_sparse_vs_dense"] < 1  # sparse moves the output


def test_ssta_gradients_equal_the_reference(report):
    """The CPU's tile backward (CUDA's compiled FlexAttention backward on a GPU) against autograd through the float32
    reference: float32 to ~1e-6 (measured 8e-7, the tiny DiT 1.2e-7), bf16 inputs within a few percent."""
    rows = {r["name"]: r for r in report[0]["sections"]["ssta_backward"]["rows"]}
    assert rows["attention backward fp32"]["max_relative_error"] < 1e-5
    assert rows["attention backward bf16"]["max_relative_error"] < 0.1
    assert rows["tiny DiT gradients fp32"]["max_relative_error"] < 1e-5


def test_compiled_rows_time_the_compile_apart_and_match_the_eager_step(report):
    """The compiled section: make_step(..., compile=True) on a model rebuilt with the step section's seeded weights
    (equal fingerprints, so the eager reference is the step section's own rows); torch.compile made graphs on the
    first call, which is recorded apart from the steady step; both ratios are there; the bf16 output is within bf16
    rounding of the eager step (measured: relative L2 0.0055, max 0.028 of outputs up to 3.75) yet attention-sized
    errors (the eager hyv_lib and diffusers paths differ by 0.002) would show."""
    section = report[0]["sections"]["compiled"]
    assert "step section" in section["eager_reference"] and section["compile_mode"] == "default"
    rows = {r["name"]: r for r in section["rows"]}
    assert set(rows) == {"hyv_lib compiled small", "hyv_lib compiled large"}
    for size, row in (("small", rows["hyv_lib compiled small"]), ("large", rows["hyv_lib compiled large"])):
        assert row["status"] == "ok" and row["finite"] and row["graphs_compiled"] >= 1, row
        assert row["first_call_s"] > 0 and row["s_per_step"] > 0 and row["speedup_vs_eager"] > 0
        assert row["speedup_vs_diffusers"] > 0
        compare = section["compare"][size]
        assert compare["relative_l2"] < 0.02 and compare["max_abs_diff"] < 0.05 * compare["max_abs_output"], compare
        assert compare["relative_l2_vs_diffusers"] < 0.02


def test_e2e_section_times_the_whole_video_against_diffusers_pipeline(report):
    """The e2e section at tiny size: both text paths give the same embeddings (the same encoders and recipe;
    measured equal), diffusers' pipeline runs CFG as two forwards per step, hyv_lib's compiled loop ends within the
    bf16 drift of diffusers' latents (measured 2.3-3.2% relative L2 after 2 CFG steps here, 3.3-3.5% on an H200:
    diffusers keeps its latents in bf16 and guidance 6 amplifies the predictions' rounding; the same two loops in
    fp32 with eager attention agree to 7e-7), both decodes make the video's frames, and each video row adds up its
    parts, measured at the first size (8 steps, the tiny preset's) and projected at the other."""
    section = report[0]["sections"]["e2e"]
    rows = {r["name"]: r for r in section["rows"]}
    skipped = {name for name, r in rows.items() if r["status"] != "ok"}
    assert skipped == {"denoise hyv_lib compiled large, 8 steps"}, skipped
    text = section["compare"]["text"]
    assert text["max_abs_diff"] <= 2**-8 * text["max_abs_reference"]
    for size, (height, width, frames) in (("small", (32, 48, 9)), ("large", (128, 160, 9))):
        stock, mine = rows[f"denoise diffusers {size}"], rows[f"denoise hyv_lib compiled {size}"]
        assert stock["forwards_per_step"] == 2 and stock["finite"] and mine["finite"]
        assert mine["graphs_compiled"] >= 1 and mine["first_call_s"] > 0 and mine["speedup_vs_diffusers"] > 0
        assert 0 < section["compare"][f"latents after 2 steps {size}"]["relative_l2"] < 0.06
        assert rows[f"decode hyv_lib {size}"]["frames"] == [frames, height, width, 3]
        assert rows[f"decode diffusers {size}"]["frames"] == [1, frames, height, width, 3]
        for which in ("hyv_lib", "diffusers"):
            video = rows[f"video {which} {size}"]
            assert video["steps"] == 8 and video["video_s"] == pytest.approx(
                video["text_s"] + video["denoise_s"] + video["decode_s"], abs=0.15)
            measured = which == "hyv_lib" and size == "small"
            assert video["how"] == ("measured" if measured else "projected from 2 steps")
        assert rows[f"video hyv_lib {size}"]["first_video_s"] >= rows[f"video hyv_lib {size}"]["video_s"]
    assert rows["denoise hyv_lib compiled small, 8 steps"]["steps"] == 8
