"""Prior clips for a new concept: each caption of a data.json with its new word swapped for a known one, drawn by the
model itself, listed beside the user's clips in a new data.json."""

from __future__ import annotations

import json
import os
import re
from typing import Any

from ..base.checks import as_number
from ..base.errors import HyvInputError
from ..base.files import atomic_path, ensure_output_dir
from ..base.lock import folder_lock
from ..pipeline.batch import sha256_json
from ..pipeline.inference import load_pipeline
from ..pipeline.video_io import write_mp4
from .data_json import EntryError, check_entry, read_data_json, read_frames

#: The data.json written in the output folder (the user's entries, then the prior clips).
PRIOR_DATA_JSON = "data.json"
#: What the clips were drawn with; a rerun with other settings in the same folder is refused.
PRIOR_MANIFEST = "prior.json"
MAX_FRAMES = 1025  #: frames read of a clip whose entry gives no ``num_frames``
DEFAULT_FPS = 24.0  #: a prior clip's rate when neither its clip nor its entry says one (an image)


def word_pattern(word: str) -> re.Pattern:
    """``word`` as a whole word of a caption (not inside a longer word or hyphenated name)."""
    return re.compile(rf"(?<![\w-]){re.escape(word)}(?![\w-])")


def twin_captions(captions: list[str], word: str, known: list[str]) -> list[tuple[int, str]]:
    """(index, twin caption) for each caption holding ``word``: the word replaced by ``known[j % len(known)]``, j
    counting those captions (so the known words take turns)."""
    pattern = word_pattern(word)
    held = [i for i, c in enumerate(captions) if pattern.search(c)]
    return [(i, pattern.sub(known[j % len(known)], captions[i])) for j, i in enumerate(held)]


def _check_words(word: Any, known: Any) -> tuple[str, list[str]]:
    if not isinstance(word, str) or not word.strip():
        raise HyvInputError("word", f"must be the new concept's word in the captions, got {word!r}")
    if isinstance(known, str):
        known = [k.strip() for k in known.split(",")]
    if not isinstance(known, (list, tuple)) or not known or not all(isinstance(k, str) and k for k in known):
        raise HyvInputError("known", f"must be words the model knows, joined by commas (e.g. up,right), got {known!r}")
    if word.strip() in known:
        raise HyvInputError("known", f"holds the new word {word!r} itself: give words the model already knows")
    return word.strip(), list(known)


def write_prior_clips(data_json: str, *, word: str, known: str | list[str], output_dir: str, preset: Any = None,
                      model_path: str | None = None, seed: int = 0, num_inference_steps: int | None = None,
                      pipeline=None, progress: bool = True) -> str:
    """Draw one prior clip per caption of ``data_json`` that holds ``word`` (:func:`twin_captions`: the same caption
    with a known word instead), at that clip's rate and at the largest size inside it that the model draws (sides
    of 16 pixels, 4n + 1 frames), with the model itself (``pipeline``, or
    :func:`hyv_lib.load_pipeline` of ``preset`` / ``model_path``; seed ``seed + j`` for the j-th clip, the preset's
    steps and guidance unless ``num_inference_steps``), as ``output_dir/videos/prior_JJJ.mp4``; then write
    ``output_dir/data.json``: every entry of ``data_json`` (paths made absolute), then the prior clips. This is
    DreamBooth's prior preservation (its class images drawn by the base model) for captions: each pair of clips
    differs in one word, so training on both says which word the new clips' content belongs to. A rerun keeps the
    clips already drawn (the folder's ``prior.json`` records the settings and a digest of the entries; other settings
    or an edited data.json are refused). Returns the new data.json's path."""
    word, known = _check_words(word, known)
    seed = as_number("seed", seed, int, low=0)
    if num_inference_steps is not None:
        num_inference_steps = as_number("num_inference_steps", num_inference_steps, int, low=1)
    entries = read_data_json(data_json)
    base_dir = os.path.dirname(os.path.abspath(data_json))
    clips = []
    for i, entry in enumerate(entries):
        try:
            clips.append(check_entry(entry, i, base_dir))
        except EntryError as err:
            raise HyvInputError("data_json", f"entry {i}: {err}") from None
    twins = twin_captions([c.caption for c in clips], word, known)
    if not twins:
        raise HyvInputError("word", f"{word!r} is in no caption of {data_json!r}: give the new concept's word as "
                                    "the captions spell it")
    ensure_output_dir(output_dir)
    settings = {"data_json": os.path.abspath(data_json), "entries": sha256_json([c.raw for c in clips]),
                "word": word, "known": known, "seed": seed,
                "num_inference_steps": num_inference_steps, "preset": getattr(preset, "name", preset),
                "model_path": None if model_path is None else os.path.abspath(model_path)}
    with folder_lock(output_dir, "output_dir", part="prior_clips"):
        manifest = os.path.join(output_dir, PRIOR_MANIFEST)
        if os.path.exists(manifest):
            with open(manifest) as f:
                saved = json.load(f)
            if saved != settings:
                differ = ", ".join(k for k in settings if saved.get(k) != settings[k])
                raise HyvInputError("output_dir", f"{output_dir!r} holds prior clips drawn with other settings "
                                                  f"({differ}): use another folder")
        with atomic_path(manifest) as tmp, open(tmp, "w") as f:
            json.dump(settings, f, indent=1)
        os.makedirs(os.path.join(output_dir, "videos"), exist_ok=True)
        written = []
        for j, (i, caption) in enumerate(twins):
            frames, fps = read_frames(clips[i].file, int(clips[i].raw.get("num_frames") or MAX_FRAMES))
            fps = fps or clips[i].raw.get("fps") or DEFAULT_FPS
            # the largest size the model draws inside the clip's: sides of 16 pixels, 4n + 1 frames
            height, width = frames.shape[1] // 16 * 16, frames.shape[2] // 16 * 16
            length = (len(frames) - 1) // 4 * 4 + 1
            name = f"videos/prior_{j:03d}.mp4"
            path = os.path.join(output_dir, name)
            if not os.path.exists(path):
                if pipeline is None:
                    pipeline = load_pipeline(preset, model_path, progress=progress)
                video = pipeline.generate(caption, height=height, width=width, video_length=length,
                                          num_inference_steps=num_inference_steps, seed=seed + j, progress=progress)
                write_mp4(video.frames, path, fps)
            written.append({"path": name, "cap": caption, "num_frames": length, "fps": fps,
                            "resolution": {"height": height, "width": width}, "prior_of": clips[i].file})
        listed = [{**c.raw, "path": c.file} for c in clips] + written
        out = os.path.join(output_dir, PRIOR_DATA_JSON)
        with atomic_path(out) as tmp, open(tmp, "w") as f:
            json.dump(listed, f, indent=1)
    return out
