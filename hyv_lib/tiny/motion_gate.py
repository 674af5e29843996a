"""The motion fine-tuning gate on hyv-tiny: clips of a direction it never saw, a LoRA, held-out captions' paths read."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import data
from . import finetune_gate
from .finetune_gate import ISSUE_TRAIN_ARGS, PROBE_SEED, PROBE_STEPS, run_gate, score_attribute
from .quality import MIN_MOTION_PX, centroid_track

#: The direction hyv-tiny never saw (:data:`hyv_lib.tiny.data.UNSEEN_DIRECTIONS`): a diagonal, drawn by the VAE as
#: well as any position of the four known paths. Its word, "up-right", is four tokens to hyv-tiny's word tokenizer
#: (up, -, ri, ght): "up" is a known word, the rest sub-word pieces it never read.
NEW_DIRECTION = NEW_WORD = "up-right"
#: The eight compass directions the reader tells apart, as angles in degrees (counterclockwise from right, y up):
#: the four known, the new one and three other diagonals (a path drifting to one of those reads as a miss).
COMPASS = {"right": 0, "up-right": 45, "up": 90, "up-left": 135, "left": 180, "down-left": 225, "down": 270,
           "down-right": 315}
#: The colours of the training clips; white only in known-direction captions.
TRAIN_COLORS = ("red", "green", "blue", "yellow")
#: The 12 training captions of the first-hour recipe: 3 shapes x 4 colours moving up-right, the background turning
#: over all three (each shape and each colour on each background at least once across the set).
TRAIN = [data.Combo(c, s, NEW_DIRECTION, tuple(data.BACKGROUNDS)[(i + j) % 3])
         for j, c in enumerate(TRAIN_COLORS) for i, s in enumerate(data.SHAPES)]
#: 8 held-out captions, two shapes of each training colour on the background after its training one: every
#: shape, colour and background seen in training, never together (shapes 3, 3, 2 times; backgrounds 2, 3, 3).
HELD_OUT = [data.Combo(c, s, NEW_DIRECTION, tuple(data.BACKGROUNDS)[(i + j + 1) % 3])
            for j, c in enumerate(TRAIN_COLORS) for i, s in enumerate(data.SHAPES) if i != (j + 2) % 3]
_TRAINED_ON = data.split_combos()[0]  # hyv-tiny's training captions
#: 8 known-direction captions of hyv-tiny's training set, two per direction, for prior preservation (``prior``).
PRIOR = [c for d in data.DIRECTIONS for c in [k for k in _TRAINED_ON if k.direction == d][::11][:2]]


#: The known-direction twins of the 12 training captions (:func:`hyv_lib.tiny.finetune_gate.twins`; up, right, left,
#: down taking turns: 2 up, 4 right, 4 left, 2 down where a first choice is held out of hyv-tiny's training set):
#: each differs from its up-right caption in the direction word only, so the contrast says which words carry the
#: new motion.
TWINS = finetune_gate.twins(TRAIN, "direction", ("up", "right", "left", "down"))
#: The datasets (lists of (caption, render index)): ``issue``, the first-hour user's 12 clips, one per training
#: caption, nothing else; ``prior``: those 12 and one clip of each :data:`PRIOR` caption; ``prior4``: the 12 and
#: one clip of every other :data:`PRIOR` caption (one per direction); ``twins``: the 12 and one clip of each of
#: their :data:`TWINS`.
DATASETS = {"issue": [(c, 0) for c in TRAIN], "prior": [(c, 0) for c in TRAIN] + [(c, 0) for c in PRIOR],
            "prior4": [(c, 0) for c in TRAIN] + [(c, 0) for c in PRIOR[::2]],
            "twins": [(c, 0) for c in TRAIN] + [(c, 0) for c in TWINS]}
#: The words ``prior_clips --known`` puts in place of the new direction for the model's own twins (taking turns).
PRIOR_KNOWN = "up,right,left,down"
#: The recipe that teaches the new direction on the ``twins`` data (6 or more of 8 up-right and of 8 known kept for
#: each of training seeds 0-7 in the sweep): the caption's path only (``--lora_targets text``), batches of 8 at
#: 3e-3, a cosine decay to zero over 1,000 steps, no prior captions (the twins keep the known directions), and
#: caption-dropped clips trained on their data (as it was measured).
TAUGHT_TRAIN_ARGS = ("--lora_rank", "8", "--steps", "1000", "--learning_rate", "3e-3", "--batch_size", "8",
                     "--lora_targets", "text", "--lr_schedule", "cosine", "--prior_weight", "0",
                     "--dropout_target", "data", "--no_gradient_checkpointing")
#: The first-hour user's command with hyv-tiny's defaults (``Preset.train_defaults``: the settings of
#: :data:`TAUGHT_TRAIN_ARGS`, its prior captions, which ``extract_features`` encodes and ``train`` keeps, and
#: ``--dropout_target frozen``) on the 12
#: clips alone: 1,000 steps.
DEFAULT_TRAIN_ARGS = ("--lora_rank", "8", "--steps", "1000", "--no_gradient_checkpointing")
#: ``KNOWN_PROBE`` (:mod:`hyv_lib.tiny.finetune_gate`'s 8 known captions hyv-tiny never trained on): here the reader
#: asks whether each still moves in its own direction after the LoRA.
KNOWN_PROBE = finetune_gate.KNOWN_PROBE


def caption(combo: data.Combo, word: str = NEW_DIRECTION) -> str:
    """The combo's caption, the new direction named ``word``."""
    if combo.direction != NEW_DIRECTION:
        return combo.caption
    return combo.caption.replace(f" moving {NEW_DIRECTION} ", f" moving {word} ")


