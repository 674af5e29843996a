"""Paths recorded in generation_config.json are absolute (a later stage may run from another working directory),
and the files hyv_lib writes get the mode the umask gives, as any new file does."""

import json
import os
import stat

import pytest
import torch

from hyv_lib.base.files import atomic_path
from hyv_lib.cli import commands
from hyv_lib.cli.commands import run
from hyv_lib.pipeline.stage_io import CONFIG_FILE, save_tensors, update_config


@pytest.fixture()
def umask():
    """``umask(mask)``: set the process umask for the test; the old one comes back after it."""
    old = os.umask(0o022)
    os.umask(old)
    yield os.umask
    os.umask(old)


def modes(folder):
    """{path relative to folder: permission bits} of folder and everything under it."""
    found = {".": stat.S_IMODE(os.stat(folder).st_mode)}
    for root, dirs, names in os.walk(folder):
        for name in dirs + names:
            path = os.path.join(root, name)
            found[os.path.relpath(path, folder)] = stat.S_IMODE(os.stat(path).st_mode)
    return found


def test_stages_2_and_3_run_from_another_working_directory_and_save_tiny_follows_the_umask(tmp_path, monkeypatch,
                                                                                         umask):
    """save_tiny under umask 022: folders 0755, files 0644 (it made 0700 and 0600 ones). Stage 1 loads that folder
    by a relative --model_path and writes into a relative folder; stages 2 and 3 run from another working directory
    and find the model through the absolute path stage 1 recorded (a relative one pointed nowhere from there)."""
    umask(0o022)
    monkeypatch.chdir(tmp_path)
    assert run(["save_tiny", "--preset", "tiny", "--output_dir", "models/m", "--quiet"]) == 0
    found = modes("models/m")
    dirs = {p for p in found if os.path.isdir(os.path.join("models/m", p))}
    assert len(found) > 10 and any(p.endswith(".safetensors") for p in found)
    assert {p: m for p, m in found.items() if m != (0o755 if p in dirs else 0o644)} == {}
    assert not [n for n in os.listdir("models") if n != "m"]  # no temporary folder left beside it

    assert run(["stage1", "--preset", "tiny", "--model_path", "models/m", "--output_dir", "run", "--prompt",
                "a red ball", "--quiet"]) == 0
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    folder = str(tmp_path / "run")
    assert run(["stage2", "--input_dir", folder, "--num_inference_steps", "2", "--quiet"]) == 0
    assert run(["stage3", "--input_dir", folder, "--output_video", "v.mp4", "--quiet"]) == 0
    config = json.loads((tmp_path / "run" / CONFIG_FILE).read_text())
    assert config["model_path"] == str(tmp_path / "models" / "m")
    assert config["output_video"] == str(tmp_path / "elsewhere" / "v.mp4") and os.path.isfile(config["output_video"])


def test_every_path_field_is_recorded_absolute_and_a_hub_id_as_it_is(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "weights").mkdir()
    (tmp_path / "home" / "w").mkdir(parents=True)
    fields = dict(image_path="img.png", lora="l/pytorch_lora_weights.safetensors", cache_calibration="~/c.json",
                  output_video="../v.mp4", frames_file="run/stage3_frames.safetensors")
    data = update_config("run", base={"kept": "rel/x"}, model_path="weights", **fields)
    assert data == json.loads((tmp_path / "run" / CONFIG_FILE).read_text())
    assert data["model_path"] == str(tmp_path / "weights")
    assert data["image_path"] == str(tmp_path / "img.png") and data["output_video"] == str(tmp_path.parent / "v.mp4")
    assert data["lora"] == str(tmp_path / "l" / "pytorch_lora_weights.safetensors")
    assert data["cache_calibration"] == str(tmp_path / "home" / "c.json")
    assert data["frames_file"] == str(tmp_path / "run" / "stage3_frames.safetensors")
    assert data["kept"] == "rel/x"  # not a path field
    assert update_config("run", model_path="~/w")["model_path"] == str(tmp_path / "home" / "w")
    hub = update_config("run", model_path="hunyuanvideo-community/HunyuanVideo-1.5", lora=None)
    assert hub["model_path"] == "hunyuanvideo-community/HunyuanVideo-1.5" and hub["lora"] is None


@pytest.mark.parametrize("mask,file_mode,folder_mode", [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700)])
def test_written_files_get_the_mode_the_umask_gives(tmp_path, monkeypatch, umask, mask, file_mode, folder_mode):
    """The atomic writers (the config, safetensors files, any atomic_path write) and save_tiny (its writers
    stood in for by safetensors' save_file, which makes 0600 files, and a JSON file) under umask 022 and 077."""
    from safetensors.torch import save_file

    umask(mask)
    out = tmp_path / "out"
    update_config(str(out), base={}, a=1)
    save_tensors({"x": torch.zeros(2)}, str(out / "t.safetensors"))
    with atomic_path(str(out / "v.mp4")) as tmp:
        with open(tmp, "wb") as f:
            f.write(b"x")

    def fake_save(path, seed=0, preset=None):
        os.makedirs(os.path.join(path, "transformer"))
        save_file({"w": torch.zeros(2)}, os.path.join(path, "transformer", "model.safetensors"))
        with open(os.path.join(path, "model_index.json"), "w") as f:
            f.write("{}")

    monkeypatch.setattr(commands, "save_tiny_pipeline", fake_save)
    assert run(["save_tiny", "--preset", "tiny", "--output_dir", str(tmp_path / "m"), "--quiet"]) == 0
    assert modes(out) == {".": folder_mode, CONFIG_FILE: file_mode, "t.safetensors": file_mode, "v.mp4": file_mode}
    assert modes(tmp_path / "m") == {".": folder_mode, "transformer": folder_mode, "model_index.json": file_mode,
                                     "transformer/model.safetensors": file_mode}
