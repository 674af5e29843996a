"""Many prompts in one process: models loaded once, one compiled step, nothing lost on a bad line or prompt."""

import json
import os

import pytest
import torch
from safetensors.torch import load_file

from hyv_lib.base.errors import HyvInputError
from hyv_lib.cli.commands import run
from hyv_lib.pipeline.batch import (
    BatchRunner,
    PromptEntry,
    entry_record,
    parse_shard,
    read_prompts_file,
    run_prompts_file,
)
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
    """Two prompts through one BatchRunner on the jax runtime: one compilation; each folder holds what a separate
    `generate` with the same prompt and seed writes."""
    pytest.importorskip("torchax")
    pipe = BatchRunner("tiny", stage2=dict(SETTINGS, runtime="jax"))
    prompts = write(tmp_path / "p.txt", ["a red ball", '{"prompt": "a blue cube", "seed": 3}'])
    report = run_prompts_file(str(prompts), str(tmp_path / "out"), pipe, seed=11, progress=False)
    assert [e["status"] for e in report.entries] == ["done", "done"] and report.failed == 0
    assert pipe.compilations == 1
    generate(preset="tiny", prompt="a blue cube", output_dir=str(tmp_path / "single"), seed=3,
             runtime="jax", **SETTINGS)
    single = load_file(tmp_path / "single" / "stage2_latents.safetensors")["latents"]
    batch = load_file(tmp_path / "out" / "0001" / "stage2_latents.safetensors")["latents"]
    assert torch.equal(single, batch)
    config = json.loads((tmp_path / "out" / "0000" / "generation_config.json").read_text())
    assert config["prompt"] == "a red ball" and config["seed"] == 11 and config["stage3_runtime"] == "jax"


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


