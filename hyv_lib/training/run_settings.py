"""A fine-tuning run's settings: the defaults (the official trainer's, or the preset's own), their checks, and the
record a resumed run must match."""

from __future__ import annotations

import logging

from dataclasses import dataclass
from typing import Any

from ..base.checks import as_number
from ..base.errors import HyvInputError
from ..base.presets import Preset
from ..models.flow_matching import SAMPLINGS, TRAIN_TIMESTEP_SHIFT
from ..models.lora import DEFAULT_LORA_TARGETS
from ..runtimes.names import runtime_choices
from ..runtimes.torch_train import LR_SCHEDULES, lr_schedule

logger = logging.getLogger(__name__)
TASKS = ("t2v", "i2v")
#: The train steps' runtimes (``--runtime``; ``tpu`` is accepted for ``jax``).
RUNTIMES = ("torch", "jax")
#: Defaults: the official trainer's shift and logit-normal sampling (:mod:`hyv_lib.models.flow_matching`), its
#: weight decay, betas and eps; caption dropout 0.1 (the empty prompt's embeddings, what CFG's negative half sees);
#: a constant learning rate after the warmup (``cosine`` and ``linear`` decay it to zero at the last step); no prior
#: captions (``extract_features --prior_captions``), and weight 1 for those a features folder holds; a caption-dropped
#: clip trained towards its own data.
DEFAULTS = dict(learning_rate=1e-4, batch_size=1, caption_dropout=0.1, warmup_steps=50, weight_decay=0.01,
                shift=TRAIN_TIMESTEP_SHIFT, sampling="logit_normal", seed=0, lr_schedule="constant",
                prior_captions=(), prior_weight=1.0, dropout_target="data")
#: ``dropout_target``: what a caption-dropped clip trains towards (:func:`hyv_lib.training.loop.train`): its data
#: velocity, or the frozen model's prediction for the empty prompt.
DROPOUT_TARGETS = ("data", "frozen")


@dataclass(frozen=True)
class RunSettings:
    """What decides a run's curve: a rerun in the same folder resumes only with the same settings (``steps`` may
    grow at a constant rate: a finished run trained further continues from its checkpoint; a decaying rate records
    its last step as ``decay_steps``)."""

    features: str
    preset: str
    model_digest: str
    trainable: str
    lora_rank: int | None
    lora_alpha: float | None
    learning_rate: float
    batch_size: int
    task: str
    seed: int
    caption_dropout: float
    warmup_steps: int
    weight_decay: float
    shift: float
    sampling: str
    runtime: str
    ranks: int
    lora_targets: str | None = None  #: the LoRA's target groups (``attn,mlp``; None for ``full``)
    lr_schedule: str = "constant"  #: after the warmup (:data:`hyv_lib.runtimes.torch_train.LR_SCHEDULES`)
    decay_steps: int | None = None  #: where a decaying schedule reaches zero (the run's steps; None: constant)
    prior_weight: float = 0.0  #: the prior captions' share of the loss (0: none; :func:`hyv_lib.training.loop.train`)
    dropout_target: str = "data"  #: what a caption-dropped clip trains towards (:data:`DROPOUT_TARGETS`)


def train_defaults(preset: Preset) -> dict[str, Any]:
    """The settings ``train`` uses where it is given none: :data:`DEFAULTS` and ``lora_targets``
    :data:`hyv_lib.models.lora.DEFAULT_LORA_TARGETS`, overridden by ``preset.train_defaults`` (what was measured to
    teach that checkpoint; hyv-tiny's: the recipe of chapter 9 that teaches it a new motion, and its prior captions,
    which ``extract_features`` encodes)."""
    return {**DEFAULTS, "lora_targets": DEFAULT_LORA_TARGETS, **preset.train_defaults}


