"""SSTA through the public CLI and API: ``--attention ssta``, the official ``--sparse_attn``, the ``--ssta_*`` options
(recorded in generation_config.json), the sparse presets' default, and one ``error:`` line for each bad option."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

import hyv_lib
from hyv_lib.base.errors import HyvInputError
from hyv_lib.pipeline.settings import resolve_settings

from test_cli import hyv

#: Tiles that cut the tiny preset's default grid (3 latent frames of 6 x 10 at 96 x 160) into several.
TILE = ["--ssta_tile", "1,2,2", "--ssta_window", "3,1,3", "--ssta_topk", "4"]
STEPS = ["--num_inference_steps", "2", "--quiet"]


@pytest.fixture(scope="module")
def stage1_folder(tmp_path_factory):
    out = tmp_path_factory.mktemp("ssta_cli") / "s1"
    hyv("stage1", "--preset", "tiny", "--prompt", "a red ball", "--output_dir", str(out))
    return out


def stage2(folder, tmp_path, name, *flags):
    target = tmp_path / name
    shutil.copytree(folder, target)
    hyv("stage2", "--input_dir", str(target), *STEPS, *flags)
    config = json.loads((target / "generation_config.json").read_text())
    return load_file(str(target / "stage2_latents.safetensors"))["latents"], config


def test_stage2_with_ssta_equals_its_reference_and_records_the_options(stage1_folder, tmp_path):
    fast, config = stage2(stage1_folder, tmp_path, "ssta", "--attention", "ssta", *TILE)
    reference, ref_config = stage2(stage1_folder, tmp_path, "reference", "--attention", "ssta_reference", *TILE)
    dense, dense_config = stage2(stage1_folder, tmp_path, "dense")
    assert config["attention"] == "ssta" and ref_config["attention"] == "ssta_reference"
    assert config["ssta"] == {**{k: (list(v) if isinstance(v, tuple) else v)
                                 for k, v in hyv_lib.SstaConfig().__dict__.items()},
                              "tile": [1, 2, 2], "window": [3, 1, 3], "topk": 4}
    assert dense_config["attention"] == "auto" and "ssta" not in dense_config
    scale = reference.abs().max()
    assert (fast - reference).abs().max() < 1e-5 * scale  # FlexAttention vs the fp32 oracle, two steps
    assert (fast - dense).abs().max() > 1e-4 * scale  # the tiles do not cover the grid: SSTA is not dense


def test_sparse_attn_is_attention_ssta(stage1_folder, tmp_path):
    _, config = stage2(stage1_folder, tmp_path, "official", "--sparse_attn", *TILE)
    assert config["attention"] == "ssta" and config["ssta"]["tile"] == [1, 2, 2]
    _, config = stage2(stage1_folder, tmp_path, "off", "--sparse_attn", "false")
    assert config["attention"] == "auto"


@pytest.mark.parametrize("flags, message", [
    (["--attention", "ssta", "--ssta_tile", "0,8,8"], "error: --ssta_tile: must be three positive integers"),
    (["--attention", "ssta", "--ssta_tile", "6,8"], "error: --ssta_tile: must be three positive integers"),
    (["--attention", "ssta", "--ssta_topk", "0"], "error: --ssta_topk: must be an integer >= 1"),
    (["--attention", "ssta", "--ssta_sparse_type", "dense"], "error: --ssta_sparse_type: must be one of ssta, sta"),
    (["--attention", "ssta", "--ssta_lambda", "2"], "error: --ssta_lambda: must be in [0, 1]"),
    (["--ssta_topk", "8"], "error: --ssta_topk: applies to --attention ssta (or --sparse_attn), not 'auto'"),
    (["--sparse_attn", "--attention", "sdpa"], "error: --sparse_attn: runs --attention ssta; drop --attention sdpa"),
])
def test_bad_ssta_options_are_one_error_line(stage1_folder, tmp_path, flags, message):
    target = tmp_path / "bad"
    shutil.copytree(stage1_folder, target)
    r = hyv("stage2", "--input_dir", str(target), *STEPS, *flags, check=False)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith(message), r.stderr
    assert not (target / "stage2_latents.safetensors").exists()


def test_the_sparse_presets_default_to_ssta():
    for name, task, shift in (("720p_t2v_distilled_sparse", "t2v", 9.0), ("720p_i2v_distilled_sparse", "i2v", 7.0)):
        preset = hyv_lib.get_preset(name)
        assert preset.attention == "ssta" and preset.guidance_scale == 1.0 and preset.samples_per_step == 1
        assert preset.tasks == (task,) and preset.flow_shift == shift
        settings = resolve_settings(preset)
        assert settings.attention == "ssta" and settings.attention_options() == {"ssta": hyv_lib.SstaConfig()}
        # dense attention on a sparse checkpoint is the user's explicit choice
        assert resolve_settings(preset, attention="auto").attention == "auto"
    assert resolve_settings(hyv_lib.get_preset("720p_t2v")).ssta is None
    with pytest.raises(HyvInputError, match="SSTA is the sparse attention of hunyuanvideo-1.5 .*not cogvideox_tiny's"):
        resolve_settings(hyv_lib.get_preset("cogvideox_tiny"), attention="ssta")


def test_load_pipeline_takes_a_ssta_config():
    config = hyv_lib.SstaConfig(tile=(1, 2, 2), window=(3, 1, 3), topk=4)
    pipe = hyv_lib.load_pipeline("tiny", attention="ssta", ssta=config, progress=False)
    assert pipe.attention == "ssta" and pipe.ssta["tile"] == (1, 2, 2)
    video = pipe.generate("a red ball", num_inference_steps=2, seed=1, progress=False)
    assert video.config["attention"] == "ssta" and video.config["ssta"]["topk"] == 4
    assert torch.isfinite(video.latents).all()
