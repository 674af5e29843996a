"""The motion gate (hyv_lib.tiny.motion_gate): the unseen direction's clips, the direction reader, the split, the score."""

import hashlib

import numpy as np
import pytest

from hyv_lib.runtimes.vae import to_uint8_frames
from hyv_lib.tiny import data
from hyv_lib.tiny import motion_gate as gate


def _hand_made(path, color="red", shape="circle", background="gray"):
    """uint8 frames [F, H, W, 3]: draw_frame's shape at each (x, y) of ``path``."""
    return np.stack([np.asarray(data.draw_frame(color, shape, background, center=p)) for p in path])


# sha256 of render_clip's bytes, computed before UNSEEN_DIRECTIONS was added: hyv-tiny trained on these clips.
BEFORE = {
    (data.Combo("red", "circle", "left", "black"), 0):
        "89526973ce2a7c8d79d87a5d9ea3f6d46f6a7d40edf0d441cd0db5f54a9ee1dd",
    (data.Combo("blue", "triangle", "down", "purple"), 1234):
        "e1557685ca5f886692ba8bc8d2d399aa9b97051aee835fbdec8434d580b682f3",
    (data.Combo("white", "square", "up", "gray"), 7):
        "039f3ae6bb151962354dce6c1d7bf39ef5986c26e6029c96f6b15c31abee7068",
}


def test_the_new_direction_leaves_the_known_clips_and_split_unchanged():
    for (combo, seed), digest in BEFORE.items():
        assert hashlib.sha256(data.render_clip(combo, seed).tobytes()).hexdigest() == digest
    assert len(data.all_combos()) == 180 and not set(data.UNSEEN_DIRECTIONS) & set(data.DIRECTIONS)


def test_the_reader_reads_hand_made_paths():
    x, y = 56.0, 32.0
    for name, angle in gate.COMPASS.items():  # 14 px along each compass direction, in 9 frames
        ux, uy = np.cos(np.radians(angle)), -np.sin(np.radians(angle))
        assert gate.read_direction(_hand_made([(x + 14 * ux * t / 8, y + 14 * uy * t / 8) for t in range(9)])) == name
    assert gate.read_direction(_hand_made([(x, y)] * 9)) is None  # still
    assert gate.read_direction(_hand_made([(x + 0.2 * t, y) for t in range(9)])) is None  # under MIN_MOTION_PX
    assert gate.read_direction(np.zeros((9, 64, 112, 3), np.uint8)) is None  # no shape


@pytest.mark.parametrize("direction", [*data.DIRECTIONS, *data.UNSEEN_DIRECTIONS])
def test_rendered_clips_read_back_as_their_direction(direction):
    for i, (color, shape, background) in enumerate([("red", "circle", "black"), ("white", "triangle", "gray"),
                                                    ("blue", "square", "purple")]):
        clip = data.render_clip(data.Combo(color, shape, direction, background), seed=i)
        assert gate.read_direction(to_uint8_frames(clip).numpy()) == direction


def test_the_diagonal_moves_at_the_known_speed_along_its_unit_vector():
    clip = data.render_clip(data.Combo("white", "circle", "up-right", "black"), seed=3)
    mask = clip.mean(axis=0) > 0  # white on black: the shape's half-covered pixels and above
    ys, xs = np.mgrid[0:data.HEIGHT, 0:data.WIDTH]
    track = np.array([(xs[m].mean(), ys[m].mean()) for m in mask])
    dx, dy = track[-1] - track[0]
    assert dx == pytest.approx(-dy, abs=0.1)  # 45 degrees, up the frame
    lo, hi = (s * data.HEIGHT * (data.FRAMES - 1) for s in data.SPEED)
    assert lo - 0.1 <= np.hypot(dx, dy) <= hi + 0.1