def test_binary_or_non_utf8_prompts_files_are_one_error_naming_the_file_and_line(tmp_path, capsys):
    """A prompts file is UTF-8 text: Latin-1 bytes on line 2 or a NUL byte (a binary file) are a HyvInputError naming
    the file and the line; the CLI prints one `error:` line and exits with 2 before any model loads. A UTF-8 BOM is
    fine."""
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("a red ball\na café at night\n".encode("latin-1"))
    with pytest.raises(HyvInputError, match=r"latin1\.txt: line 2, byte 6: not UTF-8"):
        read_prompts_file(str(latin1))
    binary = tmp_path / "weights.bin"
    binary.write_bytes(b"a prompt\n\x00\x01\x02\xff" * 3)
    with pytest.raises(HyvInputError, match=r"weights\.bin: line 2: a NUL byte"):
        read_prompts_file(str(binary))
    assert run(["generate", "--prompts_file", str(latin1), "--output_dir", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --prompts_file: ") and "line 2" in err[0]
    assert not (tmp_path / "out").exists()
    bom = tmp_path / "bom.txt"
    bom.write_bytes(b"\xef\xbb\xbfa red ball\n")
    assert [e.prompt for e in read_prompts_file(str(bom))[0]] == ["a red ball"]


def test_entries_are_numbered_among_prompt_lines_and_seeds_stay_in_range(tmp_path):
    """Bad lines keep their number (fixing one moves no other entry); with the run's seed, an entry without a seed
    gets seed + number, and one that would reach 2**63 is a bad line naming its line."""
    path = write(tmp_path / "p.txt", ["# c", "a", "{bad", "", "b", '{"prompt": "c", "seed": 3}'])
    entries, bad = read_prompts_file(str(path), seed=2**63 - 2)
    assert [(e.line, e.number, e.seed) for e in entries] == [(2, 0, 2**63 - 2), (6, 3, 3)]
    assert [(b["line"], b["number"]) for b in bad] == [(3, 1), (5, 2)]
    assert "2**63" in bad[1]["error"]  # the CLI prints it as: error: --prompts_file: line 5: ...
    assert read_prompts_file(str(path))[0][1].seed is None  # without the run's seed, as written


def test_shard_values(tmp_path, capsys):
    """--shard is I/N with 0 <= I < N; anything else, or --shard without --prompts_file, is exit code 2 naming
    --shard."""
    assert parse_shard("1/4") == (1, 4) and parse_shard(None) is None and parse_shard((0, 1)) == (0, 1)
    for bad in ("4/4", "-1/2", "1/0", "1", "a/b", "1/2/3", "0.5/2", (1, 1), ("0", "2")):
        with pytest.raises(HyvInputError, match="^shard: "):
            parse_shard(bad)
    prompts = write(tmp_path / "p.txt", ["a red ball"])
    assert run(["generate", "--prompts_file", str(prompts), "--shard", "2/2", "--quiet"]) == 2
    assert run(["generate", "--prompt", "x", "--shard", "0/2", "--output_dir", str(tmp_path / "o"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("error: --shard: ") for line in err)


def test_two_shards_together_equal_one_run(tmp_path):
    """Shard 0/2 and shard 1/2 of a file into one folder hold the same latents, in the same numbered folders, as one
    run of the whole file; each shard reports its own entries (and bad lines) only."""
    pipe = BatchRunner("tiny", stage2=SETTINGS)
    prompts = write(tmp_path / "p.txt", ["a red ball", "{bad", '{"prompt": "a cone", "seed": 9}'])
    whole = run_prompts_file(str(prompts), str(tmp_path / "whole"), pipe, progress=False)
    shards = [run_prompts_file(str(prompts), str(tmp_path / "split"), pipe, progress=False, shard=f"{i}/2")
              for i in (0, 1)]
    assert [[e["index"] for e in r.entries] for r in shards] == [[0, 2], []]
    assert [len(r.bad_lines) for r in shards] == [0, 1] and whole.failed == 1
    for name in ("0000", "0002"):
        assert torch.equal(load_file(tmp_path / "whole" / name / "stage2_latents.safetensors")["latents"],
                           load_file(tmp_path / "split" / name / "stage2_latents.safetensors")["latents"])
    assert sorted(os.listdir(tmp_path / "split")) == ["0000", "0002"]
    again = run_prompts_file(str(prompts), str(tmp_path / "split"), pipe, progress=False)  # the whole file: all done
    assert [e["status"] for e in again.entries] == ["skipped"] * 2


def test_an_entry_records_its_inputs_and_its_image_by_content(tmp_path):
    """The record's digest changes with the prompt, negative prompt, seed, the image's bytes (same path) and the
    settings digest, and with nothing else (not the line or the entry's number)."""
    image = tmp_path / "frame.png"
    image.write_bytes(b"one")
    entry = PromptEntry(1, "a", "n", 5, str(image), number=0)
    digest = entry_record(entry, "s")["inputs_sha256"]
    assert entry_record(PromptEntry(7, "a", "n", 5, str(image), number=4), "s")["inputs_sha256"] == digest
    changed = [PromptEntry(1, "b", "n", 5, str(image)), PromptEntry(1, "a", "", 5, str(image)),
               PromptEntry(1, "a", "n", 6, str(image)), PromptEntry(1, "a", "n", 5, None)]
    assert all(entry_record(e, "s")["inputs_sha256"] != digest for e in changed)
    assert entry_record(entry, "t")["inputs_sha256"] != digest
    image.write_bytes(b"two")
    assert entry_record(entry, "s")["inputs_sha256"] != digest


def test_settings_digest_follows_what_changes_the_video():
    """Equal for the same settings however given (fps left to the preset or set to its value, a warm-up call), other
    for a setting that changes the video (steps, fps, the VAE's dtype)."""
    base = BatchRunner("tiny", stage2=SETTINGS)
    same = BatchRunner("tiny", stage2=dict(SETTINGS, warmup_steps=1), stage3=dict(fps=base.preset.fps))
    assert same.settings_sha256 == base.settings_sha256
    for stage2, stage3 in ((dict(SETTINGS, num_inference_steps=3), {}), (SETTINGS, dict(fps=12)),
                           (SETTINGS, dict(vae_dtype="bf16"))):
        assert BatchRunner("tiny", stage2=stage2, stage3=stage3).settings_sha256 != base.settings_sha256
