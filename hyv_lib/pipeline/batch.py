"""Load once, generate many: a prompts file's entries into numbered folders, each redone only when its inputs change."""

from __future__ import annotations

import codecs
import contextlib
import errno
import hashlib
import json
import os
import traceback
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from ..base.errors import HyvInputError
from ..base.files import clean_partials
from ..base.lock import folder_lock
from ..base.presets import DEFAULT_SEED, Preset
from ..models.dtypes import torch_dtype
from ..models.families import PRESETS
from ..models.folder import choose_preset
from ..parallel.sharding import DEFAULT_STRATEGY
from ..runtimes.names import runtime_name, vae_runtime_for
from .calibration import cache_schedule
from .inference import load_pipeline
from .settings import Stage2Settings, check_vae_settings, prepare_runtime, resolve_settings
from .stage_io import CONFIG_FILE, FRAMES_FILE, VIDEO_FILE, read_config, update_config
from .stages import stage1, stage2, stage3

#: generation_config.json's record of what made an entry's video (:func:`entry_record`), written after its stage 3.
RECORD_KEY = "batch_entry"
#: OSErrors that stop a prompts-file run (every later entry would meet them too); others fail their entry only.
DISK_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO)


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
    ``vae_dtype``, ...). Settings are checked here, before any model loads. ``text_device``: where stage 1's encoders
    run (see :class:`hyv_lib.VideoPipeline`: on a GPU they stay there between prompts unless ``offload`` is set).
    """

    def __init__(self, preset: str | Preset | None = None, model_path: str | None = None, dtype: str | None = None,
                 stage2: dict[str, Any] | None = None, stage3: dict[str, Any] | None = None,
                 text_device: str | torch.device | None = "auto"):
        self.choice = choose_preset(preset, model_path)  # None: what the folder says (or the default)
        self.preset = self.choice.preset
        self.model_path, self.dtype = model_path, dtype or self.preset.default_dtype
        torch_dtype(self.dtype)  # validates --dtype
        self.stage2_settings = dict(stage2 or {})
        self.stage3_settings = dict(stage3 or {})
        unknown = set(self.stage2_settings) & {"seed", "input_dir", "output_dir", "step", "components"}
        if unknown:
            raise HyvInputError(sorted(unknown)[0], "is set per video, not for the pipeline")
        requested = Stage2Settings.from_kwargs({k: v for k, v in self.stage2_settings.items() if k != "quiet"})
        prepare_runtime(requested)  # a multi-host run's hosts join before the mesh is checked
        settings = resolve_settings(self.preset, requested)
        if settings.runtime == "ulysses":  # stage 2 tears the process group down after each video
            raise HyvInputError("runtime", "a pipeline for many prompts runs with `runtime` torch or jax")
        if settings.shard_weights:  # as ulysses: one prompt per torchrun launch
            raise HyvInputError("shard_weights", "a pipeline for many prompts runs without it (one process)")
        runtime = settings.runtime
        self.stage3_settings["runtime"] = runtime_name(self.stage3_settings.get("runtime", vae_runtime_for(runtime)))
        check_vae_settings(self.stage3_settings.get("vae_dtype", "fp32"), self.stage3_settings.get("vae_memory_gb"),
                           not self.stage3_settings.get("disable_tiling", False), self.stage3_settings["runtime"])
        self.settings = settings
        # The models and the step are an in-memory VideoPipeline's; this class adds the stage files per video.
        self.video = load_pipeline(self.preset, model_path, self.dtype, runtime=runtime, mesh=settings.mesh,
                                   sharding=self.stage2_settings.get("sharding", DEFAULT_STRATEGY),
                                   attention=settings.attention, ssta=settings.ssta, vae_runtime=self.stage3_settings["runtime"],
                                   offload=settings.offload, lora=settings.lora, lora_scale=settings.lora_scale,
                                   compile=settings.compile, progress=not self.stage2_settings.get("quiet", False),
                                   text_device=text_device, settings=settings)
        self.step = self.video.step_for(cache_schedule(settings, self.preset, model_path),
                                        settings.no_cache_blocks)

    @property
    def compilations(self) -> int | None:
        """Compilations of the transformer step so far (jax runtime), else None."""
        return self.video.compilations

    def video_settings(self) -> dict[str, Any]:
        """Every setting of this pipeline that changes its videos (not the per-video prompt, seed or image): the
        preset, model, dtype, the resolved stage-2 settings but the seed and the untimed warm-up calls, and stage 3's.
        A local model folder counts by its path, not its contents."""
        stage2_fields = {k: v for k, v in self.settings.config().items() if k not in ("seed", "warmup_steps")}
        if self.settings.lora:  # a LoRA counts by its contents too (a retrained file at the same path reruns)
            stage2_fields["lora_sha256"] = self.video.lora_record["lora_sha256"]
        s3 = self.stage3_settings
        fps = s3.get("fps")
        model = self.model_path
        return dict(
            preset=self.preset.name if PRESETS.get(self.preset.name) == self.preset else self.preset.to_dict(),
            model_path=os.path.abspath(model) if model and os.path.isdir(model) else model, dtype=self.dtype,
            stage2=stage2_fields,
            stage3=dict(fps=float(self.preset.fps if fps is None else fps), runtime=s3["runtime"],
                        disable_tiling=bool(s3.get("disable_tiling", False)),
                        save_frames=bool(s3.get("save_frames", False)), vae_dtype=s3.get("vae_dtype", "fp32"),
                        vae_memory_gb=s3.get("vae_memory_gb")))

    @property
    def settings_sha256(self) -> str:
        """SHA-256 of :meth:`video_settings` (canonical JSON): part of each prompts-file entry's record."""
        return sha256_json(self.video_settings())

    def generate(self, prompt: str, output_dir: str, negative_prompt: str = "", seed: int = DEFAULT_SEED,
                 image_path: str | None = None) -> torch.Tensor:
        """One video into ``output_dir`` (the three stage files, the mp4 and generation_config.json); returns its
        uint8 frames [F, H, W, 3]. ``image_path``: the first frame of an image-to-video run. Holds the folder's lock
        (:func:`hyv_lib.base.lock.folder_lock`) throughout, and first removes what killed writers left there."""
        with folder_lock(output_dir, "output_dir"):
            clean_partials(output_dir)
            stage1(preset=self.choice, prompt=prompt, negative_prompt=negative_prompt, output_dir=output_dir,
                   model_path=self.model_path, dtype=self.dtype, components=self.video.components,
                   image_path=image_path, text_device=self.video.text_device)
            stage2(input_dir=output_dir, seed=seed, step=self.step, components=self.video.components,
                   **self.stage2_settings)
            return stage3(input_dir=output_dir, components=self.video.components, **self.stage3_settings)