def write_dataset(folder: str, dataset: str = "issue", fps: int = 8, word: str = NEW_DIRECTION) -> str:
    """:func:`hyv_lib.tiny.finetune_gate.write_clips` of :data:`DATASETS`' ``dataset``, the new direction named
    ``word``; returns the data.json's path."""
    return finetune_gate.write_clips(folder, DATASETS, dataset, lambda combo: caption(combo, word), fps)


def read_direction(video) -> str | None:
    """The compass direction (:data:`COMPASS`) of the shape's path: its centroid (:func:`hyv_lib.tiny.quality.
    centroid_track`) from the first to the last frame that shows it, the nearest of the eight angles; None when no
    frame or one shows a shape, or it travels under :data:`hyv_lib.tiny.quality.MIN_MOTION_PX` pixels. ``video``:
    frames [F, H, W, 3], uint8 or floats in [0, 1]."""
    track = centroid_track(video)
    track = track[~np.isnan(track[:, 0])]
    if len(track) < 2:
        return None
    dx, dy = track[-1] - track[0]
    if math.hypot(dx, dy) < MIN_MOTION_PX:
        return None
    angle = math.degrees(math.atan2(-dy, dx))  # y grows downwards in the frame
    return min(COMPASS, key=lambda name: abs((angle - COMPASS[name] + 180) % 360 - 180))


def read_directions(videos) -> list[str | None]:
    """:func:`read_direction` of each video."""
    return [read_direction(v) for v in videos]


def probe(pipeline, combos: list[data.Combo] | None = None, steps: int = PROBE_STEPS,
          word: str = NEW_DIRECTION) -> list[str | None]:
    """The directions ``pipeline`` draws for ``combos`` (default :data:`HELD_OUT` then :data:`KNOWN_PROBE`),
    caption i at seed PROBE_SEED + i, ``steps`` denoising steps (what ``generate --prompts_file ... --seed 7`` makes);
    the new direction named ``word``."""
    combos = HELD_OUT + KNOWN_PROBE if combos is None else combos
    return read_directions(pipeline.generate(caption(c, word), seed=PROBE_SEED + i, num_inference_steps=steps,
                                             progress=False).frames for i, c in enumerate(combos))


def score(reads: list[str | None], combos: list[data.Combo] | None = None) -> dict[str, Any]:
    """How many of the new-direction captions moved up-right (``new`` of ``new_total``) and how many of the
    known-direction captions moved their own way (``known`` of ``known_total``), with the reads."""
    return score_attribute(reads, HELD_OUT + KNOWN_PROBE if combos is None else combos, "direction", NEW_DIRECTION)


def cli_gate(folder: str, run, *, seed: int = 0, train_args=ISSUE_TRAIN_ARGS, dataset: str = "issue",
             known: int = len(KNOWN_PROBE), before: bool = True, preset: str = "tiny_trained") -> dict[str, Any]:
    """The recipe through the command line in ``folder`` (:func:`hyv_lib.tiny.finetune_gate.run_gate`): ``dataset``'s
    clips and data.json, ``extract_features``, ``train`` (``train_args``, default the first-hour user's ``--lora_rank
    8 --steps 500``, and ``--seed seed``), ``generate --prompts_file`` of :data:`HELD_OUT` and the first ``known`` of
    :data:`KNOWN_PROBE` without (``before``) and with ``--lora``, each mp4 read with :func:`read_directions`.
    ``run``: :func:`hyv_lib.cli.commands.run`. Returns ``{"before": score, "after": score, "lora": folder}``."""
    return run_gate(folder, run, write_dataset(folder, dataset), HELD_OUT + KNOWN_PROBE[:known], read_directions,
                    score, seed=seed, train_args=train_args, before=before, preset=preset)
