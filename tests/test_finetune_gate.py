"""Issue 33's fine-tuning gate: a LoRA trained through the CLI (extract_features -> train --lora_rank 16 ->
generate --lora) on hyv-tiny clips of a colour it never saw, orange, makes it draw orange for held-out captions,
and the known colours survive. Rates are read from the generated mp4s with hyv_lib.tiny.quality.read_video, the
reader of hyv-tiny's own gates, with orange added to its palette: a known colour that drifts to orange is a miss.

The data (chapter 9 runs the same recipe, bigger): orange clips on the black and purple backgrounds only (the shipped
VAE draws orange on gray as a dull red, which reads as red; chapter 9 measures it), 16 captions for training, 2 clips
each, plus 16 clips of known-colour training captions (prior preservation); 8 other orange captions held out. With
this file's settings, training seeds 0, 1, 2, 3 gave held-out orange rates of 8/8, 3/8, 3/8, 4/8 after the LoRA
(0/8 before) and kept all 4 known-colour captions (3/4 before); 300 steps instead of 500 gave 2/8 to 4/8. The
thresholds sit below the lowest; a LoRA that changes nothing fails the first."""

import json

import pytest
import torch

from hyv_lib.cli.commands import run
from hyv_lib.pipeline.video_io import read_mp4, write_mp4
from hyv_lib.runtimes.vae import to_uint8_frames
from hyv_lib.tiny import data, quality

PRESET = "tiny_trained"
FPS = 8  # tiny_trained's frame rate
ORANGE = [data.Combo("orange", s, d, b) for s in data.SHAPES for d in data.DIRECTIONS for b in ("black", "purple")]
HELD_OUT_ORANGE = ORANGE[0::3]  # 8 captions: every shape, direction and background also occurs in training
TRAIN_ORANGE = [c for c in ORANGE if c not in HELD_OUT_ORANGE]  # 16
TRAIN_KNOWN, HELD_OUT_KNOWN = data.split_combos()
PRIOR = TRAIN_KNOWN[::8][:16]  # known-colour training captions, one clip each
KNOWN_PROBE = HELD_OUT_KNOWN[::5][:4]
PALETTE = {**data.COLORS, "orange": data.UNSEEN_COLORS["orange"]}
TRAIN_ARGS = ["--lora_rank", "16", "--steps", "500", "--learning_rate", "5e-3", "--batch_size", "8",
              "--warmup_steps", "20", "--no_gradient_checkpointing"]
PROBE_STEPS = "10"  # denoising steps of the probe videos (the preset's 20 give the same reads here, at twice the time)
SEED = 0
pytestmark = pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")  # ffmpeg readers started after JAX loaded
# Gates (see the module docstring for the measured rates).
MAX_ORANGE_BEFORE = 1 / 8
MIN_ORANGE_AFTER = 0.25
MIN_KNOWN_AFTER = 0.5


def write_dataset(folder) -> str:
    """Render the training clips, write them as mp4 files and a MindSpeed-MM data.json beside them; returns its path.
    The second clip of each orange caption comes after the first 32 entries (the order the rates below were
    measured with; two clips of one caption in one shard once crashed extract_features, tests/test_features.py)."""
    clips = [(c, 0) for c in TRAIN_ORANGE] + [(c, 0) for c in PRIOR] + [(c, 1) for c in TRAIN_ORANGE]
    entries = []
    for i, (combo, copy) in enumerate(clips):
        name = f"videos/{i:03d}.mp4"
        (folder / "videos").mkdir(exist_ok=True)
        write_mp4(to_uint8_frames(data.render_clip(combo, seed=1000 + i)), str(folder / name), fps=FPS)
        entries.append({"path": name, "cap": combo.caption, "num_frames": data.FRAMES, "fps": FPS,
                        "resolution": {"height": data.HEIGHT, "width": data.WIDTH}})
    (folder / "data.json").write_text(json.dumps(entries, indent=1))
    return str(folder / "data.json")


def probe(folder, name: str, lora: str | None = None) -> dict[str, float]:
    """Generate the held-out orange and known-colour captions (one prompts file, seeds 7, 8, ...) and read each
    video's colour: the fraction right in each group."""
    combos = HELD_OUT_ORANGE + KNOWN_PROBE
    prompts = folder / "probe.txt"
    prompts.write_text("".join(c.caption + "\n" for c in combos))
    out = folder / name
    args = ["generate", "--preset", PRESET, "--prompts_file", str(prompts), "--output_dir", str(out), "--seed", "7",
            "--num_inference_steps", PROBE_STEPS, "--quiet"]
    assert run(args + (["--lora", lora] if lora else [])) == 0
    reads = [quality.read_video(read_mp4(str(out / f"{i:04d}" / "output_video.mp4"))[0], colors=PALETTE).color
             for i in range(len(combos))]
    right = [r == c.color for r, c in zip(reads, combos)]
    n = len(HELD_OUT_ORANGE)
    return {"orange": sum(right[:n]) / n, "known": sum(right[n:]) / len(KNOWN_PROBE), "reads": reads}


def run_gate(folder, seed: int = SEED) -> dict:
    """The whole recipe through the CLI in ``folder``: data.json -> features -> LoRA -> probes before and after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: one thread is steadier on a shared 2-core CPU
    try:
        data_json = write_dataset(folder)
        assert run(["extract_features", "--data_json", data_json, "--preset", PRESET,
                    "--output_dir", str(folder / "features"), "--quiet"]) == 0
        lora = folder / "lora"
        assert run(["train", "--features", str(folder / "features"), "--preset", PRESET, *TRAIN_ARGS,
                    "--seed", str(seed), "--output_dir", str(lora), "--quiet"]) == 0
        return {"before": probe(folder, "before"), "after": probe(folder, "after", str(lora)), "lora": lora}
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def gate(tmp_path_factory):
    return run_gate(tmp_path_factory.mktemp("finetune_gate"))


def test_lora_teaches_an_unseen_colour(gate):
    before, after = gate["before"], gate["after"]
    assert before["orange"] <= MAX_ORANGE_BEFORE, f"hyv-tiny drew orange before any LoRA: {before}"
    assert after["orange"] >= MIN_ORANGE_AFTER, f"the LoRA did not teach orange: before {before}, after {after}"
    assert after["known"] >= MIN_KNOWN_AFTER, f"the known colours collapsed: before {before}, after {after}"


def test_the_lora_is_a_diffusers_file_the_log_records_every_step(gate):
    lora = gate["lora"]
    assert (lora / "pytorch_lora_weights.safetensors").is_file()
    log = [json.loads(line) for line in (lora / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == list(range(1, 501))
    config = json.loads((gate["lora"].parent / "after" / "0000" / "generation_config.json").read_text())
    assert config["lora_scale"] == 1.0 and config["lora_rank"] == 16