@dataclass
class PromptEntry:
    """One line of a prompts file. ``number``: its place among the file's prompt lines (blank and ``#`` lines not
    counted, bad ones counted), which names its folder; ``seed``: the line's, or the run's seed + ``number``."""

    line: int
    prompt: str
    negative_prompt: str = ""
    seed: int | None = None
    image_path: str | None = None
    number: int = 0


@dataclass
class BatchReport:
    """What :func:`run_prompts_file` did: per entry, its folder and ``done`` / ``skipped`` (complete for the same
    inputs) / ``failed`` (with the error; ``replaced``: the folder held a video of other inputs); lines that could not
    be read are in ``bad_lines``. ``shard``: (I, N), or None for the whole file."""

    entries: list[dict[str, Any]] = field(default_factory=list)
    bad_lines: list[dict[str, Any]] = field(default_factory=list)
    shard: tuple[int, int] | None = None

    @property
    def failed(self) -> int:
        return sum(e["status"] == "failed" for e in self.entries) + len(self.bad_lines)


def _decode(path: str, data: bytes) -> str:
    """The file's text; HyvInputError naming the file and line for a binary (NUL bytes) or non-UTF-8 file."""
    if b"\0" in data:
        line = data.count(b"\n", 0, data.index(b"\0")) + 1
        raise HyvInputError("prompts_file", f"{path}: line {line}: a NUL byte; a prompts file is UTF-8 text, and "
                                            "this looks like a binary file")
    data = data.removeprefix(codecs.BOM_UTF8)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        column = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        raise HyvInputError("prompts_file", f"{path}: line {line}, byte {column}: not UTF-8 "
                                            f"({data[err.start:err.start + 1]!r}); save the file as UTF-8") from None


def _parse_line(text: str, folder: str) -> tuple[str, str, int | None, str | None]:
    """prompt, negative prompt, seed, image path of one JSON line; ValueError says what is wrong."""
    item = json.loads(text)  # json.JSONDecodeError is a ValueError
    if not isinstance(item, dict):
        raise ValueError("a line starting with '{' must be one JSON object")
    unknown = set(item) - {"prompt", "negative_prompt", "seed", "image_path"}
    if unknown:
        raise ValueError(f"unknown key(s) {sorted(unknown)}; valid: prompt, negative_prompt, seed, image_path")
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
        image_path = os.path.join(folder, image_path)
    return item["prompt"], item.get("negative_prompt", ""), seed, image_path


