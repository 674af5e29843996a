"""The fine-tuning gate on hyv-tiny: clips of a colour it never saw, a LoRA trained on them, held-out captions read."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from ..base.errors import HyvInputError
from ..pipeline.video_io import read_mp4, write_mp4
from ..runtimes.vae import to_uint8_frames
from . import data
from .quality import read_video

#: The colour hyv-tiny never saw. Cyan is not usable: the shipped VAE decodes it as blue (:mod:`hyv_lib.tiny.data`).
NEW_COLOR = NEW_WORD = "orange"
#: The backgrounds of the new-colour clips: the shipped VAE decodes orange on gray as a dull red (chapter 9).
NEW_BACKGROUNDS = ("black", "purple")
#: The reader's palette: the training colours and the new one (a known colour drifting to orange reads as a miss).
PALETTE = {**data.COLORS, NEW_COLOR: data.UNSEEN_COLORS[NEW_COLOR]}
#: All 24 new-colour captions (3 shapes x 4 directions x 2 backgrounds), shape-major.
NEW = [data.Combo(NEW_COLOR, s, d, b) for s in data.SHAPES for d in data.DIRECTIONS for b in NEW_BACKGROUNDS]
#: 8 held-out captions (every third): each shape, direction and background also occurs in training.
HELD_OUT = NEW[0::3]
TRAIN = [c for c in NEW if c not in HELD_OUT]  #: the other 16
_TRAIN_KNOWN, _HELD_OUT_KNOWN = data.split_combos()
#: 16 known-colour captions of hyv-tiny's training set: one clip each for prior preservation.
PRIOR = _TRAIN_KNOWN[::8][:16]
#: 8 known-colour captions hyv-tiny never trained on: does the LoRA keep their colours?
KNOWN_PROBE = _HELD_OUT_KNOWN[::5][:8]


def twins(combos: list[data.Combo], attribute: str, values: tuple[str, ...]) -> list[data.Combo]:
    """One known twin per caption of ``combos``: the same caption with its ``attribute`` (``color``, ``direction``)
    set to the first of ``values`` (turned by one per caption) that makes a caption of hyv-tiny's training set (the
    next one where a choice is held out of it)."""
    known = set(_TRAIN_KNOWN)
    out = []
    for i, combo in enumerate(combos):
        turned = values[i % len(values):] + values[:i % len(values)]
        out.append(next(t for t in (dataclasses.replace(combo, **{attribute: v}) for v in turned) if t in known))
    return out


_ISSUE = [c for i, c in enumerate(TRAIN) if i % 4 != 3]
#: The known-colour twins of the 12 ``issue`` captions (:func:`twins`, red, green, blue, yellow taking turns).
TWINS = twins(_ISSUE, "color", ("red", "green", "blue", "yellow"))
#: The datasets (lists of (caption, render index)): ``issue``, the first-hour user's: 12 clips of the new colour, one per
#: training caption (12 of the 16, every fourth left out), nothing else; ``chapter9``: chapter 9's 48, two renders of
#: each of the 16 training captions and one clip of each prior caption, in the order its rates were measured with;
#: ``twins``: the 12 and one clip of each of their :data:`TWINS`.
DATASETS = {
    "issue": [(c, 0) for c in _ISSUE],
    "chapter9": [(c, 0) for c in TRAIN] + [(c, 0) for c in PRIOR] + [(c, 1) for c in TRAIN],
    "twins": [(c, 0) for c in _ISSUE] + [(c, 0) for c in TWINS],
}
#: Chapter 9's recipe, the fine-tuning gate's (``train`` flags beside ``--features``, ``--preset``, ``--seed`` and
#: ``--output_dir``): rank 16, 500 steps of 8 clips at 5e-3, 20 warmup steps, the attention projections adapted at
#: a constant rate, no prior captions, caption-dropped clips trained on their data (as it was measured).
GATE_TRAIN_ARGS = ("--lora_rank", "16", "--steps", "500", "--learning_rate", "5e-3", "--batch_size", "8",
                   "--warmup_steps", "20", "--lora_targets", "attn", "--lr_schedule", "constant",
                   "--prior_weight", "0", "--dropout_target", "data", "--no_gradient_checkpointing")
#: The first-hour user's command, ``train --lora_rank 8 --steps 500``, as it ran before hyv-tiny had training
#: defaults of its own (``Preset.train_defaults``): the official trainer's, spelled out (1e-4, batches of 1, the
#: attention projections, a constant rate, no prior captions, caption-dropped clips on their data), so that a rerun
#: measures what the recorded runs measured.
ISSUE_TRAIN_ARGS = ("--lora_rank", "8", "--steps", "500", "--learning_rate", "1e-4", "--batch_size", "1",
                    "--lora_targets", "attn", "--lr_schedule", "constant", "--prior_weight", "0",
                    "--dropout_target", "data", "--no_gradient_checkpointing")
PROBE_SEED = 7  #: the first probe video's seed; the i-th caption gets PROBE_SEED + i
PROBE_STEPS = 10  #: denoising steps of the probe videos (the preset's 20 read the same here, at twice the time)


def caption(combo: data.Combo, word: str = NEW_COLOR) -> str:
    """The combo's caption, the new colour named ``word`` (the control of the sweep: "cyan", a word hyv-tiny's
    tokenizer has one token for, where "orange" is spelt in five pieces)."""
    return combo.caption.replace(NEW_COLOR, word) if combo.color == NEW_COLOR else combo.caption


def write_clips(folder: str, datasets: dict, dataset: str, caption_of, fps: int = 8) -> str:
    """Render ``datasets[dataset]``'s clips (lists of (combo, render index); clip i seeded 1000 + i), write them as mp4
    files in ``folder/videos`` and a MindSpeed-MM ``data.json`` beside them, clip i captioned ``caption_of(combo)``;
    returns its path. Shared by the colour and motion gates."""
    if dataset not in datasets:
        raise HyvInputError("dataset", f"must be one of {', '.join(datasets)}, got {dataset!r}")
    os.makedirs(os.path.join(folder, "videos"), exist_ok=True)
    entries = []
    for i, (combo, _) in enumerate(datasets[dataset]):
        name = f"videos/{i:03d}.mp4"
        write_mp4(to_uint8_frames(data.render_clip(combo, seed=1000 + i)), os.path.join(folder, name), fps=fps)
        entries.append({"path": name, "cap": caption_of(combo), "num_frames": data.FRAMES, "fps": fps,
                        "resolution": {"height": data.HEIGHT, "width": data.WIDTH}})
    path = os.path.join(folder, "data.json")
    with open(path, "w") as f:
        json.dump(entries, f, indent=1)
    return path


def write_dataset(folder: str, dataset: str = "chapter9", fps: int = 8, word: str = NEW_COLOR) -> str:
    """:func:`write_clips` of :data:`DATASETS`' ``dataset``, the new colour named ``word``; returns the data.json's
    path."""
    return write_clips(folder, DATASETS, dataset, lambda combo: caption(combo, word), fps)


def read_colors(videos) -> list[str | None]:
    """Each video's foreground colour (:func:`hyv_lib.tiny.quality.read_video` with :data:`PALETTE`; None: no shape)."""
    return [read_video(v, colors=PALETTE).color for v in videos]


