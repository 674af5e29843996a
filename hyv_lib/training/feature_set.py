"""The features folder's format (files, tensor names, index) and FeatureSet, its reader.

The folder :func:`hyv_lib.training.features.extract_features` writes. Layout (format ``hyv_lib.features/1``)::

    features.safetensors.index.json   {"metadata": {...}, "weight_map": {key: file}, "clips": [...], "failed": [...]}
    features-negative.safetensors     the empty prompt, encoded once: negative.prompt_embeds, ... (caption dropout)
    features-prior.safetensors        the prior captions, if any: prior.0.prompt_embeds, ... (what training keeps)
    features-00000.safetensors        up to shard_size clips each: "{id}.latents", "{id}.prompt_embeds", ...

Per clip (no batch axis): ``latents`` [C, T, h, w] fp32, the VAE posterior's mode times ``vae.config.scaling_factor``
(what the DiT is trained on); stage 1's text tensors (:func:`hyv_lib.pipeline.text.encode_prompts`, the model family's
``text_names``) in the text encoders' dtype, e.g. HunyuanVideo-1.5's ``prompt_embeds`` [L, D], ``prompt_embeds_mask``
[L] (int64), ``prompt_embeds_2`` [L2, D2], ``prompt_embeds_mask_2`` [L2]; image-to-video also the first frame's
conditions as stage 1 makes them (:func:`hyv_lib.pipeline.image.encode_image`; HunyuanVideo-1.5's ``image_embeds``
[N, D] from SigLIP and ``cond_latents`` [C, 1, h, w], the first frame's scaled latents).

``metadata``: format, preset (a name, or every field of a custom preset), model_path, model_config_digest, task,
latents_scaled (true), scaling_factor, prior_captions (their list, in the order of their tensors), num_frames,
max_height, max_width, dtype, vae_dtype, frame_sampling (in words), frames (first or random), fps (the rate clips were
resampled to; null: none) and frame_seed (with random). ``clips``: one record per clip, in extraction order: id, path
(as in data.json), file (absolute), caption, entry (its index in the data.json of the run that made it), num_frames,
height, width (the pixels encoded), fps (the source's), latent_shape, frame_start (the window's start among the
resampled frames) and source_frames (the first and last source frame taken). ``failed``: the last run's bad entries,
{"entry", "path", "error"}.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import numpy as np
import torch
from safetensors import safe_open

from ..base.errors import HyvInputError

FORMAT = "hyv_lib.features/1"
INDEX_FILE = "features.safetensors.index.json"
NEGATIVE_FILE = "features-negative.safetensors"
PRIOR_FILE = "features-prior.safetensors"
#: Clip shards: ``features-00000.safetensors``, ``features-00001.safetensors``, ...
SHARD_PATTERN = re.compile(r"^features-(\d{5})\.safetensors$")


def shard_name(number: int) -> str:
    """The file name of clip shard ``number``."""
    return f"features-{number:05d}.safetensors"


def read_index(path: str, argument: str = "features") -> dict[str, Any]:
    """The index of the features folder ``path``, checked (format, fields); a HyvInputError naming ``argument``."""
    index_path = os.path.join(path, INDEX_FILE)
    if not os.path.isfile(index_path):
        raise HyvInputError(argument, f"{path!r} has no {INDEX_FILE}; make it with python -m hyv_lib extract_features")
    try:
        with open(index_path, encoding="utf-8") as f:
            index = json.load(f)
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise HyvInputError(argument, f"{index_path!r} is not a readable JSON index ({err}); extract the features "
                                      "again into a new folder") from None
    fields = {"metadata": dict, "weight_map": dict, "clips": list, "failed": list}
    if not isinstance(index, dict) or any(not isinstance(index.get(k), t) for k, t in fields.items()):
        raise HyvInputError(argument, f"{index_path!r} is not a features index (needs {', '.join(fields)})")
    if index["metadata"].get("format") != FORMAT:
        raise HyvInputError(argument, f"{index_path!r} has format {index['metadata'].get('format')!r}; this "
                                      f"hyv_lib reads {FORMAT!r}")
    return index


class FeatureSet:
    """The clips of a features folder: ``len()``, ``fs[i]`` -> {name: tensor} of clip ``i`` (``latents``, the four
    text tensors, and for i2v ``image_embeds`` and ``cond_latents``; shapes without a batch axis, see the module
    docstring), ``.negative`` (the empty prompt's four text tensors), ``.prior_captions`` and ``.prior(i)`` (the text
    tensors of prior caption ``i``), ``.metadata``, ``.clips`` (the index's
    records), ``.failed`` and ``.shapes()``. Shards are memory-mapped (safetensors' ``safe_open``) and read tensor by
    tensor; a FeatureSet pickles (DataLoader workers reopen the shards)."""

    def __init__(self, path: str):
        path = os.path.expanduser(os.fspath(path))
        index = read_index(path, "features")
        self.path = path
        self.metadata: dict[str, Any] = index["metadata"]
        self.clips: list[dict[str, Any]] = index["clips"]
        self.failed: list[dict[str, Any]] = index["failed"]
        self.weight_map: dict[str, str] = index["weight_map"]
        for name in sorted(set(self.weight_map.values())):
            if not os.path.isfile(os.path.join(path, name)):
                raise HyvInputError("features", f"{path!r}: shard {name} of its index is missing; extract the "
                                                "features again (a rerun redoes only what is missing)")
        self._handles: dict[str, Any] = {}
        #: The text tensors of each clip and of the empty prompt: what the negative file holds (the model family's
        #: stage-1 text, :attr:`hyv_lib.models.family.ModelFamily.text_names`).
        self.text_names = tuple(k.split(".", 1)[1] for k in self.weight_map if k.startswith("negative."))
        first = f"{self.clips[0]['id']}." if self.clips else None
        #: The tensors of each clip: ``latents``, the text ones and, for image-to-video, the first frame's.
        self.names = tuple(k[len(first):] for k in self.weight_map if first and k.startswith(first))

    def __len__(self) -> int:
        return len(self.clips)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if not isinstance(i, (int, np.integer)) or isinstance(i, bool):
            raise TypeError(f"a FeatureSet is indexed by an integer, got {type(i).__name__}")
        clip = self.clips[i]  # IndexError past the end, as a list
        return {name: self._tensor(f"{clip['id']}.{name}") for name in self.names}

    @property
    def negative(self) -> dict[str, torch.Tensor]:
        """The empty prompt's text tensors (what caption dropout trains on)."""
        return {name: self._tensor(f"negative.{name}") for name in self.text_names}

    @property
    def prior_captions(self) -> list[str]:
        """The prior captions the folder holds, in order ([] for none, and for folders made before them)."""
        return list(self.metadata.get("prior_captions") or [])

    def prior(self, i: int) -> dict[str, torch.Tensor]:
        """The text tensors of prior caption ``i`` (as :attr:`negative`'s)."""
        if not 0 <= i < len(self.prior_captions):
            raise IndexError(f"prior caption {i} of {len(self.prior_captions)}")
        return {name: self._tensor(f"prior.{i}.{name}") for name in self.text_names}

    def shapes(self) -> list[tuple[int, ...]]:
        """The latent shape (C, T, h, w) of each clip, in order (clips of one shape can share a batch)."""
        return [tuple(clip["latent_shape"]) for clip in self.clips]

    def _tensor(self, key: str) -> torch.Tensor:
        if key not in self.weight_map:
            raise HyvInputError("features", f"{self.path!r}: its index names no tensor {key!r}")
        name = self.weight_map[key]
        if name not in self._handles:
            self._handles[name] = safe_open(os.path.join(self.path, name), "pt")
        return self._handles[name].get_tensor(key)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_handles": {}}