def check_settings(steps, learning_rate, batch_size, task, runtime, checkpoint_every, seed, caption_dropout,
                   warmup_steps, weight_decay, shift, sampling, lora_rank, lora_alpha, full, mesh,
                   schedule="constant") -> dict[str, Any]:
    """The numbers and choices, checked (one HyvInputError naming the parameter); returns them as Python numbers."""
    if full and lora_rank is not None:
        raise HyvInputError("full", "trains every weight; `lora_rank` trains a LoRA adapter: give one of them")
    if not full and lora_rank is None:
        raise HyvInputError("lora_rank", "give `lora_rank` R (a LoRA adapter of rank R) or `full` (every weight)")
    if full and lora_alpha is not None:
        raise HyvInputError("lora_alpha", "scales a LoRA adapter: it needs `lora_rank`, not `full`")
    if task not in TASKS:
        raise HyvInputError("task", f"must be one of {', '.join(TASKS)}, got {task!r}")
    if runtime not in RUNTIMES:
        raise HyvInputError("runtime", f"must be one of {runtime_choices(RUNTIMES)}, got {runtime!r}")
    if mesh is not None and runtime != "jax":
        raise HyvInputError("mesh", "lays out JAX devices: it needs `runtime` jax (torch shards over torchrun ranks)")
    if sampling not in SAMPLINGS:
        raise HyvInputError("sampling", f"must be one of {', '.join(SAMPLINGS)}, got {sampling!r}")
    if schedule not in LR_SCHEDULES:
        raise HyvInputError("lr_schedule", f"must be one of {', '.join(LR_SCHEDULES)}, got {schedule!r}")
    return dict(
        steps=as_number("steps", steps, int, low=1),
        learning_rate=as_number("learning_rate", learning_rate, low=0, low_open=True),
        batch_size=as_number("batch_size", batch_size, int, low=1),
        checkpoint_every=as_number("checkpoint_every", checkpoint_every, int, low=1),
        seed=as_number("seed", seed, int, low=0),
        caption_dropout=as_number("caption_dropout", caption_dropout, low=0, high=1),
        warmup_steps=as_number("warmup_steps", warmup_steps, int, low=0),
        weight_decay=as_number("weight_decay", weight_decay, low=0),
        shift=as_number("shift", shift, low=0, low_open=True),
        lora_rank=as_number("lora_rank", lora_rank, int, low=1),
        lora_alpha=as_number("lora_alpha", lora_alpha, low=0, low_open=True),
    )


def step_lr(run: RunSettings, index: int) -> float:
    """The learning rate of update ``index`` (0-based) of a run."""
    return lr_schedule(run.lr_schedule, run.learning_rate, run.warmup_steps, run.decay_steps or 1)(index)


def resolve_prior_weight(given, default: float, features, full: bool, runtime: str) -> float:
    """The prior half's weight a run trains with (:func:`hyv_lib.training.loop.train`'s ``prior_weight``), checked."""
    count = len(getattr(features, "prior_captions", []))
    if given is None:
        weight = float(default) if count and not full and runtime == "torch" else 0.0
        if count and not weight:
            logger.info("train: the features' %d prior captions are not used (they need a LoRA on runtime torch)",
                        count)
        return weight
    weight = as_number("prior_weight", given, low=0)
    if weight and not count:
        raise HyvInputError("prior_weight", f"{weight:g}, but the features hold no prior captions: extract them "
                                            "with `prior_captions` (python -m hyv_lib extract_features --prior_captions "
                                            "FILE), or give 0")
    if weight and full:
        raise HyvInputError("prior_weight", "keeps the frozen model's predictions, the LoRA switched off: it needs "
                                            "`lora_rank`, not `full` (give 0)")
    if weight and runtime != "torch":
        raise HyvInputError("prior_weight", f"runs on `runtime` torch only, not {runtime!r} (give 0)")
    return weight


def resolve_dropout_target(given, default: str, full: bool, runtime: str) -> str:
    """What a caption-dropped clip trains towards in this run (:func:`hyv_lib.training.loop.train`'s ``dropout_target``), checked."""
    if given is None:
        if default == "frozen" and (full or runtime != "torch"):
            logger.info("train: caption-dropped clips train towards their data (dropout_target frozen needs a LoRA "
                        "on runtime torch)")
            return "data"
        return default
    if given not in DROPOUT_TARGETS:
        raise HyvInputError("dropout_target", f"must be one of {', '.join(DROPOUT_TARGETS)}, got {given!r}")
    if given == "frozen" and full:
        raise HyvInputError("dropout_target", "frozen keeps the model's predictions with the LoRA switched off: it "
                                              "needs `lora_rank`, not `full`")
    if given == "frozen" and runtime != "torch":
        raise HyvInputError("dropout_target", f"frozen runs on `runtime` torch only, not {runtime!r} (give data)")
    return given
