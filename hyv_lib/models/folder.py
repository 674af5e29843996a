"""Which preset a model folder holds: its own configs (pipeline, transformer, scheduler, guider, VAE) read and matched
against every preset's layout, so a folder runs with its own settings and a contradicting ``--preset`` is refused."""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass
from typing import Any

from ..base.errors import HyvInputError
from ..base.presets import Preset
from .families import DEFAULT_PRESET, PRESETS, get_preset
from .registry import ADAPTERS

logger = logging.getLogger(__name__)

#: The key of model_index.json where ``save_tiny`` notes the preset whose layout it wrote (diffusers ignores keys that
#: start with ``_``). It only breaks a tie the configs leave (a sparse checkpoint's configs equal its dense twin's).
LAYOUT_NOTE = "_hyv_layout_of"
#: A transformer config key of the official (non-diffusers) checkpoints: ``flex-block-attn`` marks the SSTA-trained one.
OFFICIAL_ATTN_KEY, OFFICIAL_SPARSE = "attn_mode", "flex-block-attn"


@dataclass(frozen=True)
class PresetChoice:
    """The preset a run uses and why: ``source`` (recorded as ``preset_source``) is ``--preset`` (given),
    ``--model_path`` (read from the folder's configs), ``--resolution`` or ``--task`` (the official flags' naming) or
    ``default``; ``detail`` says what decided it."""

    preset: Preset
    source: str
    detail: str = ""

    def record(self) -> dict[str, str]:
        """generation_config.json's fields: how the preset was chosen."""
        return {"preset_source": self.source, **({"preset_detail": self.detail} if self.detail else {})}


def _read_json(path: str) -> dict[str, Any] | None:
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def folder_configs(model_path: str) -> dict[str, dict[str, Any]]:
    """The configs of a diffusers-format folder that say which model it is: ``model_index``, ``transformer``,
    ``scheduler``, ``guider`` and ``vae`` (each absent when the folder has no such file)."""
    files = {"model_index": "model_index.json", "transformer": "transformer/config.json",
             "scheduler": "scheduler/scheduler_config.json", "guider": "guider/guider_config.json",
             "vae": "vae/config.json"}
    out = {}
    for key, rel in files.items():
        data = _read_json(os.path.join(model_path, rel))
        if data is not None:
            out[key] = data
    return out


