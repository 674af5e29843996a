"""Load once, generate many: the three stages with their models kept in memory and one transformer step."""

from __future__ import annotations

import json
import os
import traceback
from dataclasses import dataclass, field
from typing import Any

import torch

from ..base.errors import HyvInputError
from ..base.presets import DEFAULT_PRESET, DEFAULT_SEED, Preset, get_preset
from ..models.components import torch_dtype
from .calibration import cache_schedule
from .inference import load_pipeline
from .settings import check_vae_settings, resolve_settings
from .stage_io import CONFIG_FILE
from .stages import stage1, stage2, stage3


class BatchRunner:
    """The staged pipeline run for many prompts, each into its own folder of stage files, with every model loaded once
    and one transformer step built once (``generate --prompts_file``). :class:`hyv_lib.VideoPipeline` is the in-memory
    one: it returns frames and writes nothing.

    On a TPU VM the first denoising step compiles for minutes; a :class:`BatchRunner` keeps that compiled step (and the
    loaded text encoders, transformer and VAE) for every video it generates, so only the first one pays. Each call
    of :meth:`generate` writes the usual stage files into its own folder. The stage-2 settings given here are fixed
    for the pipeline's life (the step is compiled for them); per video only the prompt, negative prompt and seed
    change.

    ``preset``, ``model_path`` and ``dtype`` as for :func:`hyv_lib.pipeline.stages.stage1`; ``stage2`` takes the keyword
    arguments of :func:`hyv_lib.pipeline.stages.stage2` (``runtime``, ``mesh``, ``attention``, ``video_length``,
    ``enable_cache``, ...); ``stage3`` those of :func:`hyv_lib.pipeline.stages.stage3` (``fps``, ``disable_tiling``,
    ``vae_dtype``, ...). Settings are checked here, before any model loads.
    """

    def __init__(self, preset: str | Preset = DEFAULT_PRESET, model_path: str | None = None, dtype: str | None = None,
                 stage2: dict[str, Any] | None = None, stage3: dict[str, Any] | None = None):
        self.spec = get_preset(preset)
        self.model_path, self.dtype = model_path, dtype or self.spec.default_dtype
        torch_dtype(self.dtype)  # validates --dtype
        self.stage2_settings = dict(stage2 or {})
        self.stage3_settings = dict(stage3 or {})
        unknown = set(self.stage2_settings) & {"seed", "input_dir", "output_dir", "step", "components"}
        if unknown:
            raise HyvInputError(sorted(unknown)[0], "is set per video, not for the pipeline")
        settings = resolve_settings(self.spec, **{k: v for k, v in self.stage2_settings.items()
                                                   if k not in ("quiet",)})
        if settings.runtime == "ulysses":  # stage 2 tears the process group down after each video
            raise HyvInputError("--runtime", "a pipeline for many prompts runs with --runtime torch or tpu")
        if settings.shard_weights:  # as ulysses: one prompt per torchrun launch
            raise HyvInputError("--shard_weights", "a pipeline for many prompts runs without it (one process)")
        runtime = settings.runtime
        self.stage3_settings.setdefault("runtime", "tpu" if runtime == "tpu" else "torch")
        check_vae_settings(self.stage3_settings.get("vae_dtype", "fp32"), self.stage3_settings.get("vae_memory_gb"),
                           not self.stage3_settings.get("disable_tiling", False), self.stage3_settings["runtime"])
        # The models and the step are an in-memory VideoPipeline's; this class adds the stage files per video.
        self.video = load_pipeline(self.spec, model_path, self.dtype, runtime=runtime, mesh=settings.mesh,
                                   sharding=self.stage2_settings.get("sharding", "tp_replicated_out"),
                                   attention=settings.attention, vae_runtime=self.stage3_settings["runtime"],
                                   offload=settings.offload,
                                   progress=not self.stage2_settings.get("quiet", False))
        self.step = self.video.step_for(cache_schedule(settings, self.spec, model_path),
                                        settings.no_cache_blocks)

    @property
    def compilations(self) -> int | None:
        """Compilations of the transformer step so far (tpu runtime), else None."""
        return self.video.compilations

    def generate(self, prompt: str, output_dir: str, negative_prompt: str = "", seed: int = DEFAULT_SEED,
                 image_path: str | None = None) -> torch.Tensor:
        """One video into ``output_dir`` (the three stage files, the mp4 and generation_config.json); returns its
        uint8 frames [F, H, W, 3]. ``image_path``: the first frame of an image-to-video run."""
        stage1(preset=self.spec.name, prompt=prompt, negative_prompt=negative_prompt, output_dir=output_dir,
                        model_path=self.model_path, dtype=self.dtype, components=self.video.components,
                        image_path=image_path)
        stage2(input_dir=output_dir, seed=seed, step=self.step, components=self.video.components,
               **self.stage2_settings)
        return stage3(input_dir=output_dir, components=self.video.components, **self.stage3_settings)


