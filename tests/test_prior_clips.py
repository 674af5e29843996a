"""prior_clips (hyv_lib.training.prior): the captions' twins with a known word, drawn by the model, listed beside the
user's clips in a data.json that extract_features reads; reruns, other settings and bad words."""

import json
import os

import numpy as np
import pytest

from hyv_lib.cli.commands import run
from hyv_lib.pipeline.video_io import read_mp4, write_mp4
from hyv_lib.training.prior import twin_captions

pytestmark = pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")  # ffmpeg readers started after JAX loaded


def test_twins_replace_the_whole_word_and_the_known_words_take_turns():
    captions = ["a red circle moving up-right on a gray background", "a blue square moving left",
                "a green ball moving up-right", "an up-righter moves", "up-right, then nothing"]
    assert twin_captions(captions, "up-right", ["up", "right"]) == [
        (0, "a red circle moving up on a gray background"), (2, "a green ball moving right"),
        (4, "up, then nothing")]


@pytest.fixture()
def clips(tmp_path):
    """Two 5-frame 64x112 mp4 clips whose captions name the new word, and one that does not."""
    rng = np.random.default_rng(0)
    entries = []
    for i, cap in enumerate(["a red circle moving up-right", "a blue square moving up-right", "a gray box"]):
        write_mp4(rng.integers(0, 255, (5, 64, 112, 3), dtype=np.uint8), str(tmp_path / f"{i}.mp4"), fps=8)
        entries.append({"path": f"{i}.mp4", "cap": cap, "num_frames": 5, "fps": 8})
    path = tmp_path / "data.json"
    path.write_text(json.dumps(entries))
    return str(path)


def test_prior_clips_through_the_cli(clips, tmp_path, capsys):
    out = str(tmp_path / "prior")
    argv = ["prior_clips", "--data_json", clips, "--word", "up-right", "--known", "up,left", "--preset", "tiny",
            "--output_dir", out, "--num_inference_steps", "2", "--quiet"]
    assert run(argv) == 0, capsys.readouterr().err
    listed = json.load(open(os.path.join(out, "data.json")))
    assert [e["cap"] for e in listed] == ["a red circle moving up-right", "a blue square moving up-right",
                                          "a gray box", "a red circle moving up", "a blue square moving left"]
    assert all(os.path.isabs(e["path"]) for e in listed[:3])  # the user's clips, found from any folder
    for entry in listed[3:]:
        frames, meta = read_mp4(os.path.join(out, entry["path"]))
        assert frames.shape == (5, 64, 112, 3) and meta["fps"] == pytest.approx(8)
        assert entry["num_frames"] == 5 and entry["resolution"] == {"height": 64, "width": 112}
    first = os.path.getmtime(os.path.join(out, listed[3]["path"]))
    assert run(argv) == 0  # a rerun keeps the clips drawn
    assert os.path.getmtime(os.path.join(out, listed[3]["path"])) == first
    features = str(tmp_path / "features")
    assert run(["extract_features", "--data_json", os.path.join(out, "data.json"), "--preset", "tiny",
                "--output_dir", features, "--num_frames", "5", "--quiet"]) == 0
    index = json.load(open(os.path.join(features, "features.safetensors.index.json")))
    assert len(index["clips"]) == 5


@pytest.mark.parametrize("flags, flag", [
    (["--word", "sideways", "--known", "up"], "--word"),  # in no caption
    (["--word", "up-right", "--known", "up,up-right"], "--known"),
    (["--word", "up-right", "--known", ","], "--known"),
    (["--word", "up-right", "--known", "up", "--seed", "-1"], "--seed"),
])
def test_bad_words_are_one_error_line_before_drawing(clips, tmp_path, capsys, flags, flag):
    out = tmp_path / "prior"
    code = run(["prior_clips", "--data_json", clips, "--preset", "tiny", "--output_dir", str(out), *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith(f"error: {flag}:"), err
    assert not out.exists() or not os.listdir(out)


def test_other_settings_in_the_same_folder_are_refused(clips, tmp_path, capsys):
    out = str(tmp_path / "prior")
    base = ["prior_clips", "--data_json", clips, "--word", "up-right", "--preset", "tiny", "--output_dir", out,
            "--num_inference_steps", "1", "--quiet"]
    assert run(base + ["--known", "up"]) == 0
    assert run(base + ["--known", "down"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: --output_dir:") and "known" in err[-1]
    entries = json.load(open(clips))
    entries[0]["cap"] = "a red circle moving up-right fast"  # an edited data.json: its old twins are stale
    with open(clips, "w") as f:
        json.dump(entries, f)
    assert run(base + ["--known", "up"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: --output_dir:") and "entries" in err[-1]
