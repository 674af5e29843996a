"""The real-layout tiny checkpoint: a real preset's shapes at tiny widths, loaded through --model_path like real weights."""

import json

import pytest
import torch
from safetensors.torch import load_file

import hyv_lib
from hyv_lib.models.families import get_preset
from hyv_lib.cli.commands import run

SMALL = ["--height", "128", "--width", "224", "--video_length", "5", "--num_inference_steps", "2"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("real_layout") / "hyv-720p-layout"
    assert run(["save_tiny", "--preset", "720p_t2v", "--output_dir", str(path), "--quiet"]) == 0
    return path


def test_the_folder_has_the_real_presets_layout(folder):
    real = get_preset("720p_t2v")
    transformer = json.loads((folder / "transformer" / "config.json").read_text())
    vae = json.loads((folder / "vae" / "config.json").read_text())
    scheduler = json.loads((folder / "scheduler" / "scheduler_config.json").read_text())
    assert (transformer["in_channels"], transformer["out_channels"]) == (65, 32)  # 2 x 32 latent channels + mask
    assert vae["latent_channels"] == real.latent_channels == 32
    assert (vae["spatial_compression_ratio"], vae["temporal_compression_ratio"]) == (16, 4)
    assert scheduler["shift"] == real.flow_shift == 9.0
    assert transformer["num_layers"] < real.transformer["num_layers"]  # tiny widths and depth: cheap


def test_the_cli_runs_it_as_the_real_preset_quietly(folder, tmp_path, capsys):
    """--preset 720p_t2v --model_path FOLDER: the stage files have the real text lengths (1000 MLLM tokens, 256 ByT5)
    and 32 latent channels; --quiet prints nothing at all (no weight-loading bars)."""
    out = tmp_path / "out"
    assert run(["generate", "--preset", "720p_t2v", "--model_path", str(folder), "--prompt", "a cat",
                "--output_dir", str(out), "--quiet", *SMALL]) == 0
    assert capsys.readouterr().err == ""
    embeds = load_file(out / "stage1_embeddings.safetensors")
    assert embeds["prompt_embeds"].shape[:2] == (1, 1000) and embeds["prompt_embeds_2"].shape[:2] == (1, 256)
    assert embeds["prompt_embeds"].dtype == torch.bfloat16  # the real preset's default dtype
    latents = load_file(out / "stage2_latents.safetensors")["latents"]
    assert latents.shape == get_preset("720p_t2v").latent_shape(128, 224, 5) == (1, 32, 2, 8, 14)
    config = json.loads((out / "generation_config.json").read_text())
    assert (config["preset"], config["dtype"], config["guidance_scale"]) == ("720p_t2v", "bf16", 6.0)
    video = hyv_lib.load_pipeline("720p_t2v", model_path=str(folder), progress=False).generate(
        "a cat", seed=42, height=128, width=224, video_length=5, num_inference_steps=2, progress=False)
    assert torch.equal(video.latents, latents)  # the in-memory pipeline reads the folder the same way


def test_save_tiny_refuses_a_non_empty_folder_and_writes_nothing(tmp_path, capsys):
    target = tmp_path / "busy"
    target.mkdir()
    (target / "keep.txt").write_text("x")
    assert run(["save_tiny", "--output_dir", str(target)]) == 2
    assert "error: --output_dir:" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["busy"] and [p.name for p in target.iterdir()] == ["keep.txt"]
    assert run(["save_tiny", "--preset", "9000p", "--output_dir", str(tmp_path / "new")]) == 2
    assert not (tmp_path / "new").exists()


def test_step_distilled_i2v_layout_runs_from_an_image(tmp_path, capsys):
    """--preset 480p_i2v_step_distilled on its real layout (SigLIP's 729 tokens, 480p buckets, MeanFlow, 8 steps at
    CFG 1): a 16:9 image buckets to 480x848, stage 1 writes the image tensors, the loop runs one sample per step."""
    import logging

    from PIL import Image

    folder = tmp_path / "hyv-480p-i2v-distilled-layout"
    records = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    logging.getLogger("diffusers").addHandler(handler)  # diffusers' own handler may hold a stale stderr under pytest
    try:
        assert run(["save_tiny", "--preset", "480p_i2v_step_distilled", "--output_dir", str(folder), "--quiet"]) == 0
    finally:
        logging.getLogger("diffusers").removeHandler(handler)
    assert capsys.readouterr().err == "" and [r.getMessage() for r in records] == []  # --quiet: not a word
    assert json.loads((folder / "model_index.json").read_text())["_class_name"] == "HunyuanVideo15ImageToVideoPipeline"
    assert json.loads((folder / "transformer" / "config.json").read_text())["use_meanflow"] is True
    image = tmp_path / "frame.png"
    Image.new("RGB", (1280, 720), (40, 90, 160)).save(image)
    out = tmp_path / "out"
    assert run(["generate", "--preset", "480p_i2v_step_distilled", "--model_path", str(folder), "--prompt", "a cat",
                "--image_path", str(image), "--output_dir", str(out), "--video_length", "5",
                "--num_inference_steps", "2", "--quiet"]) == 0
    assert capsys.readouterr().err == ""
    embeds = load_file(out / "stage1_embeddings.safetensors")
    assert embeds["image_embeds"].shape[:2] == (1, 729) and embeds["cond_latents"].shape == (1, 32, 1, 30, 53)
    assert load_file(out / "stage2_latents.safetensors")["latents"].shape == (1, 32, 2, 30, 53)
    config = json.loads((out / "generation_config.json").read_text())
    assert (config["task"], config["height"], config["width"], config["guidance_scale"]) == ("i2v", 480, 848, 1.0)
