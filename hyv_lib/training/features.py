"""Feature extraction: a data.json's clips encoded once for training, into a resumable folder of safetensors shards.

What is encoded: VAE latents, stage-1 text embeddings and, for image-to-video, first-frame conditions;
:mod:`hyv_lib.training.feature_set` gives the folder's layout and reads it."""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass, field, replace
from typing import Any, Iterator

import numpy as np
import torch
from tqdm.auto import tqdm

from ..base.errors import HyvInputError
from ..base.files import atomic_path, clean_partials, ensure_output_dir
from ..base.lock import folder_lock
from ..base.presets import TASKS, Preset
from ..models.components import load_components
from ..models.devices import placed
from ..models.dtypes import torch_dtype
from ..models.families import PRESETS, family_for
from ..models.folder import choose_preset
from ..models.patches import frame_causal_vae_attention
from ..pipeline.batch import sha256_json
from ..pipeline.image import encode_image
from ..pipeline.stage_io import save_tensors
from ..pipeline.text import encode_prompts
from ..runtimes.vae import exact_fp32
from .data_json import (
    ClipEntry,
    EntryError,
    check_caption_choice,
    check_entry,
    check_max_side,
    check_num_frames,
    check_prior_captions,
    crop_frames,
    read_data_json,
)
from .run_settings import train_defaults
from .frames import FrameSampling, check_frame_sampling, take_frames
from .feature_set import (
    FORMAT,
    INDEX_FILE,
    NEGATIVE_FILE,
    PRIOR_FILE,
    SHARD_PATTERN,
    FeatureSet,
    read_index,
    shard_name,
)

__all__ = ["ExtractReport", "FeatureSet", "extract_features", "FORMAT", "INDEX_FILE", "NEGATIVE_FILE", "PRIOR_FILE",
           "encode_frames", "model_config_digest"]

#: How frames are taken (recorded in the metadata): no resampling, no random window.
FRAME_SAMPLING = "the first num_frames frames at the clip's own frame rate; an image is 1 frame"


