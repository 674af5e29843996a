"""Notebook presentation helpers: tensor tables, frame grids and inline video."""

from __future__ import annotations

import base64
import math
from typing import Any, Iterable, Mapping

import numpy as np

from ..pipeline.video_io import read_mp4, write_mp4


def tensor_rows(shapes: Mapping[str, tuple[int, ...]], dtypes: Mapping[str, str] | str) -> list[dict[str, Any]]:
    """Rows of name / shape / dtype / MiB for tensors described by shape and dtype name."""
    import torch

    rows = []
    for name, shape in shapes.items():
        dtype = dtypes if isinstance(dtypes, str) else dtypes[name]
        itemsize = torch.empty((), dtype=getattr(torch, dtype)).element_size()
        rows.append({"name": name, "shape": list(shape), "dtype": dtype,
                     "MiB": round(math.prod(shape) * itemsize / 2**20, 3)})
    return rows


def file_rows(path: str) -> list[dict[str, Any]]:
    """The tensors of a safetensors file as rows (read from its header; no tensor data is loaded)."""
    from safetensors import safe_open

    names = {"F32": "float32", "BF16": "bfloat16", "F16": "float16", "I64": "int64", "I32": "int32",
             "BOOL": "bool", "U8": "uint8"}
    with safe_open(path, framework="pt") as f:
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
        dtypes = {k: names[f.get_slice(k).get_dtype()] for k in f.keys()}
    return tensor_rows(shapes, dtypes)


def html_table(rows: Iterable[Mapping[str, Any]]):
    """Render rows (dicts with the same keys) as an HTML table for Jupyter and the rendered book.

    HTML rather than Markdown: myst-nb renders Markdown outputs as CommonMark, which has no tables.
    """
    from html import escape

    from IPython.display import HTML

    rows = list(rows)
    if not rows:
        return HTML("<p><em>(empty)</em></p>")
    keys = list(rows[0])

    def cell(value: Any) -> str:
        text = escape(str(value))
        return f"<code>{text}</code>" if isinstance(value, (list, tuple)) else text

    head = "".join(f"<th>{escape(str(k))}</th>" for k in keys)
    body = "".join("<tr>" + "".join(f"<td>{cell(r[k])}</td>" for k in keys) + "</tr>" for r in rows)
    return HTML(f'<table class="table"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>')


def frame_grid(frames: np.ndarray, columns: int = 5, title: str | None = None, scale: float = 2.0):
    """A matplotlib figure showing up to ``columns`` evenly spaced frames of a uint8 [F,H,W,3] video."""
    import matplotlib.pyplot as plt

    frames = np.asarray(frames)
    picks = np.linspace(0, len(frames) - 1, min(columns, len(frames))).round().astype(int)
    height, width = frames.shape[1:3]
    fig, axes = plt.subplots(1, len(picks), figsize=(scale * len(picks) * width / height, scale + 0.4),
                             squeeze=False)
    for ax, i in zip(axes[0], picks):
        ax.imshow(frames[i])
        ax.set_title(f"frame {i}", fontsize=9)
        ax.axis("off")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def video_html(path: str, width: int = 320, max_bytes: int = 1_000_000, media_dir: str | None = None):
    """An HTML5 <video> of the mp4 at ``path``, shown ``width`` pixels wide.

    With ``media_dir`` (the book's chapters pass ``../_static/videos``, a folder Jupyter Book copies into the site),
    the file is copied there under a name made from its content and the page refers to it by a relative URL: the
    page holds no video bytes, and the same URL works in Jupyter, whose working folder is the notebook's. Without
    it, the mp4 is embedded as a data URI (a self-contained notebook); a file over ``max_bytes`` is embedded as a
    copy scaled down to ``width`` pixels (a 720p video of noise is about 5 MB of base64 otherwise)."""
    import hashlib
    import os
    import shutil
    import tempfile

    from IPython.display import HTML

    attributes = f'width="{width}" controls loop muted playsinline'
    if media_dir is not None:
        with open(path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()[:16]
        os.makedirs(media_dir, exist_ok=True)
        target = os.path.join(media_dir, f"{digest}.mp4")
        if not os.path.exists(target):
            shutil.copyfile(path, target + ".partial")
            os.replace(target + ".partial", target)  # never a half-copied video under the final name
        url = os.path.relpath(target).replace(os.sep, "/")
        return HTML(f'<video {attributes} src="{url}"></video>')
    if os.path.getsize(path) > max_bytes:
        from PIL import Image

        frames, meta = read_mp4(path)
        height = max(16, round(frames.shape[1] * width / frames.shape[2] / 16) * 16)  # H.264 macro blocks
        small = np.stack([np.asarray(Image.fromarray(f).resize((width, height), Image.BILINEAR)) for f in frames])
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "small.mp4")
            write_mp4(small, path, meta["fps"])
            with open(path, "rb") as f:
                data = base64.b64encode(f.read()).decode("ascii")
    else:
        with open(path, "rb") as f:
            data = base64.b64encode(f.read()).decode("ascii")
    return HTML(f'<video {attributes} src="data:video/mp4;base64,{data}"></video>')


