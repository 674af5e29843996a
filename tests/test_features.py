"""extract_features and FeatureSet: latents and conditions equal a direct encoding of the same frames, a rerun adds only
what is missing, a killed writer leaves no partial shard, bad entries are reported and the exit code says so."""

import json
import os
import subprocess
import sys
import textwrap
import threading

import imageio.v3 as iio
import numpy as np
import pytest
import torch
from PIL import Image

from hyv_lib.base.lock import folder_lock
from hyv_lib.models.families import get_preset
from hyv_lib.cli.commands import run
from hyv_lib.models.components import load_components
from hyv_lib.models.hunyuan_video15.components import IMAGE_COMPONENTS, TEXT_COMPONENTS
from hyv_lib.pipeline.image import encode_image
from hyv_lib.pipeline.text import encode_prompts
from hyv_lib.pipeline.video_io import write_mp4
from hyv_lib.runtimes.vae import to_uint8_frames
from hyv_lib.tiny.data import Combo, render_clip
from hyv_lib.training.features import INDEX_FILE, NEGATIVE_FILE, PRIOR_FILE, FeatureSet, extract_features

PRESET = "tiny_trained"
CLIPS = [  # (file, combo, height, width, frames): a clip of the bucket's size, one resized to it, one too short
    ("videos/c0.mp4", Combo("red", "circle", "left", "gray"), 64, 112, 9),
    ("videos/c1.mp4", Combo("blue", "square", "up", "black"), 80, 128, 13),
    ("videos/c2.mp4", Combo("green", "triangle", "right", "purple"), 64, 112, 5),
]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """A data.json of 8 entries: 2 good clips (one with a list of captions), an image, a clip of 5 frames (too few
    for 9), a missing file, a corrupt mp4, a bad caption, a non-object; and a data.json of the first 2."""
    root = tmp_path_factory.mktemp("clips")
    (root / "videos").mkdir()
    for i, (path, combo, height, width, frames) in enumerate(CLIPS):
        clip = torch.from_numpy(render_clip(combo, seed=i, height=height, width=width, frames=frames))
        write_mp4(to_uint8_frames(clip), str(root / path), fps=8)
    frame = to_uint8_frames(torch.from_numpy(render_clip(CLIPS[0][1], seed=9, frames=1)))[0].numpy()
    Image.fromarray(frame).save(root / "frame.png")
    (root / "corrupt.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42" + b"garbage" * 200)
    entries = [
        {"path": "videos/c0.mp4", "cap": CLIPS[0][1].caption, "num_frames": 9, "fps": 8,
         "resolution": {"height": 64, "width": 112}},
        {"path": "videos/c1.mp4", "cap": [CLIPS[1][1].caption, "another caption"], "num_frames": 13, "fps": 8,
         "resolution": {"height": 80, "width": 128}},
        {"path": "frame.png", "cap": "a red circle"},
        {"path": "videos/c2.mp4", "cap": CLIPS[2][1].caption, "num_frames": 5, "fps": 8},
        {"path": "videos/missing.mp4", "cap": "nothing"},
        {"path": "corrupt.mp4", "cap": "broken"},
        {"path": "videos/c0.mp4", "cap": 5},
        "videos/c0.mp4",
    ]
    (root / "data.json").write_text(json.dumps(entries))
    (root / "first_two.json").write_text(json.dumps(entries[:2]))
    return root


@pytest.fixture(scope="module")
def components():
    return load_components(get_preset(PRESET), None, [*TEXT_COMPONENTS, "vae", *IMAGE_COMPONENTS])


def reference_frames(path, height, width, frames, max_width=None):
    """The clip's first ``frames`` frames decoded with imageio, resized to cover the bucket (Lanczos) and
    centre-cropped, by hand, then centre-cropped to ``max_width``; uint8 [F, H, W, 3]."""
    from diffusers.pipelines.hunyuan_video1_5.image_processor import HunyuanVideo15ImageProcessor

    video = iio.imread(path, plugin="FFMPEG", index=None)[:frames]
    bh, bw = HunyuanVideo15ImageProcessor(vae_scale_factor=16).calculate_default_height_width(
        height, width, get_preset(PRESET).target_size)
    out = []
    for frame in video:
        image = Image.fromarray(frame)
        cover_w = bw if bw / bh > width / height else width * bh // height
        cover_h = bh if bw / bh <= width / height else height * bw // width
        image = image.resize((cover_w, cover_h), Image.LANCZOS)
        left, top = cover_w // 2 - bw // 2, cover_h // 2 - bh // 2
        image = image.crop((left, top, left + bw, top + bh))
        if max_width is not None and max_width < bw:
            left = (bw - max_width) // 2
            image = image.crop((left, 0, left + max_width, bh))
        out.append(np.asarray(image))
    return np.stack(out)


def vae_latents(vae, frames):
    """Plain diffusers: posterior mode of frames in [-1, 1], times the scaling factor; [C, T, h, w]."""
    x = torch.from_numpy(np.array(frames)).permute(3, 0, 1, 2)[None].float() / 127.5 - 1
    with torch.no_grad():
        return vae.encode(x).latent_dist.mode()[0] * vae.config.scaling_factor


