"""The official GPU scripts' flags (``--attn_mode``, ``--use_sageattn``, ``--enable_offloading``, ...) as aliases of
hyv_lib's own stage-2 settings, or refused with one line saying what to use instead; their checkpoint choice
(``--resolution``, ``--task``, ``--cfg_distilled``, ``--step_distilled``, ``--sparse_attn``) as a preset choice."""

from __future__ import annotations

import argparse
from typing import Any

from ..base.errors import HyvInputError
from ..base.presets import Preset
from ..models.families import PRESETS
from ..models.folder import PresetChoice, choose_preset
from .attention_flags import str_to_bool

#: ``--attn_mode`` of Tencent's generate.py and the staged GPU scripts -> hyv_lib's ``--attention``. ``flash`` there
#: means "the best flash kernel installed" (FA3, else FA2, else torch): hyv_lib's ``auto``, which orders the exact
#: kernels by what was measured on the GPU's generation. ``torch`` there is dense flex_attention with a -inf mask:
#: the same exact attention as SDPA on the valid tokens. ``flex-block-attn`` is SSTA (:mod:`hyv_lib.kernels.ssta`).
ATTN_MODES = {"flash": "auto", "flash2": "flash", "flash3": "flash3", "torch": "sdpa", "sageattn": "sage",
              "flex-block-attn": "ssta"}
#: ``--cache_type`` values -> hyv_lib's ``--cache_method`` (None: not in hyv_lib).
CACHE_TYPES = {"deepcache": "deepcache", "teacache": None, "taylorcache": None}


def add_official_arguments(parser: argparse.ArgumentParser) -> None:
    """The official scripts' flags on ``parser``, in a group of their own whose help says what each maps to."""
    g = parser.add_argument_group("the official scripts' flags (aliases of the flags above)")
    g.add_argument("--attn_mode", default=None,
                   help="flash (= --attention auto) | flash2 (= flash) | flash3 | torch (= sdpa) | sageattn (= sage) "
                        "| flex-block-attn (= ssta)")
    g.add_argument("--use_sageattn", type=str_to_bool, nargs="?", const=True, default=False,
                   help="= --attention sage (lossy 8-bit attention)")
    g.add_argument("--enable_offloading", action="store_true",
                   help="= --offload model (the transformer on the GPU for the denoising loop only); "
                        "--offload block streams it block by block instead")
    g.add_argument("--disable_offloading", action="store_true", help="no offloading (hyv_lib's default)")
    g.add_argument("--enable_torch_compile", type=str_to_bool, nargs="?", const=True, default=False,
                   help="= --compile")
    g.add_argument("--cache_type", default=None,
                   help="deepcache (= --cache_method deepcache); teacache and taylorcache are not in hyv_lib "
                        "(--cache_method magcache is its adaptive cache)")