def token_layout_figure(video_tokens: int, parts: Mapping[str, Any], order=None, title: str | None = None):
    """Bars of one sample's joint sequence: video tokens, then the context parts in order, invalid tokens
    pale. With ``order`` (the valid-first gather indices of the context), a second bar shows the result."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgb
    from matplotlib.patches import Patch

    colors = {"video": "0.35", **{name: f"C{i}" for i, name in enumerate(parts)}}

    def rgb(name: str, valid: np.ndarray) -> np.ndarray:
        base = np.array(to_rgb(colors[name]))
        pale = 0.25 * base + 0.75  # invalid tokens: the same hue, mostly white
        return np.where(valid[:, None], base, pale)

    context = np.concatenate([rgb(n, np.asarray(m, dtype=bool)) for n, m in parts.items()])
    video = rgb("video", np.ones(video_tokens, dtype=bool))
    bars = [("as concatenated", np.concatenate([video, context]))]
    if order is not None:
        bars.append(("valid first", np.concatenate([video, context[np.asarray(order)]])))
    fig, axes = plt.subplots(len(bars), 1, figsize=(10, 0.9 * len(bars) + 0.9), squeeze=False)
    for ax, (label, row) in zip(axes[:, 0], bars):
        ax.imshow(row[None], aspect="auto", interpolation="nearest")
        ax.set_yticks([])
        ax.set_ylabel(label, rotation=0, ha="right", va="center", fontsize=9)
        ax.axvline(video_tokens - 0.5, color="k", lw=1)
    axes[-1, 0].set_xlabel("token position (pale = padding)")
    handles = [Patch(color=colors[n], label=n) for n in colors]
    fig.legend(handles=handles, loc="upper center", ncol=len(handles), fontsize=8, frameon=False)
    if title:
        axes[0, 0].set_title(title, fontsize=10, pad=18)
    fig.tight_layout(rect=(0, 0, 1, 0.9))
    return fig


#: The settings every chapter reads from the environment (its ``parameters`` cell honours each, or names it in
#: :func:`settings_not_used` with the reason).
NOTEBOOK_SETTINGS = ("HYV_PRESET", "HYV_MODEL_PATH", "HYV_RUNTIME", "HYV_MESH", "HYV_ATTENTION", "HYV_HEIGHT",
                     "HYV_WIDTH", "HYV_VIDEO_LENGTH", "HYV_STEPS")


def settings_not_used(reasons: Mapping[str, str]) -> list[str]:
    """Say which of the settings a reader has set this chapter does not use, and why (``reasons``: name -> why);
    prints nothing when none of them is set. Returns the names it reported."""
    import os

    unknown = sorted(set(reasons) - set(NOTEBOOK_SETTINGS))
    if unknown:
        raise ValueError(f"not notebook settings: {unknown}; valid: {', '.join(NOTEBOOK_SETTINGS)}")
    reported = [name for name in reasons if os.environ.get(name)]
    for name in reported:
        print(f"{name}={os.environ[name]} is not used by this chapter: {reasons[name]}")
    return reported