def read_prompts_file(path: str, seed: int | None = None) -> tuple[list[PromptEntry], list[dict[str, Any]]]:
    """Parse a prompts file (UTF-8): one prompt per line, or a JSON object per line with ``prompt`` and optionally
    ``negative_prompt``, ``seed`` and ``image_path`` (image-to-video; relative to the file's folder). Blank lines and
    lines starting with ``#`` are skipped; a file of nothing else holds no prompt, a HyvInputError. Returns the entries
    and the bad lines (line, number and why), which do not stop the others. With ``seed``, an entry without one gets ``seed`` + its number, and one whose seed falls outside
    [0, 2**63) is a bad line. A missing, binary or non-UTF-8 file is a HyvInputError naming the file (and line)."""
    if not os.path.isfile(path):
        raise HyvInputError("prompts_file", f"no such file: {path}")
    try:
        with open(path, "rb") as f:
            text = _decode(path, f.read())
    except OSError as err:
        raise HyvInputError("prompts_file", f"cannot read {path}: {err.strerror or err}") from None
    folder = os.path.dirname(os.path.abspath(path))
    entries, bad = [], []
    number = 0
    for line, raw in enumerate(text.split("\n"), 1):
        text_line = raw.strip()
        if not text_line or text_line.startswith("#"):
            continue
        try:
            if text_line.startswith("{"):
                entry = PromptEntry(line, *_parse_line(text_line, folder), number=number)
            else:
                entry = PromptEntry(line, text_line, number=number)
            if seed is not None and entry.seed is None:
                entry.seed = seed + number
                if not 0 <= entry.seed < 2**63:
                    raise ValueError(f"its seed, the run's seed {seed} + entry number {number} = {entry.seed}, is "
                                     "outside [0, 2**63); give the line a 'seed' or the run a smaller `seed`")
            entries.append(entry)
        except ValueError as err:
            bad.append(dict(line=line, number=number, error=str(err)))
        number += 1
    if number == 0:  # nothing to run: refused before any model loads, not a run of "0 done"
        raise HyvInputError("prompts_file", f"{path} holds no prompt (only blank lines and # comments)"
                            if text.strip() else f"{path} holds no prompt (the file is empty)")
    return entries, bad


def parse_shard(shard: str | tuple[int, int] | None) -> tuple[int, int] | None:
    """``"I/N"`` (or a pair) -> (I, N) with 0 <= I < N; None stays None. HyvInputError naming ``shard`` otherwise."""
    if shard is None:
        return None
    try:
        index, count = (int(part) for part in shard.split("/")) if isinstance(shard, str) else shard
        if isinstance(index, bool) or isinstance(count, bool) or index != int(index) or count != int(count):
            raise ValueError
    except (ValueError, TypeError):
        raise HyvInputError("shard", f"must be I/N with whole numbers 0 <= I < N (worker I of N), got {shard!r}") \
            from None
    if not (count >= 1 and 0 <= index < count):
        raise HyvInputError("shard", f"must be I/N with 0 <= I < N (worker I of N), got {shard!r}")
    return int(index), int(count)


def sha256_json(data: Any) -> str:
    """SHA-256 (hex) of ``data`` as canonical JSON (sorted keys, no spaces)."""
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def file_sha256(path: str) -> str:
    """SHA-256 (hex) of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def entry_record(entry: PromptEntry, settings_sha256: str, image_path: str | None = None) -> dict[str, Any]:
    """What makes an entry's video: its prompt, negative prompt, seed, first frame (path and SHA-256 of its bytes;
    ``image_path`` when the line has none) and the pipeline's :meth:`BatchRunner.settings_sha256`, with their SHA-256
    as ``inputs_sha256``; and, not part of it, the entry's line and number."""
    image = entry.image_path or image_path
    inputs = dict(prompt=entry.prompt, negative_prompt=entry.negative_prompt, seed=entry.seed,
                  image_path=None if image is None else os.path.abspath(image),
                  image_sha256=None if image is None else file_sha256(image), settings_sha256=settings_sha256)
    return dict(line=entry.line, number=entry.number, inputs=inputs, inputs_sha256=sha256_json(inputs))


def is_complete(folder: str, inputs_sha256: str | None = None) -> bool:
    """A folder whose video was fully written (stage 3 recorded its time in generation_config.json and the folder's
    output_video.mp4 is there); with ``inputs_sha256``, also made from those inputs (:func:`entry_record`)."""
    try:
        with open(os.path.join(folder, CONFIG_FILE)) as f:
            config = json.load(f)
    except (OSError, ValueError):
        return False
    if not isinstance(config, dict) or "stage3_time_s" not in config:
        return False
    if not os.path.isfile(config.get("output_video") or "") and not os.path.isfile(os.path.join(folder, VIDEO_FILE)):
        return False
    record = config.get(RECORD_KEY)
    return inputs_sha256 is None or (isinstance(record, dict) and record.get("inputs_sha256") == inputs_sha256)


