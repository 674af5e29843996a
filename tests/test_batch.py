"""Many prompts in one process: models loaded once, one compiled step, nothing lost on a bad line or prompt."""

import json

import pytest
import torch
from safetensors.torch import load_file

from hyv_lib.cli import run
from hyv_lib.pipeline.batch import BatchRunner, read_prompts_file, run_prompts_file
from hyv_lib.pipeline.stages import generate

SETTINGS = dict(video_length=5, num_inference_steps=2, quiet=True)


def write(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return path


def test_prompts_file_lines(tmp_path):
    entries, bad = read_prompts_file(write(tmp_path / "p.txt", [
        "a red ball", "", "# a comment", '{"prompt": "a blue cube", "seed": 7, "negative_prompt": "blur"}',
        '{"prompt": 5}', '{"prompt": "x", "colour": "red"}', "{not json", '{"prompt": "y", "seed": -1}']))
    assert [(e.line, e.prompt, e.negative_prompt, e.seed) for e in entries] == [
        (1, "a red ball", "", None), (4, "a blue cube", "blur", 7)]
    assert [b["line"] for b in bad] == [5, 6, 7, 8]
    assert "colour" in bad[1]["error"] and "seed" in bad[3]["error"]


def test_tpu_pipeline_compiles_once_for_every_prompt_and_matches_generate(tmp_path):
    """Two prompts through one BatchRunner on the tpu runtime: one compilation; each folder holds what a separate
    `generate` with the same prompt and seed writes."""
    pytest.importorskip("torchax")
    pipe = BatchRunner("tiny", stage2=dict(SETTINGS, runtime="tpu"))
    prompts = write(tmp_path / "p.txt", ["a red ball", '{"prompt": "a blue cube", "seed": 3}'])
    report = run_prompts_file(str(prompts), str(tmp_path / "out"), pipe, seed=11, progress=False)
    assert [e["status"] for e in report.entries] == ["done", "done"] and report.failed == 0
    assert pipe.compilations == 1
    generate(preset="tiny", prompt="a blue cube", output_dir=str(tmp_path / "single"), seed=3,
             runtime="tpu", **SETTINGS)
    single = load_file(tmp_path / "single" / "stage2_latents.safetensors")["latents"]
    batch = load_file(tmp_path / "out" / "0001" / "stage2_latents.safetensors")["latents"]
    assert torch.equal(single, batch)
    config = json.loads((tmp_path / "out" / "0000" / "generation_config.json").read_text())
    assert config["prompt"] == "a red ball" and config["seed"] == 11 and config["stage3_runtime"] == "tpu"


def test_a_failing_prompt_loses_nothing_and_a_rerun_skips_complete_folders(tmp_path, monkeypatch):
    pipe = BatchRunner("tiny", stage2=SETTINGS)
    prompts = write(tmp_path / "p.txt", ["first", "boom", "{broken", "third"])
    real = BatchRunner.generate

    def flaky(self, prompt, *args, **kwargs):
        if prompt == "boom":
            raise RuntimeError("out of memory (simulated)")
        return real(self, prompt, *args, **kwargs)

    monkeypatch.setattr(BatchRunner, "generate", flaky)
    report = run_prompts_file(str(prompts), str(tmp_path / "out"), pipe, progress=False)
    assert [e["status"] for e in report.entries] == ["done", "failed", "done"]
    assert "simulated" in report.entries[1]["error"] and report.bad_lines[0]["line"] == 3 and report.failed == 2
    assert (tmp_path / "out" / "0003" / "output_video.mp4").is_file()  # numbered among prompt lines, bad ones too
    monkeypatch.setattr(BatchRunner, "generate", real)
    again = run_prompts_file(str(prompts), str(tmp_path / "out"), pipe, progress=False)
    assert [e["status"] for e in again.entries] == ["skipped", "done", "skipped"]


def test_cli_prompts_file_exit_code_and_errors(tmp_path, capsys):
    prompts = write(tmp_path / "p.txt", ["a red ball", "{oops"])
    code = run(["generate", "--prompts_file", str(prompts), "--output_dir", str(tmp_path / "out"),
                "--video_length", "5", "--num_inference_steps", "2", "--quiet"])
    err = capsys.readouterr().err
    assert code == 1 and "error: --prompts_file: line 2:" in err  # the bad line is reported, the good one ran
    assert (tmp_path / "out" / "0000" / "output_video.mp4").is_file()
    assert run(["generate", "--prompts_file", str(tmp_path / "nope.txt"), "--quiet"]) == 2
    assert run(["generate", "--prompts_file", str(prompts), "--prompt", "x", "--quiet"]) == 2


def test_deepcache_pipeline_serves_every_prompt_its_own_schedule(tmp_path):
    """DeepCache kept across prompts: the second video follows the same full/cached schedule as the first and
    equals a separate `generate` (a step counter carried over from the first video would shift it)."""
    cached = dict(SETTINGS, num_inference_steps=4, enable_cache=True, cache_start_step=1, cache_end_step=3,
                  cache_step_interval=2)
    pipe = BatchRunner("tiny", stage2=cached)
    prompts = write(tmp_path / "p.txt", ["a red ball", "a blue cube"])
    report = run_prompts_file(str(prompts), str(tmp_path / "out"), pipe, seed=5, progress=False)
    assert [e["status"] for e in report.entries] == ["done", "done"]
    configs = [json.loads((tmp_path / "out" / f"000{i}" / "generation_config.json").read_text()) for i in (0, 1)]
    assert [(c["cache_full_steps"], c["cache_cached_steps"]) for c in configs] == [(3, 1), (3, 1)]
    generate(preset="tiny", prompt="a blue cube", output_dir=str(tmp_path / "single"), seed=6, **cached)
    single = load_file(tmp_path / "single" / "stage2_latents.safetensors")["latents"]
    batch = load_file(tmp_path / "out" / "0001" / "stage2_latents.safetensors")["latents"]
    assert torch.equal(single, batch)
