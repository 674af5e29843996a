"""Issue 33's fine-tuning gate: a LoRA trained through the CLI (extract_features -> train --lora_rank 16 ->
generate --lora) on hyv-tiny clips of a colour it never saw, orange, makes it draw orange for held-out captions,
and the known colours survive. Rates are read from the generated mp4s with hyv_lib.tiny.quality.read_video, the
reader of hyv-tiny's own gates, with orange added to its palette: a known colour that drifts to orange is a miss.

The data, recipe and probe are chapter 9's (hyv_lib.tiny.finetune_gate: DATASETS["chapter9"], GATE_TRAIN_ARGS,
cli_gate): orange clips on the black and purple backgrounds only (the shipped VAE draws orange on gray as a dull red),
16 captions for training, 2 clips each, plus 16 clips of known-colour training captions (prior preservation); 8 other
orange captions held out, and the first 4 of the 8 known-colour probe captions. This test runs training seed 0.
benchmarks/finetune_gate.py runs the same gate for seeds 0-3 (benchmarks/results/finetune_gate_2026-11-27_cpu.json):
8/8, 3/8, 3/8, 4/8 held-out orange after the LoRA (0/8 before). Issue 45's criterion, at least 6/8 for every seed,
is not met by that recipe nor by any of the recipes tools/finetune_sweep.py tried
(benchmarks/results/finetune_sweep_2026-11-27.json), so the thresholds stay below the lowest seed's; a LoRA that
changes nothing fails the first."""

import json

import pytest

from hyv_lib.cli.commands import run
from hyv_lib.tiny import finetune_gate

KNOWN = 4  # known-colour probe captions (of finetune_gate.KNOWN_PROBE): 3 of these 4 are right before the LoRA
SEED = 0
pytestmark = pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")  # ffmpeg readers started after JAX loaded
# Gates (see the module docstring for the measured rates).
MAX_ORANGE_BEFORE = 1 / 8
MIN_ORANGE_AFTER = 0.25
MIN_KNOWN_AFTER = 0.5


def run_gate(folder, seed: int = SEED) -> dict:
    """The whole recipe through the CLI in ``folder``: data.json -> features -> LoRA -> probes before and after, as
    fractions right (``orange`` of the held-out orange captions, ``known`` of the known-colour ones)."""
    result = finetune_gate.cli_gate(str(folder), run, seed=seed, known=KNOWN)  # torch's own thread count
    rates = {name: {"orange": r["new"] / r["new_total"], "known": r["known"] / r["known_total"], "reads": r["reads"]}
             for name, r in (("before", result["before"]), ("after", result["after"]))}
    return {**rates, "lora": folder / "lora"}


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


def test_the_gate_data_holds_out_its_probe_captions_and_covers_every_value():
    from hyv_lib.tiny import data

    for name, clips in finetune_gate.DATASETS.items():
        captions = {c.caption for c, _ in clips}
        assert not captions & {c.caption for c in finetune_gate.HELD_OUT + finetune_gate.KNOWN_PROBE}, name
        new = [c for c, _ in clips if c.color == "orange"]
        assert {c.shape for c in new} == set(data.SHAPES) and {c.direction for c in new} == set(data.DIRECTIONS)
        assert {c.background for c in new} == {"black", "purple"}  # the VAE draws orange on gray as red
    assert len(finetune_gate.DATASETS["issue"]) == 12 and len(finetune_gate.DATASETS["chapter9"]) == 48
    assert len(finetune_gate.HELD_OUT) == 8 and {c.color for c in finetune_gate.HELD_OUT} == {"orange"}


def test_score_counts_the_new_colour_and_the_known_ones_apart():
    combos = finetune_gate.HELD_OUT[:2] + finetune_gate.KNOWN_PROBE[:3]
    reads = ["orange", "red", combos[2].color, "orange", None]
    s = finetune_gate.score(reads, combos)
    assert (s["new"], s["new_total"], s["known"], s["known_total"]) == (1, 2, 1, 3)
    assert finetune_gate.caption(combos[0], "cyan") == combos[0].caption.replace("orange", "cyan")
    assert finetune_gate.caption(combos[2], "cyan") == combos[2].caption
    with pytest.raises(ValueError):
        finetune_gate.score(reads[:2], combos)