def _forget(folder: str) -> None:
    """Before an entry is (re)made: drop its old record and optional frames file, so no file of other inputs passes
    for this entry's if the run stops half-way."""
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(folder, FRAMES_FILE))
    try:
        config = read_config(folder)
    except HyvInputError:  # unreadable: stage 1 writes a new one
        return
    if RECORD_KEY in config:
        update_config(folder, base={k: v for k, v in config.items() if k != RECORD_KEY})


@contextlib.contextmanager
def run_lock(output_dir: str, shard: tuple[int, int] | None = None) -> Iterator[None]:
    """The locks of a prompts-file run on ``output_dir``, held for the block: the whole file locks the folder
    exclusively; shard I/N holds it shared with the other shards plus ``.hyv-shard-I-of-N.lock`` exclusively. So a
    second run of the file, or of the same shard, stops at once with a FolderInUseError naming the folder and the
    holder, while shards 0/N ... N-1/N run side by side (each entry folder has its own lock as well)."""
    index, count = shard or (0, 1)
    if count == 1:
        with folder_lock(output_dir, "output_dir", part="the whole prompts file"):
            yield
        return
    with folder_lock(output_dir, "output_dir", shared=True), \
            folder_lock(output_dir, "shard", name=f".hyv-shard-{index}-of-{count}.lock",
                        part=f"shard {index}/{count}"):
        yield


def run_prompts_file(path: str, output_dir: str, runner: BatchRunner, seed: int = DEFAULT_SEED,
                     progress: bool = True, image_path: str | None = None,
                     shard: str | tuple[int, int] | None = None) -> BatchReport:
    """Generate the entries of ``path`` with one :class:`BatchRunner`, each into ``output_dir/NNNN`` (its number,
    :class:`PromptEntry`). An entry without a seed uses ``seed`` + its number, one without an image ``image_path``.

    A rerun is safe after anything: each folder records what made it (:func:`entry_record`), and an entry is skipped
    only when its folder is complete for the same inputs, else (re)made; partial files of killed writers are removed.
    Editing line k redoes entry k alone; inserting or deleting a prompt line renumbers the entries after it, whose
    folders (and default seeds) then no longer match: they are redone, never passed off as the new entries; folders
    numbered past the file's last entry are left as they are. ``shard``
    ("I/N"): only the entries whose number is I modulo N (N workers, same folders, no coordination: see
    :func:`run_lock`). An entry that fails is reported and the others still run, except on a full, read-only or
    failing disk (:data:`DISK_ERRORS`), which stops the run with that OSError; bad lines are reported, not run."""
    from tqdm.auto import tqdm

    shard = parse_shard(shard)
    index, count = shard or (0, 1)
    entries, bad = read_prompts_file(path, seed)
    report = BatchReport(bad_lines=[b for b in bad if b["number"] % count == index], shard=shard)
    mine = [e for e in entries if e.number % count == index]
    settings_sha256 = runner.settings_sha256
    with run_lock(output_dir, shard):
        for entry in tqdm(mine, desc="prompts", disable=not progress):
            folder = os.path.join(output_dir, f"{entry.number:04d}")
            row = dict(index=entry.number, line=entry.line, prompt=entry.prompt, folder=folder)
            try:
                record = entry_record(entry, settings_sha256, image_path)
                with folder_lock(folder, "output_dir", part=f"entry {entry.number} of {os.path.abspath(path)}"):
                    clean_partials(folder)
                    if is_complete(folder, record["inputs_sha256"]):
                        report.entries.append(dict(row, status="skipped"))
                        continue
                    row["replaced"] = is_complete(folder)
                    _forget(folder)
                    runner.generate(entry.prompt, folder, entry.negative_prompt, entry.seed,
                                    image_path=entry.image_path or image_path)
                    update_config(folder, **{RECORD_KEY: dict(record, prompts_file=os.path.abspath(path))})
                report.entries.append(dict(row, status="done"))
            except OSError as err:
                if err.errno in DISK_ERRORS:
                    raise
                report.entries.append(dict(row, status="failed", error=f"{type(err).__name__}: {err}",
                                           traceback=traceback.format_exc(limit=3)))
            except Exception as err:  # noqa: BLE001 - one bad prompt must not lose the others
                report.entries.append(dict(row, status="failed", error=f"{type(err).__name__}: {err}",
                                           traceback=traceback.format_exc(limit=3)))
    return report