def _fmt(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def differences(preset: Preset, configs: dict[str, dict[str, Any]]) -> list[str]:
    """What in ``configs`` (:func:`folder_configs`) contradicts ``preset``, one ``field: preset's vs folder's`` entry
    each: the transformer's class and its family's layout keys (the adapter's ``layout_keys``: channels, patches,
    target size, task, MeanFlow, text length, ...), the scheduler's shift, the guider's scale (a CFG-distilled
    checkpoint's is 1), the VAE's latent channels and compressions, and SSTA when the folder says it (the official
    config's ``attn_mode``). Widths (heads, layers) are not compared: a ``save_tiny`` folder has a real layout at
    tiny widths. An empty list: the preset fits the folder."""
    adapter = ADAPTERS.get(preset.model)
    diffs = []
    transformer = configs.get("transformer", {})
    cls = transformer.get("_class_name")
    if cls is not None and adapter is not None and cls not in adapter.model_classes:
        return [f"transformer class: {preset.name} runs {', '.join(adapter.model_classes)}, the folder holds {cls}"]
    for key in getattr(adapter, "layout_keys", ()):
        if key in transformer and key in preset.transformer and transformer[key] != preset.transformer[key]:
            diffs.append(f"transformer {key}: {_fmt(preset.transformer[key])} vs the folder's {_fmt(transformer[key])}")
    shift = configs.get("scheduler", {}).get("shift")
    if isinstance(shift, (int, float)) and float(shift) != float(preset.flow_shift):
        diffs.append(f"flow shift: {_fmt(preset.flow_shift)} vs the folder's scheduler {_fmt(float(shift))}")
    scale = configs.get("guider", {}).get("guidance_scale")
    if isinstance(scale, (int, float)) and float(scale) != float(preset.guidance_scale):
        diffs.append(f"guidance scale: {_fmt(preset.guidance_scale)} vs the folder's guider {_fmt(float(scale))}"
                     + (" (a CFG-distilled checkpoint)" if float(scale) == 1.0 else ""))
    vae = configs.get("vae", {})
    for key, mine in (("latent_channels", preset.latent_channels),
                      ("spatial_compression_ratio", preset.spatial_compression),
                      ("temporal_compression_ratio", preset.temporal_compression)):
        if key in vae and vae[key] != mine:
            diffs.append(f"vae {key}: {mine} vs the folder's {vae[key]}")
    if transformer.get(OFFICIAL_ATTN_KEY) == OFFICIAL_SPARSE and preset.attention != "ssta":
        diffs.append(f"attention: {preset.name} is dense, the folder's transformer was trained with SSTA "
                     f"({OFFICIAL_ATTN_KEY} {OFFICIAL_SPARSE})")
    return diffs


def _width_match(preset: Preset, transformer: dict[str, Any]) -> bool:
    """Every transformer config key the preset sets equals the folder's (widths too): the preset's own weights."""
    return all(transformer.get(k) == v for k, v in preset.transformer.items() if k in transformer)


def _path_hint(names: list[str], model_path: str) -> list[str]:
    """The candidates whose name (or hub id's last part) the folder's absolute path spells, longest first: a hub
    download keeps the repository's name (``...Diffusers-720p_i2v_distilled_sparse``, ``models--org--name/...``)."""
    path = os.path.abspath(model_path).lower()
    spelled = []
    for name in names:
        preset = PRESETS[name]
        tags = [name.lower()] + ([preset.hub_id.rsplit("/", 1)[-1].lower()] if preset.hub_id else [])
        best = max((len(t) for t in tags if t in path), default=0)
        if best:
            spelled.append((best, name))
    if not spelled:
        return []
    top = max(n for n, _ in spelled)
    return [name for n, name in spelled if n == top]


def detect_preset(model_path: str, candidates: list[str] | None = None,
                  argument: str = "model_path") -> tuple[Preset, str]:
    """The preset whose layout a local diffusers-format folder holds, and a line saying what decided it.

    Every preset (or those named in ``candidates``) without :func:`differences` from the folder's configs is a
    candidate; ties (a sparse checkpoint's configs equal its dense twin's; a tiny twin's layout equals its real
    model's) go to, in order: the preset ``save_tiny`` noted in model_index.json, the name the folder's path spells,
    the preset whose transformer widths equal the folder's too, the dense one. HyvInputError naming ``model_path``
    (or ``argument``: the flags that named ``candidates``) when no preset fits (with the closest one's differences)
    or when the tie stays."""
    configs = folder_configs(model_path)
    if "transformer" not in configs:
        raise HyvInputError("model_path", f"{model_path!r} has no transformer/config.json, so it does not say which "
                                          f"model it is; give `preset` ({', '.join(PRESETS)})")
    names = list(candidates) if candidates is not None else list(PRESETS)
    fits = [n for n in names if not differences(PRESETS[n], configs)]
    if not fits:
        near = min(names, key=lambda n: len(differences(PRESETS[n], configs)))
        raise HyvInputError(argument, f"{model_path!r} matches no preset{' of those asked for' if candidates else ''}"
                                            f" (closest: {near}, which differs in "
                                            f"{'; '.join(differences(PRESETS[near], configs))}); give `preset`")
    why = "its configs fit only this preset"
    if len(fits) > 1:
        note = configs.get("model_index", {}).get(LAYOUT_NOTE)
        spelled = _path_hint(fits, model_path)
        exact = [n for n in fits if _width_match(PRESETS[n], configs["transformer"])]
        dense = [n for n in fits if PRESETS[n].attention != "ssta"]
        if note in fits:
            fits, why = [note], f"model_index.json's {LAYOUT_NOTE} names it among {len(fits)} fitting presets"
        elif spelled and len(spelled) < len(fits):
            fits, why = spelled, "the folder's path spells its name"
        elif exact and len(exact) < len(fits):
            fits, why = exact, "the transformer's widths are this preset's too"
        elif dense and len(dense) < len(fits):
            others = [n for n in fits if n not in dense]
            fits, why = dense, f"dense attention; the configs fit {', '.join(others)} too (give `preset` for it)"
    if len(fits) > 1:
        raise HyvInputError("model_path", f"{model_path!r} fits several presets ({', '.join(fits)}); give `preset`")
    return PRESETS[fits[0]], why


def choose_preset(preset: "str | Preset | PresetChoice | None" = None, model_path: str | None = None,
                  candidates: list[str] | None = None, selected_by: str = "resolution") -> PresetChoice:
    """The preset of a run: ``preset`` if given (checked against a local ``model_path`` folder: HyvInputError naming
    ``--preset`` and every differing field when they contradict), else the one a local folder's configs say
    (:func:`detect_preset`, among ``candidates`` when the official flags narrowed them), else a hub id's preset, else
    the single candidate, else :data:`hyv_lib.models.families.DEFAULT_PRESET`. A :class:`PresetChoice` (made by the
    caller, e.g. the command line's official flags) is checked against the folder and kept. Nothing is loaded: configs
    are read."""
    local = isinstance(model_path, (str, os.PathLike)) and os.path.isdir(os.path.expanduser(os.fspath(model_path)))
    folder = os.path.expanduser(os.fspath(model_path)) if local else None
    if preset is not None:
        spec = preset.preset if isinstance(preset, PresetChoice) else get_preset(preset)
        if folder is not None:
            diffs = differences(spec, folder_configs(folder))
            if diffs:
                try:
                    fits = detect_preset(folder)[0].name
                except HyvInputError:
                    fits = None
                hint = f"; the folder is {fits}: drop `preset` or give `preset` {fits}" if fits else ""
                raise HyvInputError("preset", f"{spec.name} does not fit {folder!r}: {'; '.join(diffs)}{hint}")
        return preset if isinstance(preset, PresetChoice) else PresetChoice(spec, "--preset")
    if folder is not None:
        spec, why = detect_preset(folder, candidates, "model_path" if candidates is None else selected_by)
        logger.info("preset: %s, read from --model_path %s (%s)", spec.name, folder, why)
        return PresetChoice(spec, "--model_path", why)
    if isinstance(model_path, str) and model_path:
        if not re.fullmatch(r"[\w.-]+/[\w.-]+", model_path):
            raise HyvInputError("model_path", f"{model_path!r} does not exist and is not a hub id (owner/name)")
        by_hub = [p for p in PRESETS.values() if p.hub_id == model_path]
        if by_hub:
            return PresetChoice(by_hub[0], "--model_path", f"the hub id is {by_hub[0].name}'s")
        if candidates is None:
            raise HyvInputError("preset", f"is required with the hub id {model_path!r} (it is none of the presets' "
                                          "hub ids, and hyv_lib reads the configs of local folders only)")
    if candidates is not None:
        if len(candidates) != 1:
            raise HyvInputError(selected_by, f"the flags fit several presets ({', '.join(candidates)}); give `preset`")
        return PresetChoice(PRESETS[candidates[0]], f"--{selected_by}", "the official scripts' checkpoint naming")
    return PresetChoice(get_preset(DEFAULT_PRESET), "default")