@dataclass
class ExtractReport:
    """What :func:`extract_features` did: the ids of the clips it ``extracted``, those already in the folder
    (``skipped``), and the entries that ``failed`` ({"entry", "path", "error"}), in data.json order."""

    output_dir: str
    extracted: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether every entry is in the folder (none failed)."""
        return not self.failed


@dataclass(frozen=True)
class _Plan:
    """The checked settings of one extraction."""

    preset: Preset
    task: str
    num_frames: int
    max_height: int | None
    max_width: int | None
    dtype: str
    vae_dtype: str
    shard_size: int
    device: torch.device
    progress: bool
    caption: str = "first"  #: which caption of a list is encoded (data_json.CAPTION_CHOICES)
    caption_seed: int = 0  #: ``caption="random"``: the seed of data_json.caption_index
    sampling: FrameSampling | None = None  #: which frames are taken (None: the first num_frames, at the clip's rate)
    prior_captions: tuple[str, ...] = ()  #: encoded once each, for the train loop's prior half

    def settings(self, model_path: str | None) -> dict[str, Any]:
        """The index metadata known before any model loads (a rerun must match it)."""
        preset = self.preset
        local = model_path and os.path.isdir(os.path.expanduser(model_path))
        return {"format": FORMAT, "preset": preset.name if PRESETS.get(preset.name) == preset else preset.to_dict(),
                "model_path": os.path.abspath(os.path.expanduser(model_path)) if local else model_path,
                "task": self.task, "latents_scaled": True, "num_frames": self.num_frames,
                "max_height": self.max_height, "max_width": self.max_width, "dtype": self.dtype,
                "vae_dtype": self.vae_dtype, **self.frame_settings(), **self.caption_settings()}

    def frame_settings(self) -> dict[str, Any]:
        """The metadata of the frame sampling: ``frame_sampling`` (in words), ``frames`` (first or random), ``fps``
        (None: each clip's own rate) and ``frame_seed`` with ``random`` (:meth:`FrameSampling.metadata`)."""
        return (self.sampling or FrameSampling(self.num_frames)).metadata(FRAME_SAMPLING)

    def caption_settings(self) -> dict[str, Any]:
        """The metadata of the caption choice: ``caption`` (``first`` or ``random``), ``caption_seed`` with
        ``random``, and the ``prior_captions`` encoded beside the clips."""
        return {"caption": self.caption, **({"caption_seed": self.caption_seed} if self.caption == "random" else {}),
                "prior_captions": list(self.prior_captions)}


def resolve_task(preset: Preset, task: str | None, argument: str = "task") -> str:
    """``task`` (None: "i2v" for an image-to-video-only preset, else "t2v") checked against what the preset's
    checkpoint was trained for."""
    if task is None:
        return "i2v" if preset.tasks == ("i2v",) else "t2v"
    if task not in TASKS:
        raise HyvInputError(argument, f"must be one of {', '.join(TASKS)}, got {task!r}")
    if task not in preset.tasks:
        raise HyvInputError(argument, f"preset {preset.name} is a {'/'.join(preset.tasks)} checkpoint; it has no "
                                      f"{task} conditioning")
    return task


def resolve_device(device: Any) -> torch.device:
    """``device`` (None: "cuda" when a GPU is present, else "cpu") as a torch device; a HyvInputError naming
    --device for one torch does not know or cannot use."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise HyvInputError("device", f"must be a torch device such as cpu, cuda or cuda:1, got {device!r} "
                                      f"({err})") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise HyvInputError("device", f"{device} asked for, but torch sees no GPU here; use `device` cpu")
    return device


def model_config_digest(vae, preset: Preset) -> str:
    """SHA-256 of what fixes the features' shapes and meaning: the VAE's config and the preset's conditioning layout
    (text and ByT5 lengths and widths, image tokens, latent channels, compressions). Features made by another VAE or
    for another text layout have another digest."""
    layout = {name: getattr(preset, name) for name in (
        "text_len", "text_dim", "byt5_len", "byt5_dim", "image_tokens", "image_dim", "latent_channels",
        "spatial_compression", "temporal_compression")}
    vae_config = {k: v for k, v in dict(vae.config).items() if not k.startswith("_")}
    return sha256_json({"vae": vae_config, "layout": layout})


@torch.no_grad()
def encode_frames(vae, frames: np.ndarray) -> torch.Tensor:
    """uint8 frames [F, H, W, 3] -> latents [C, T, h, w] (fp32, on the host): the VAE posterior's mode times its
    scaling factor, computed where the VAE is and in its dtype. Pixels go to [-1, 1] as diffusers' video processor
    takes them (x / 255 * 2 - 1); diffusers' spatial tiles bound the memory of frames larger than a tile (smaller ones
    are encoded whole); the mid-block attention runs frame by frame, without an [S, S] mask
    (:func:`hyv_lib.models.patches.frame_causal_vae_attention`)."""
    param = next(vae.parameters())
    video = torch.from_numpy(np.ascontiguousarray(frames)).permute(3, 0, 1, 2)[None]  # [1, 3, F, H, W]
    video = (video.to(param.device, torch.float32) / 255.0 * 2.0 - 1.0).to(param.dtype)
    tiling = vae.use_tiling
    vae.use_tiling = True
    try:
        with exact_fp32(param.device, param.dtype), frame_causal_vae_attention(vae):
            latents = vae.encode(video).latent_dist.mode()
    finally:
        vae.use_tiling = tiling
    return (latents[0].float() * vae.config.scaling_factor).cpu()


def extract_features(
    data_json: str, *, preset: str | Preset | None, model_path: str | None = None, output_dir: str,
    num_frames: int | None = None, max_height: int | None = None, max_width: int | None = None,
    progress: bool = True, task: str | None = None, device: Any = None, dtype: str | None = None,
    vae_dtype: str = "fp32", shard_size: int = 32, components: dict[str, Any] | None = None,
    caption: str = "first", caption_seed: int = 0, fps: float | None = None, frames: str = "first",
    frame_seed: int = 0, prior_captions: list[str] | tuple[str, ...] | None = None,
) -> ExtractReport:
    """Encode the clips of a MindSpeed-MM ``data.json`` once, for training: VAE latents, text embeddings (and for
    image-to-video the first frame's conditions) into ``output_dir`` as sharded safetensors with an index
    (:mod:`hyv_lib.training.feature_set` gives the layout; :class:`FeatureSet` reads it).

    ``data_json``: a JSON list of ``{"path", "cap", "num_frames", "fps", "resolution": {"height", "width"}}``;
    ``path`` relative to the data.json's folder (or absolute), a video ffmpeg reads or an image (png, jpg: a one-frame
    clip); ``cap`` a string or a list of strings (``caption``: ``first``, the default, encodes the first; ``random``
    the one picked by the entry's position and ``caption_seed``, the same in every rerun:
    :func:`hyv_lib.training.data_json.caption_index`; the choice is in the index's metadata, and each clip's record
    has the caption encoded); the other fields are optional and checked when given. Frames
    (:mod:`hyv_lib.training.frames`): ``num_frames`` (default: the preset's video length; 4n+1), at the clip's own
    frame rate, or with ``fps`` (MindSpeed-MM's train_fps, 24) resampled to it first: the source frame shown at each
    time k/fps (a 48 fps clip gives every second frame; within 0.1 fps, none is resampled); ``frames="first"`` (the
    default) takes the first of them, ``"random"`` a window picked by ``frame_seed`` and the clip's id (the same in
    every rerun; any window, the last too), as MindSpeed-MM takes a random window each time it reads a clip, but once
    here. The index's metadata records ``frames``, ``fps`` and ``frame_seed``, each clip's record ``frame_start`` (the
    window's start among the resampled frames) and ``source_frames`` (the first and last source frame taken). A video
    with too few frames is a failed entry, not a shorter clip, so every video of a folder has the same length. Each
    frame is resized to cover the preset's bucket for its aspect ratio and centre-cropped to it, then centre-cropped
    to at most ``max_height`` x ``max_width`` (multiples of 16).

    Resumable: a rerun skips the entries already in the folder (an entry is known by its file, caption and fields)
    and extracts the others; a folder made with other settings is a HyvInputError naming ``output_dir``. A bad entry
    (a bad field, a missing or unreadable file, too few frames) is reported in ``failed`` (and the index's
    ``failed``) and skipped. Every ``shard_size`` clips a shard is written atomically and the index after it, so a
    killed run keeps its finished shards and leaves no partial file; the folder's run lock
    (:func:`hyv_lib.base.lock.folder_lock`) refuses a second run on it.

    ``task``: "t2v" or "i2v" (default: "i2v" for an image-to-video preset, else "t2v"; "i2v" adds the first-frame
    conditions, and a family whose text encoder reads the first frame, ``texts_read_image``, reads each caption with
    its clip's first frame and the empty prompt with a black one, as its pipeline reads a negative prompt).
    ``prior_captions``: captions of what the model already draws, encoded once each (``features-prior.safetensors``,
    their list in the metadata), for :func:`hyv_lib.training.loop.train` to keep (its ``prior_weight``); None: the
    preset's (:func:`hyv_lib.training.run_settings.train_defaults`: hyv-tiny has 32 of its training captions, the
    real presets none); ``()``: none.
    ``device``: where the encoders run (default cuda when present, else cpu); ``dtype``: the text and image encoders'
    (default: the preset's); ``vae_dtype``: the VAE's, fp32 (default) or bf16. ``components``: already loaded ones
    (text encoders and tokenizers, VAE, and SigLIP for i2v) to use instead of loading them.
    """
    preset = choose_preset(preset, model_path).preset  # None: the folder's (or the default); a misfit is refused
    dtype = dtype or preset.default_dtype
    torch_dtype(dtype)  # validates --dtype
    if vae_dtype not in ("fp32", "bf16"):
        raise HyvInputError("vae_dtype", f"must be fp32 or bf16, got {vae_dtype!r}")
    if isinstance(shard_size, bool) or not isinstance(shard_size, int) or shard_size < 1:
        raise HyvInputError("shard_size", f"must be a positive integer (clips per shard), got {shard_size!r}")
    caption, caption_seed = check_caption_choice(caption, caption_seed)
    prior_captions = check_prior_captions(train_defaults(preset)["prior_captions"] if prior_captions is None
                                          else prior_captions)
    plan = _Plan(preset=preset, task=resolve_task(preset, task), num_frames=check_num_frames(preset, num_frames),
                 max_height=check_max_side(preset, max_height, "max_height"),
                 max_width=check_max_side(preset, max_width, "max_width"), dtype=dtype, vae_dtype=vae_dtype,
                 shard_size=shard_size, device=resolve_device(device), progress=progress, caption=caption,
                 caption_seed=caption_seed, prior_captions=prior_captions)
    plan = replace(plan, sampling=check_frame_sampling(plan.num_frames, fps, frames, frame_seed))
    if not isinstance(output_dir, (str, os.PathLike)) or not str(output_dir):
        raise HyvInputError("output_dir", f"must be a folder path, got {output_dir!r}")
    output_dir = os.path.abspath(os.path.expanduser(output_dir))
    entries = read_data_json(data_json)
    base_dir = os.path.dirname(os.path.abspath(os.path.expanduser(data_json)))
    if model_path is None and not preset.is_tiny:
        load_components(preset, None, [])  # the "needs --model_path" error, before any work
    created = not os.path.isdir(output_dir)
    ensure_output_dir(output_dir)
    try:
        with folder_lock(output_dir, "output_dir"):
            clean_partials(output_dir)
            return _extract(entries, base_dir, output_dir, plan, model_path, components)
    except HyvInputError:  # refused before any features were written: leave no new empty folder
        if created:
            with contextlib.suppress(OSError):
                os.rmdir(output_dir)
        raise


def _extract(entries: list[Any], base_dir: str, output_dir: str, plan: _Plan, model_path: str | None,
             components: dict[str, Any] | None) -> ExtractReport:
    """:func:`extract_features` once its arguments are checked, holding the folder's run lock."""
    folder = _Folder(output_dir)
    settings = plan.settings(model_path)
    folder.check_settings(settings)  # before any model loads
    family = family_for(plan.preset)
    names = list(dict.fromkeys([*family.text_components, "vae", *(family.image_components if plan.task == "i2v" else ())]))
    if components is None:
        components = load_components(plan.preset, model_path, names, dtype=plan.dtype)
    missing = [n for n in names if n not in components]
    if missing:
        raise HyvInputError("components", f"missing {', '.join(missing)} (needed for {plan.task})")
    report = ExtractReport(output_dir=output_dir)
    with _on_device({n: components[n] for n in names}, plan.device, torch_dtype(plan.vae_dtype)) as models:
        vae = models["vae"]
        metadata = {**settings, "model_config_digest": model_config_digest(vae, plan.preset),
                    "scaling_factor": float(vae.config.scaling_factor)}
        folder.check_settings(metadata)
        folder.start(metadata)
        if NEGATIVE_FILE not in folder.index["weight_map"].values():
            negative = _first(_encode_texts(models, plan, [""], [None]))
            folder.add_file(NEGATIVE_FILE, {f"negative.{k}": v for k, v in negative.items()}, [], [])
        if plan.prior_captions and PRIOR_FILE not in folder.index["weight_map"].values():
            tensors = {}
            for i, text in enumerate(plan.prior_captions):
                encoded = _first(_encode_texts(models, plan, [text], [None]))
                tensors.update({f"prior.{i}.{k}": v.clone() for k, v in encoded.items()})
            folder.add_file(PRIOR_FILE, tensors, [], [])
        _extract_entries(entries, base_dir, plan, models, folder, report)
    return report


@contextlib.contextmanager
def _on_device(components: dict[str, Any], device: torch.device, vae_dtype: torch.dtype) -> Iterator[dict[str, Any]]:
    """The components with their networks on ``device`` (the VAE also in ``vae_dtype``) for the block, back where
    they were after (:func:`hyv_lib.models.devices.placed`)."""
    with contextlib.ExitStack() as stack:
        models = dict(components)
        for name, module in components.items():
            if isinstance(module, torch.nn.Module):
                models[name] = stack.enter_context(placed(module, device, vae_dtype if name == "vae" else None))
        yield models


def _extract_entries(entries: list[Any], base_dir: str, plan: _Plan, models: dict[str, Any], folder: "_Folder",
                     report: ExtractReport) -> None:
    """Every entry: skipped when done, else encoded into the pending shard, which is written every ``shard_size``
    clips and at the end (also when the run stops on an error or an interrupt: finished clips are kept)."""
    done = folder.done
    pending: list[tuple[dict[str, Any], dict[str, torch.Tensor]]] = []
    captions: dict[str, dict[str, torch.Tensor]] = {}  # a caption is encoded once per run

    def flush() -> None:
        if pending:
            tensors = {f"{clip['id']}.{k}": v for clip, features in pending for k, v in features.items()}
            folder.add_file(folder.next_shard(), tensors, [clip for clip, _ in pending], report.failed)
            pending.clear()

    try:
        for index, item in enumerate(tqdm(entries, desc="extract_features", unit="clip", disable=not plan.progress)):
            try:
                entry = check_entry(item, index, base_dir, plan.caption, plan.caption_seed)
                if entry.id in done:
                    report.skipped.append(entry.id)
                    continue
                taken = take_frames(entry.file, plan.sampling, entry.id, entry.raw.get("fps"))
                frames, fps = taken.frames, taken.fps
                frames = crop_frames(plan.preset, frames, plan.max_height, plan.max_width)
            except EntryError as err:
                path = item.get("path") if isinstance(item, dict) else None
                report.failed.append({"entry": index, "path": path, "error": str(err)})
                continue
            clip, features = _encode_clip(entry, frames, fps, plan, models, captions)
            clip.update(taken.record)  # frame_start, source_frames: where the frames were taken
            pending.append((clip, features))
            done.add(entry.id)
            report.extracted.append(entry.id)
            if len(pending) >= plan.shard_size:
                flush()
    finally:
        flush()
        folder.write(report.failed)


def _first(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Batch item 0 of each tensor, on the host."""
    return {k: v[0].detach().cpu() for k, v in tensors.items()}


def _encode_texts(models: dict[str, Any], plan: _Plan, prompts: list[str], images: list) -> dict[str, torch.Tensor]:
    """The text tensors of ``prompts``; for i2v with a family whose text encoder reads the first frame
    (``texts_read_image``), each read with its frame in ``images`` (None: the black frame of a negative prompt)."""
    family = family_for(plan.preset)
    if plan.task == "i2v" and family.texts_read_image:
        return family.encode_texts(models, plan.preset, prompts, images=images)
    return encode_prompts(models, plan.preset, prompts)


def _encode_clip(entry: ClipEntry, frames: np.ndarray, fps: float | None, plan: _Plan, models: dict[str, Any],
                 captions: dict[str, dict[str, torch.Tensor]]) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """One clip's index record and tensors."""
    from PIL import Image

    latents = encode_frames(models["vae"], frames)
    first = Image.fromarray(frames[0]) if plan.task == "i2v" else None
    if plan.task == "i2v" and family_for(plan.preset).texts_read_image:  # the caption's text depends on the frame
        texts = _first(_encode_texts(models, plan, [entry.caption], [first]))
    else:
        if entry.caption not in captions:
            captions[entry.caption] = _first(encode_prompts(models, plan.preset, [entry.caption]))
        texts = captions[entry.caption]
    # copies: safetensors refuses to write one tensor under two clips' keys ("Some tensors share memory")
    features = {"latents": latents, **{k: v.clone() for k, v in texts.items()}}
    if first is not None:  # the first frame as encoded, so its latents sit where the video's first latent frame is
        features.update(_first(encode_image(models, plan.preset, first)))
    clip = {"id": entry.id, "path": entry.path, "file": entry.file, "caption": entry.caption, "entry": entry.index,
            "num_frames": int(frames.shape[0]), "height": int(frames.shape[1]), "width": int(frames.shape[2]),
            "fps": fps, "latent_shape": list(latents.shape)}
    return clip, features


class _Folder:
    """The features folder's index in memory: what is in it, the next shard's name, and its atomic rewrites."""

    def __init__(self, output_dir: str):
        self.dir = output_dir
        self.index_path = os.path.join(output_dir, INDEX_FILE)
        self.index = read_index(output_dir, "output_dir") if os.path.exists(self.index_path) else None

    def check_settings(self, metadata: dict[str, Any]) -> None:
        """HyvInputError naming ``output_dir`` when the folder holds features made with other settings."""
        if self.index is None:
            return
        old = self.index["metadata"]
        old = {"caption": "first", "prior_captions": [], **old}  # folders made before --caption / --prior_captions
        differ = [k for k in metadata if old.get(k) != metadata[k]]
        if differ:
            what = "; ".join(f"{k}: {json.dumps(old.get(k))[:60]} there, {json.dumps(metadata[k])[:60]} now"
                             for k in differ)
            raise HyvInputError("output_dir", f"{self.dir!r} holds features made with other settings ({what}); "
                                              "rerun with the same settings to add clips, or give another folder")

    def start(self, metadata: dict[str, Any]) -> None:
        """A new index, or the old one; shard files the index does not name (a run killed between a shard and its
        index) are removed."""
        if self.index is None:
            self.index = {"metadata": metadata, "weight_map": {}, "clips": [], "failed": []}
        named = set(self.index["weight_map"].values())
        for name in os.listdir(self.dir):
            if (SHARD_PATTERN.match(name) or name in (NEGATIVE_FILE, PRIOR_FILE)) and name not in named:
                os.remove(os.path.join(self.dir, name))

    @property
    def done(self) -> set[str]:
        return {clip["id"] for clip in self.index["clips"]}

    def next_shard(self) -> str:
        numbers = [int(m.group(1)) for m in map(SHARD_PATTERN.match, self.index["weight_map"].values()) if m]
        return shard_name(max(numbers, default=-1) + 1)

    def add_file(self, name: str, tensors: dict[str, torch.Tensor], clips: list[dict[str, Any]],
                 failed: list[dict[str, Any]]) -> None:
        """Write one safetensors file atomically, then the index naming it (and its clips) atomically."""
        save_tensors(tensors, os.path.join(self.dir, name), metadata={"format": FORMAT})
        self.index["weight_map"].update({key: name for key in tensors})
        self.index["clips"].extend(clips)
        self.write(failed)

    def write(self, failed: list[dict[str, Any]]) -> None:
        """The index, atomically, with ``failed`` as its failed entries."""
        self.index["failed"] = list(failed)
        with atomic_path(self.index_path) as tmp:
            with open(tmp, "w") as f:
                json.dump(self.index, f, indent=1)
                f.write("\n")