def probe(pipeline, combos: list[data.Combo] | None = None, steps: int = PROBE_STEPS,
          word: str = NEW_COLOR) -> list[str | None]:
    """The colours ``pipeline`` draws for ``combos`` (default :data:`HELD_OUT` then :data:`KNOWN_PROBE`), caption i
    at seed PROBE_SEED + i, ``steps`` denoising steps (the CLI's ``generate --prompts_file ... --seed 7`` makes the
    same videos); the new colour named ``word``."""
    combos = HELD_OUT + KNOWN_PROBE if combos is None else combos
    return read_colors(pipeline.generate(caption(c, word), seed=PROBE_SEED + i, num_inference_steps=steps,
                                         progress=False).frames for i, c in enumerate(combos))


def score(reads: list[str | None], combos: list[data.Combo] | None = None) -> dict[str, Any]:
    """How many of the new-colour captions came out in the new colour (``new`` of ``new_total``) and how many of the
    known-colour captions in their own colour (``known`` of ``known_total``), with the reads."""
    return score_attribute(reads, HELD_OUT + KNOWN_PROBE if combos is None else combos, "color", NEW_COLOR)


def score_attribute(reads: list, combos: list[data.Combo], attribute: str, new_value: str) -> dict[str, Any]:
    """A gate's score: each read against its caption's ``attribute`` (``color``, ``direction``), counted apart for
    the captions whose attribute is ``new_value`` (``new`` of ``new_total``) and the others (``known``)."""
    if len(reads) != len(combos):
        raise ValueError(f"{len(reads)} reads for {len(combos)} captions")
    right = [(r == getattr(c, attribute), getattr(c, attribute) == new_value) for r, c in zip(reads, combos)]
    new = [ok for ok, is_new in right if is_new]
    known = [ok for ok, is_new in right if not is_new]
    return {"new": sum(new), "new_total": len(new), "known": sum(known), "known_total": len(known),
            "reads": list(reads)}