def official_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The stage-2 settings the official flags in ``args`` stand for (an empty dict if none was given).
    HyvInputError naming the flag for an unknown value, for a flag hyv_lib does not have, or when it contradicts the
    hyv_lib flag it aliases (say one of them)."""
    out: dict[str, Any] = {}
    attention = getattr(args, "attention", None)
    if args.attn_mode is not None:
        if args.attn_mode not in ATTN_MODES:
            raise HyvInputError("--attn_mode", f"must be one of {', '.join(ATTN_MODES)}, got {args.attn_mode!r}")
        out["attention"] = ATTN_MODES[args.attn_mode]
        if attention is not None and attention != out["attention"]:
            raise HyvInputError("--attn_mode", f"{args.attn_mode} is --attention {out['attention']}, but --attention "
                                               f"{attention} was given too: give one of them")
    if args.use_sageattn:
        chosen = out.get("attention", attention)
        if chosen not in (None, "sage"):
            raise HyvInputError("--use_sageattn", f"is --attention sage, but attention {chosen} was asked for too: "
                                                  "give one of them")
        if getattr(args, "sparse_attn", False):
            raise HyvInputError("--use_sageattn", "SageAttention and sparse attention (--sparse_attn) exclude each "
                                                  "other, as in the official scripts: give one of them")
        out["attention"] = "sage"
    if args.enable_offloading and args.disable_offloading:
        raise HyvInputError("--enable_offloading", "and --disable_offloading contradict each other: give one")
    offload = getattr(args, "offload", None)
    if args.enable_offloading:
        if offload not in (None, "model"):
            raise HyvInputError("--enable_offloading", f"is --offload model, but --offload {offload} was given too: "
                                                       "give one of them")
        out["offload"] = "model"
    if args.disable_offloading and offload is not None:
        raise HyvInputError("--disable_offloading", f"contradicts --offload {offload}: give one of them")
    if args.enable_torch_compile:
        out["compile"] = True
    if args.cache_type is not None:
        if args.cache_type not in CACHE_TYPES:
            raise HyvInputError("--cache_type", f"must be one of {', '.join(CACHE_TYPES)}, got {args.cache_type!r}")
        method = CACHE_TYPES[args.cache_type]
        if method is None:
            raise HyvInputError("--cache_type", f"{args.cache_type} is not in hyv_lib: use --cache_method magcache "
                                                "(adaptive, calibrated) or deepcache (the fixed schedule)")
        given = getattr(args, "cache_method", None)
        if given not in (None, method):
            raise HyvInputError("--cache_type", f"{args.cache_type} is --cache_method {method}, but --cache_method "
                                                f"{given} was given too: give one of them")
        out["cache_method"] = method
    return out


#: ``--resolution`` of the official generate.py -> the presets' bucket base size (``target_size``) of that resolution.
RESOLUTIONS = {"480p": 640, "720p": 960}


def add_preset_arguments(group: Any) -> None:
    """The official generate.py's checkpoint flags on a stage-1 ``group``: with them (and no ``--preset``) a preset is
    chosen as that script chooses its checkpoint, ``{resolution}_{task}[_distilled | _step_distilled |
    _distilled_sparse]``."""
    group.add_argument("--resolution", default=None,
                       help="480p | 720p: choose the checkpoint as the official generate.py does, from this, --task, "
                            "--cfg_distilled, --step_distilled and --sparse_attn (instead of --preset; with "
                            "--model_path they must fit the folder)")
    group.add_argument("--task", default=None, help="t2v | i2v: with --resolution (default: i2v with --image_path, "
                                                    "else t2v)")
    group.add_argument("--cfg_distilled", type=str_to_bool, nargs="?", const=True, default=False,
                       help="with --resolution: the CFG-distilled checkpoint (guidance 1, one sample per step)")
    group.add_argument("--step_distilled", "--enable_step_distill", dest="step_distilled", type=str_to_bool,
                       nargs="?", const=True, default=False,
                       help="with --resolution: the step-distilled (MeanFlow) checkpoint, 480p i2v only")


def _fits(preset: Preset, resolution: str | None, task: str, cfg: bool, step: bool, sparse: bool) -> bool:
    """Whether ``preset`` is the checkpoint the official flags name (read from its fields, not its name)."""
    distilled = preset.guidance_scale == 1.0
    return (not preset.is_tiny and preset.tasks == (task,)
            and (resolution is None or preset.target_size == RESOLUTIONS[resolution])
            and preset.use_meanflow == step and (distilled == (cfg or step or sparse))
            and (preset.attention == "ssta") == sparse)


def preset_from_flags(args: argparse.Namespace) -> "str | PresetChoice | None":
    """What the command runs as its preset: ``--preset`` (None: the folder's or the default, see
    :func:`hyv_lib.models.folder.choose_preset`), or, when the official checkpoint flags are given, the preset they
    name (checked against ``--preset`` and the ``--model_path`` folder when those are given too)."""
    resolution, task = getattr(args, "resolution", None), getattr(args, "task", None)
    cfg, step = bool(getattr(args, "cfg_distilled", False)), bool(getattr(args, "step_distilled", False))
    if resolution is None and task is None and not cfg and not step:
        return args.preset
    if resolution is not None and resolution not in RESOLUTIONS:
        raise HyvInputError("--resolution", f"must be one of {', '.join(RESOLUTIONS)}, got {resolution!r}")
    if task is not None and task not in ("t2v", "i2v"):
        raise HyvInputError("--task", f"must be t2v or i2v, got {task!r}")
    task = task or ("i2v" if getattr(args, "image_path", None) else "t2v")
    sparse = bool(getattr(args, "sparse_attn", False))
    names = [name for name, p in PRESETS.items() if _fits(p, resolution, task, cfg, step, sparse)]
    asked = " ".join(filter(None, [resolution, task, "cfg-distilled" if cfg else "", "step-distilled" if step else "",
                                   "sparse" if sparse else ""]))
    flag = "--resolution" if resolution is not None else "--task"
    if not names:
        raise HyvInputError(flag, f"no preset is the {asked} checkpoint (the official naming); the real presets: "
                                  f"{', '.join(n for n, p in PRESETS.items() if not p.is_tiny)}")
    if args.preset is not None:
        if args.preset not in names:
            raise HyvInputError(flag, f"{asked} names {' or '.join(names)}, not --preset {args.preset}: give one of "
                                      "them")
        return args.preset
    return choose_preset(None, args.model_path, candidates=names, selected_by=flag.removeprefix("--"))