def test_features_equal_a_direct_encoding(dataset, components, tmp_path):
    out = tmp_path / "features"
    report = extract_features(str(dataset / "data.json"), preset=PRESET, output_dir=str(out), task="i2v",
                              progress=False, components=components)
    assert len(report.extracted) == 3 and not report.skipped
    assert [(f["entry"], f["path"]) for f in report.failed] == [
        (3, "videos/c2.mp4"), (4, "videos/missing.mp4"), (5, "corrupt.mp4"), (6, "videos/c0.mp4"), (7, None)]
    errors = [f["error"] for f in report.failed]
    assert "has 5 frame(s); 9 are asked for" in errors[0] and "does not exist" in errors[1]
    assert "not a readable video" in errors[2] and '"cap"' in errors[3] and "JSON object" in errors[4]

    features = FeatureSet(str(out))
    assert len(features) == 3 and features.metadata["task"] == "i2v" and features.failed == report.failed
    assert [c["path"] for c in features.clips] == ["videos/c0.mp4", "videos/c1.mp4", "frame.png"]
    assert features.clips[1]["caption"] == CLIPS[1][1].caption  # the first of a list
    vae, spec = components["vae"], get_preset(PRESET)
    worst = 0.0
    for i, (path, height, width, frames) in enumerate([("videos/c0.mp4", 64, 112, 9), ("videos/c1.mp4", 80, 128, 9),
                                                       ("frame.png", 64, 112, 1)]):
        clip = features[i]
        if path.endswith(".png"):
            pixels = np.asarray(Image.open(dataset / path).convert("RGB"))[None]
        else:
            pixels = reference_frames(str(dataset / path), height, width, frames)
        expected = vae_latents(vae, pixels)
        assert clip["latents"].shape == expected.shape == tuple(features.shapes()[i])
        worst = max(worst, (clip["latents"] - expected).abs().max().item())
        text = encode_prompts(components, spec, [features.clips[i]["caption"]])
        for name, value in text.items():
            assert torch.equal(clip[name], value[0]), name
        first = encode_image(components, spec, Image.fromarray(pixels[0]))
        assert torch.equal(clip["image_embeds"], first["image_embeds"][0])
        torch.testing.assert_close(clip["cond_latents"], first["cond_latents"][0], rtol=0, atol=1e-5)
    # frame-by-frame mid-block attention vs diffusers' masked one: the order of float sums (measured ~1e-6)
    print(f"latents: max |extracted - direct| = {worst:.2e}")
    assert worst < 1e-4
    empty = encode_prompts(components, spec, [""])
    assert all(torch.equal(features.negative[k], v[0]) for k, v in empty.items())


def test_max_size_crops_the_centre(dataset, components, tmp_path):
    entries = [{"path": str(dataset / "videos/c1.mp4"), "cap": "a blue square"}]  # an absolute path
    (tmp_path / "one.json").write_text(json.dumps(entries))
    out = tmp_path / "cropped"
    extract_features(str(tmp_path / "one.json"), preset=PRESET, output_dir=str(out), max_width=96, progress=False,
                     components=components)
    features = FeatureSet(str(out))
    assert (features.clips[0]["height"], features.clips[0]["width"]) == (80, 96)
    expected = vae_latents(components["vae"], reference_frames(str(dataset / "videos/c1.mp4"), 80, 128, 9, 96))
    assert (features[0]["latents"] - expected).abs().max().item() < 1e-4
    assert "image_embeds" not in features[0]  # t2v: the preset's default task for both-task presets


def test_rerun_extracts_only_what_is_missing(dataset, components, tmp_path):
    out = tmp_path / "features"
    kwargs = dict(preset=PRESET, output_dir=str(out), progress=False, components=components, shard_size=1)
    first = extract_features(str(dataset / "first_two.json"), **kwargs)
    assert len(first.extracted) == 2 and first.ok
    shards = sorted(p.name for p in out.glob("features-0*.safetensors"))
    stamps = {name: ((out / name).stat().st_mtime_ns, (out / name).read_bytes()) for name in shards}
    second = extract_features(str(dataset / "data.json"), **kwargs)
    assert second.skipped == first.extracted and len(second.extracted) == 1 and len(second.failed) == 5
    for name, (mtime, data) in stamps.items():  # the first two clips' shards were not rewritten
        assert (out / name).stat().st_mtime_ns == mtime and (out / name).read_bytes() == data
    features = FeatureSet(str(out))
    # 3 shards, the negative file and hyv-tiny's prior captions (its default: train_defaults' 32, encoded once)
    assert len(features) == 3 and len(set(features.weight_map.values())) == 5
    assert len(features.prior_captions) == 32 and set(features.weight_map.values()) >= {PRIOR_FILE, NEGATIVE_FILE}
    third = extract_features(str(dataset / "data.json"), **kwargs)
    assert len(third.skipped) == 3 and not third.extracted and len(third.failed) == 5

    index = (out / INDEX_FILE).read_text()
    with pytest.raises(ValueError, match=r"output_dir: .*other settings \(num_frames: 9 there, 5 now"):
        extract_features(str(dataset / "data.json"), **{**kwargs, "num_frames": 5})
    assert (out / INDEX_FILE).read_text() == index
    held, release = threading.Event(), threading.Event()

    def another_run():  # another thread is another run (the same thread would nest its own lock)
        with folder_lock(str(out)):
            held.set()
            release.wait(60)

    thread = threading.Thread(target=another_run)
    thread.start()
    try:
        assert held.wait(60)
        with pytest.raises(ValueError, match="output_dir: .* is in use by another run"):  # FolderInUseError's text
            extract_features(str(dataset / "data.json"), **kwargs)
    finally:
        release.set()
        thread.join()