def test_split_and_score():
    assert len(gate.TRAIN) == 12 and len(gate.HELD_OUT) == 8 and not set(gate.TRAIN) & set(gate.HELD_OUT)
    assert len(gate.DATASETS["issue"]) == 12 and {c.direction for c in gate.TRAIN + gate.HELD_OUT} == {"up-right"}
    for combo in gate.HELD_OUT:  # made of parts seen in training
        assert any(t.color == combo.color for t in gate.TRAIN) and any(t.shape == combo.shape for t in gate.TRAIN)
        assert any(t.background == combo.background for t in gate.TRAIN)
    assert all(c.direction in data.DIRECTIONS for c in gate.KNOWN_PROBE) and len(gate.KNOWN_PROBE) == 8
    # prior preservation: two captions per known direction, from hyv-tiny's own training set, none a probe caption
    assert sorted(c.direction for c in gate.PRIOR) == sorted(list(data.DIRECTIONS) * 2)
    assert set(gate.PRIOR) <= set(data.split_combos()[0]) and not set(gate.PRIOR) & set(gate.KNOWN_PROBE)
    assert [c for c, _ in gate.DATASETS["prior"][12:]] == gate.PRIOR and len(gate.DATASETS["prior4"]) == 16
    assert {c.direction for c, _ in gate.DATASETS["prior4"][12:]} == set(data.DIRECTIONS)
    # twins: each training caption again with a known direction instead, a caption hyv-tiny trained on, no probe
    assert [c for c, _ in gate.DATASETS["twins"]] == gate.TRAIN + gate.TWINS
    for new, twin in zip(gate.TRAIN, gate.TWINS):
        assert (twin.color, twin.shape, twin.background) == (new.color, new.shape, new.background)
    assert sorted(c.direction for c in gate.TWINS) == ["down"] * 2 + ["left"] * 4 + ["right"] * 4 + ["up"] * 2
    assert set(gate.TWINS) <= set(data.split_combos()[0]) and not set(gate.TWINS) & set(gate.KNOWN_PROBE)
    assert gate.TWINS[0] == data.Combo("red", "circle", "up", "black")  # the first of up, right, left, down it knows
    assert data.parse_caption(gate.HELD_OUT[0].caption) == gate.HELD_OUT[0]
    assert gate.caption(gate.HELD_OUT[0], "diagonally").split()[4] == "diagonally"
    combos = [gate.HELD_OUT[0], gate.HELD_OUT[1], gate.KNOWN_PROBE[0], gate.KNOWN_PROBE[1]]
    reads = ["up-right", "up", gate.KNOWN_PROBE[0].direction, "up-right"]
    got = gate.score(reads, combos)
    assert (got["new"], got["new_total"], got["known"], got["known_total"]) == (1, 2, 1, 2)


# The first-hour user's command with hyv-tiny's own training defaults, through the command line: the 12 up-right
# clips alone (no twins), extract_features (which encodes hyv-tiny's 32 prior captions) and `train --lora_rank 8
# --steps 1000`. Measured for training seeds 0-3 through the command line (benchmarks/finetune_gate.py --gate motion
# --recipe defaults, benchmarks/results/finetune_cli_motion_2026-12-02_dropout_cpu.json, with --dropout_target frozen
# among the defaults: all four met it); this is seed 0 (6 up-right, 7 known there). The criterion is the goal itself.
MIN_UP_RIGHT, MIN_KNOWN = 6, 6
MAX_UP_RIGHT_BEFORE = 1  # of 8: hyv-tiny draws one held-out caption up-right by chance


@pytest.fixture(scope="module")
def taught(tmp_path_factory):
    from hyv_lib.cli.commands import run

    # torch's own thread count: on 2 cores seed 0 gave 6 up-right and 7 known in 227 s, as at 1 thread (the
    # recorded run) in about 300 s
    folder = tmp_path_factory.mktemp("motion_taught")
    return gate.cli_gate(str(folder), run, seed=0, dataset="issue", train_args=gate.DEFAULT_TRAIN_ARGS)


@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")  # ffmpeg readers started after JAX loaded
def test_hyv_tinys_defaults_teach_the_new_direction_and_keep_the_known_ones(taught):
    before, after = taught["before"], taught["after"]
    held = (before["new"] <= MAX_UP_RIGHT_BEFORE, after["new"] >= MIN_UP_RIGHT, after["known"] >= MIN_KNOWN)
    assert all(held), (f"(up-right before <= {MAX_UP_RIGHT_BEFORE}, up-right after >= {MIN_UP_RIGHT}, known after >= "
                       f"{MIN_KNOWN}) = {held}: before {before}, after {after}")


def test_the_defaults_are_the_taught_recipe_with_the_prior_captions(taught):
    from hyv_lib.training.checkpoint import checkpoint_path, read_info

    settings = read_info(checkpoint_path(taught["lora"]))["settings"]
    flags = dict(zip(gate.TAUGHT_TRAIN_ARGS[::2], gate.TAUGHT_TRAIN_ARGS[1::2]))
    assert settings["learning_rate"] == float(flags["--learning_rate"])
    assert settings["batch_size"] == int(flags["--batch_size"]) and settings["lr_schedule"] == flags["--lr_schedule"]
    assert settings["decay_steps"] == int(flags["--steps"]) == 1000
    assert settings["lora_targets"] == flags["--lora_targets"] == "text"
    assert settings["prior_weight"] == 1.0 and flags["--prior_weight"] == "0"  # the twins recipe keeps without them
    assert settings["dropout_target"] == "frozen" and flags["--dropout_target"] == "data"