def cli_gate(folder: str, run, *, seed: int = 0, train_args=GATE_TRAIN_ARGS, dataset: str = "chapter9",
             known: int = len(KNOWN_PROBE), before: bool = True, preset: str = "tiny_trained") -> dict[str, Any]:
    """The recipe through the command line in ``folder``: ``dataset``'s clips and data.json, ``extract_features``,
    ``train`` (``train_args`` and ``--seed seed``), then ``generate --prompts_file`` of :data:`HELD_OUT` and the first
    ``known`` of :data:`KNOWN_PROBE` (seeds 7, 8, ..., :data:`PROBE_STEPS` steps) without (``before``) and with
    ``--lora``, each mp4 read with :func:`read_colors`. ``run``: the command line's entry function
    (:func:`hyv_lib.cli.commands.run`, passed in: the CLI sits above this package). Returns ``{"before": score,
    "after": score, "lora": the LoRA folder}`` (:func:`score`; "before" None when not probed)."""
    return run_gate(folder, run, write_dataset(folder, dataset), HELD_OUT + KNOWN_PROBE[:known], read_colors, score,
                    seed=seed, train_args=train_args, before=before, preset=preset)


def run_gate(folder: str, run, data_json: str, combos: list[data.Combo], read, score_reads, *, seed: int,
             train_args, before: bool, preset: str) -> dict[str, Any]:
    """A gate through the command line in ``folder`` (:func:`cli_gate`; the motion gate's too): ``extract_features``
    of ``data_json``, ``train``, ``generate --prompts_file`` of ``combos``' captions before (``before``) and after
    ``--lora``; ``read`` (videos -> reads) and ``score_reads`` (reads, combos -> score) score each."""
    features = os.path.join(folder, "features")
    if run(["extract_features", "--data_json", data_json, "--preset", preset, "--output_dir", features,
            "--quiet"]) != 0:
        raise RuntimeError("extract_features failed")
    lora = os.path.join(folder, "lora")
    if run(["train", "--features", features, "--preset", preset, *train_args, "--seed", str(seed), "--output_dir",
            lora, "--quiet"]) != 0:
        raise RuntimeError("train failed")
    prompts = os.path.join(folder, "probe.txt")
    with open(prompts, "w") as f:
        f.writelines(c.caption + "\n" for c in combos)

    def probe_cli(name: str, extra: list[str]) -> dict[str, Any]:
        out = os.path.join(folder, name)
        if run(["generate", "--preset", preset, "--prompts_file", prompts, "--output_dir", out, "--seed",
                str(PROBE_SEED), "--num_inference_steps", str(PROBE_STEPS), "--quiet", *extra]) != 0:
            raise RuntimeError(f"generate ({name}) failed")
        videos = (read_mp4(os.path.join(out, f"{i:04d}", "output_video.mp4"))[0] for i in range(len(combos)))
        return score_reads(read(videos), combos)

    return {"before": probe_cli("before", []) if before else None, "after": probe_cli("after", ["--lora", lora]),
            "lora": lora}