@dataclass
class PromptEntry:
    """One line of a prompts file."""

    line: int
    prompt: str
    negative_prompt: str = ""
    seed: int | None = None
    image_path: str | None = None


@dataclass
class BatchReport:
    """What :func:`run_prompts_file` did: per entry, its folder and ``done`` / ``skipped`` (already complete) /
    ``failed`` (with the error); lines that could not be read are in ``bad_lines``."""

    entries: list[dict[str, Any]] = field(default_factory=list)
    bad_lines: list[dict[str, Any]] = field(default_factory=list)

    @property
    def failed(self) -> int:
        return sum(e["status"] == "failed" for e in self.entries) + len(self.bad_lines)


def read_prompts_file(path: str) -> tuple[list[PromptEntry], list[dict[str, Any]]]:
    """Parse a prompts file: one prompt per line, or a JSON object per line with ``prompt`` and optionally
    ``negative_prompt``, ``seed`` and ``image_path`` (image-to-video; relative to the file's folder). Blank lines and lines starting with ``#`` are skipped. Returns the entries
    and the bad lines (line number and why), which do not stop the others."""
    if not os.path.isfile(path):
        raise HyvInputError("--prompts_file", f"no such file: {path}")
    entries, bad = [], []
    with open(path, encoding="utf-8") as f:
        for number, raw in enumerate(f, 1):
            text = raw.strip()
            if not text or text.startswith("#"):
                continue
            if not text.startswith("{"):
                entries.append(PromptEntry(number, text))
                continue
            try:
                item = json.loads(text)
                unknown = set(item) - {"prompt", "negative_prompt", "seed", "image_path"}
                if unknown:
                    raise ValueError(f"unknown key(s) {sorted(unknown)}; valid: prompt, negative_prompt, seed, "
                                     "image_path")
                if not isinstance(item.get("prompt"), str):
                    raise ValueError("needs a string 'prompt'")
                if not isinstance(item.get("negative_prompt", ""), str):
                    raise ValueError("'negative_prompt' must be a string")
                seed = item.get("seed")
                if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63):
                    raise ValueError(f"'seed' must be an integer in [0, 2**63), got {seed!r}")
                image_path = item.get("image_path")
                if image_path is not None and (not isinstance(image_path, str) or not image_path):
                    raise ValueError(f"'image_path' must be a non-empty string, got {image_path!r}")
                if image_path is not None:
                    image_path = os.path.join(os.path.dirname(os.path.abspath(path)), image_path)
                entries.append(PromptEntry(number, item["prompt"], item.get("negative_prompt", ""), seed, image_path))
            except ValueError as err:  # json.JSONDecodeError is a ValueError
                bad.append(dict(line=number, error=str(err)))
    return entries, bad


def is_complete(folder: str) -> bool:
    """A folder whose video was fully written (stage 3 recorded its time in generation_config.json)."""
    try:
        with open(os.path.join(folder, CONFIG_FILE)) as f:
            config = json.load(f)
    except (OSError, ValueError):
        return False
    video = config.get("output_video")
    return "stage3_time_s" in config and bool(video) and os.path.isfile(video)


def run_prompts_file(path: str, output_dir: str, runner: BatchRunner, seed: int = DEFAULT_SEED,
                     progress: bool = True, image_path: str | None = None) -> BatchReport:
    """Generate every prompt of ``path`` with one :class:`BatchRunner`, each into ``output_dir/NNNN`` (the entry's
    number in the file's order, from 0000). Entries whose folder is complete are skipped (a rerun picks up where
    one stopped); an entry that fails is reported and the others still run; bad lines are reported, not run. An
    entry without a seed uses ``seed`` + its number, one without an image ``image_path``."""
    from tqdm.auto import tqdm

    entries, bad = read_prompts_file(path)
    report = BatchReport(bad_lines=bad)
    os.makedirs(output_dir, exist_ok=True)
    for index, entry in enumerate(tqdm(entries, desc="prompts", disable=not progress)):
        folder = os.path.join(output_dir, f"{index:04d}")
        row = dict(index=index, line=entry.line, prompt=entry.prompt, folder=folder)
        if is_complete(folder):
            report.entries.append(dict(row, status="skipped"))
            continue
        try:
            runner.generate(entry.prompt, folder, entry.negative_prompt,
                              entry.seed if entry.seed is not None else seed + index,
                              image_path=entry.image_path or image_path)
            report.entries.append(dict(row, status="done"))
        except Exception as err:  # noqa: BLE001 - one bad prompt must not lose the others
            report.entries.append(dict(row, status="failed", error=f"{type(err).__name__}: {err}",
                                       traceback=traceback.format_exc(limit=3)))
    return report