def test_a_killed_writer_leaves_no_partial_shard(dataset, components, tmp_path):
    """A process killed (os._exit, no cleanup runs) while writing its first clip shard: the shard's final name never
    appears, the index names no clip; the rerun removes the temporary file and extracts everything."""
    out = tmp_path / "features"
    script = textwrap.dedent(f"""
        import os, torch
        torch.set_num_threads(1)
        import hyv_lib.training.features as features

        def killed_mid_write(tensors, path, metadata=None):
            if "negative" in os.path.basename(path):
                return save(tensors, path, metadata)
            with features.atomic_path(path) as tmp:
                open(tmp, "wb").write(b"half a shard")
                os._exit(9)

        save, features.save_tensors = features.save_tensors, killed_mid_write
        features.extract_features({str(dataset / "first_two.json")!r}, preset={PRESET!r}, output_dir={str(out)!r},
                                  progress=False)
    """)
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 9, result.stderr[-2000:]
    names = sorted(os.listdir(out))
    assert [n for n in names if n.endswith(".partial.safetensors")]  # what the killed writer left
    assert not [n for n in names if n.startswith("features-0")]
    assert json.loads((out / INDEX_FILE).read_text())["clips"] == []

    report = extract_features(str(dataset / "first_two.json"), preset=PRESET, output_dir=str(out), progress=False,
                              components=components)
    assert len(report.extracted) == 2 and report.ok
    assert not [n for n in os.listdir(out) if ".partial" in n]
    features = FeatureSet(str(out))
    assert [tuple(features[i]["latents"].shape) for i in range(2)] == features.shapes()


def test_cli_reports_failed_entries_and_bad_files(dataset, tmp_path, capsys):
    out = tmp_path / "features"
    code = run(["extract_features", "--data_json", str(dataset / "data.json"), "--preset", PRESET,
                "--output_dir", str(out), "--quiet"])
    err = capsys.readouterr().err
    assert code == 1  # some entries failed; the others are written
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 5 and all("--data_json: entry " in line for line in lines), err
    assert len(FeatureSet(str(out))) == 3

    (tmp_path / "broken.json").write_text("[{")
    (tmp_path / "object.json").write_text('{"path": "a.mp4"}')
    for name, message in (("broken.json", "is not a JSON file"), ("object.json", "must hold a JSON list"),
                          ("absent.json", "does not exist")):
        code = run(["extract_features", "--data_json", str(tmp_path / name), "--preset", PRESET,
                    "--output_dir", str(tmp_path / "never"), "--quiet"])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and err.startswith("error: --data_json: ") and message in err
    assert not (tmp_path / "never").exists()


def test_feature_set_refuses_what_is_not_a_features_folder(tmp_path):
    with pytest.raises(ValueError, match="features: .* has no features.safetensors.index.json"):
        FeatureSet(str(tmp_path))
    (tmp_path / INDEX_FILE).write_text(json.dumps({"metadata": {"format": "hyv_lib.features/1"}, "weight_map":
                                                   {"negative.prompt_embeds": "features-negative.safetensors"},
                                                   "clips": [], "failed": []}))
    with pytest.raises(ValueError, match="shard features-negative.safetensors of its index is missing"):
        FeatureSet(str(tmp_path))


def test_two_clips_of_one_caption_in_one_shard(dataset, components, tmp_path):
    """Clips sharing a caption share its encoding; each gets its own copy in the shard (safetensors refused to write
    one tensor under two keys: the whole run crashed)."""
    entries = [{"path": str(dataset / "videos" / "c0.mp4"), "cap": CLIPS[0][1].caption, "num_frames": 9},
               {"path": str(dataset / "frame.png"), "cap": CLIPS[0][1].caption}]
    (tmp_path / "same.json").write_text(json.dumps(entries))
    report = extract_features(str(tmp_path / "same.json"), preset=PRESET, output_dir=str(tmp_path / "f"),
                              num_frames=9, progress=False, components=components)
    assert report.ok and len(report.extracted) == 2
    features = FeatureSet(str(tmp_path / "f"))
    assert torch.equal(features[0]["prompt_embeds"], features[1]["prompt_embeds"])
