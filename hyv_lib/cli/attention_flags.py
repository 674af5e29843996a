"""SSTA's options as flags (``--ssta_<field>`` of :class:`hyv_lib.SstaConfig`) and the setting they make, and the
official scripts' true/false switches."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from ..kernels.ssta import SstaConfig

#: SSTA's options as flags: ``--ssta_<field>`` (``lambda_`` is ``--ssta_lambda``), each with its parser and help.
SSTA_FLAGS = {
    "tile": (str, "latent cells of one tile t,h,w"),
    "window": (str, "tiles of the sliding window t,h,w"),
    "topk": (int, "key tiles chosen per query tile (halved at <= 31 latent frames)"),
    "sampling": (str, "importance | similarity: how the top-k tiles are chosen"),
    "lambda_": (float, "importance sampling's weight of similarity against redundancy"),
    "threshold": (float, "similarity sampling's cumulative cut (0: plain top-k)"),
    "share_heads": (None, "one mask for all heads (block means averaged over heads)"),
    "sparse_type": (str, "ssta (window and top-k) | sta (window only) | block_attn (top-k only)"),
    "pad": (str, "zero | repeat: how the video is padded to whole tiles"),
    "dense_every": (int, "run every N-th block and the last one dense (the official's hybrid mode; 0: none)"),
}


def str_to_bool(value: str) -> bool:
    """``true``/``1``/``yes`` or ``false``/``0``/``no``, as the official scripts take ``--sparse_attn``."""
    lowered = str(value).lower()
    if lowered in ("true", "1", "yes", "y"):
        return True
    if lowered in ("false", "0", "no", "n"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def add_ssta_arguments(parser: argparse.ArgumentParser, group=None) -> None:
    """The ``--ssta_*`` options on ``parser`` (in its argument ``group``, if given); ``args.ssta`` is None, the
    setting :func:`ssta_overrides` fills from the ``--ssta_*`` flags."""
    parser.set_defaults(ssta=None)
    group = group or parser
    defaults = SstaConfig()
    for name, (kind, text) in SSTA_FLAGS.items():
        flag = f"--ssta_{name.rstrip('_')}"  # its dest is the flag's name: errors naming ssta_lambda find it
        default = getattr(defaults, name)
        shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
        if kind is None:
            group.add_argument(flag, dest=flag[2:], type=str_to_bool, nargs="?", const=True, default=None,
                               help=f"SSTA: {text} (default {shown})")
        else:
            group.add_argument(flag, dest=flag[2:], type=kind, default=None,
                               help=f"SSTA: {text} (default {shown})")


def ssta_overrides(args: argparse.Namespace) -> dict[str, Any] | None:
    """The ``--ssta_*`` flags given, as a dict of SstaConfig fields (None if none was given): the ``ssta`` setting
    (:func:`hyv_lib.pipeline.settings.ssta_options` checks it and names the flag of a bad value)."""
    given = {f.name: getattr(args, f"ssta_{f.name.rstrip('_')}", None) for f in dataclasses.fields(SstaConfig)}
    given = {name: value for name, value in given.items() if value is not None}
    return given or None
