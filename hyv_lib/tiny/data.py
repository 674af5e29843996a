"""A seeded procedural video dataset: one colored shape moving on a plain background, with its caption."""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass

import numpy as np

# Written by hand: no maintained library makes captioned moving-shape clips (Moving MNIST loaders ship
# fixed digits and no captions). Colors are far apart in RGB so a frame's dominant color is unambiguous.
COLORS = {
    "red": (0.92, 0.12, 0.10),
    "green": (0.10, 0.80, 0.15),
    "blue": (0.15, 0.30, 1.00),
    "yellow": (0.95, 0.88, 0.10),
    "white": (1.00, 1.00, 1.00),
}
# Never in the training set. Chapter 7's LoRA demo teaches orange; cyan shows the limit: the VAE, trained on
# the five colors above, decodes cyan as blue, so no DiT fine-tuning can draw it.
UNSEEN_COLORS = {"cyan": (0.05, 0.90, 0.90), "orange": (1.00, 0.50, 0.05)}
BACKGROUNDS = {"black": (0.0, 0.0, 0.0), "gray": (0.45, 0.45, 0.45), "purple": (0.22, 0.02, 0.28)}
SHAPES = ("circle", "square", "triangle")
DIRECTIONS = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}  # (dx, dy), y grows downwards
# Never in the training set: a diagonal, unit (dx, dy). Chapter 9's motion gate teaches it (hyv_lib.tiny.motion_gate):
# unlike a new colour, a new path needs nothing the VAE cannot draw.
UNSEEN_DIRECTIONS = {"up-right": (math.sqrt(0.5), -math.sqrt(0.5))}

# Pixels per frame, as a fraction of the height: 1.6-2.6 px at 64 px, 13-20 px over 9 frames. Slow on purpose:
# the VAE folds 4 frames into one latent frame, and at 6-10 px per frame (our first data) it could only paint
# the shape smeared along its path. (At 720p this is 18-29 px per frame, brisk motion for a real video.)
SPEED = (0.025, 0.04)
HEIGHT, WIDTH, FRAMES = 64, 112, 9  # the 16:9 bucket of target size 96 (4 x 7 latents), 4n+1 frames


@dataclass(frozen=True)
class Combo:
    """One caption: a color, a shape, a direction and a background."""

    color: str
    shape: str
    direction: str
    background: str

    @property
    def caption(self) -> str:
        return f"a {self.color} {self.shape} moving {self.direction} on a {self.background} background"


def all_combos() -> list[Combo]:
    """All 5 x 3 x 4 x 3 = 180 captions, in a fixed order."""
    return [Combo(c, s, d, b) for c, s, d, b in itertools.product(COLORS, SHAPES, DIRECTIONS, BACKGROUNDS)]


def split_combos(num_held_out: int = 45, seed: int = 0) -> tuple[list[Combo], list[Combo]]:
    """(train, held_out): a seeded choice of unseen captions; every single attribute value stays in train."""
    combos = all_combos()
    if not 0 < num_held_out < len(combos):
        raise ValueError(f"num_held_out must be in 1..{len(combos) - 1}, got {num_held_out}")
    rng = random.Random(seed)
    while True:
        held = set(rng.sample(range(len(combos)), num_held_out))
        train = [c for i, c in enumerate(combos) if i not in held]
        seen = {v for c in train for v in (c.color, c.shape, c.direction, c.background)}
        if len(seen) == len(COLORS) + len(SHAPES) + len(DIRECTIONS) + len(BACKGROUNDS):
            return train, [combos[i] for i in sorted(held)]


def _coverage(shape: str, xs: np.ndarray, ys: np.ndarray, cx: float, cy: float, r: float) -> np.ndarray:
    """Fraction of each pixel inside the shape, from a signed distance with a one-pixel soft edge."""
    dx, dy = xs - cx, ys - cy
    if shape == "circle":
        dist = np.sqrt(dx**2 + dy**2) - r
    elif shape == "square":
        dist = np.maximum(np.abs(dx), np.abs(dy)) - r * 0.85
    elif shape == "triangle":  # upright equilateral-ish triangle inscribed in the radius
        dist = np.maximum(dy - r * 0.7, np.maximum(0.87 * dx - 0.5 * dy, -0.87 * dx - 0.5 * dy) - r * 0.5)
    else:
        raise ValueError(f"shape must be one of {SHAPES}, got {shape!r}")
    return np.clip(0.5 - dist, 0.0, 1.0)


def render_clip(combo: Combo, seed: int, height: int = HEIGHT, width: int = WIDTH, frames: int = FRAMES) -> np.ndarray:
    """A float32 clip [3, frames, height, width] in [-1, 1] (the VAE's range); size, start and speed are seeded."""
    if (frames - 1) % 4:
        raise ValueError(f"frames must be 4n+1, got {frames}")
    rng = np.random.default_rng(seed)
    r = rng.uniform(0.14, 0.2) * height
    margin = r + 2
    if combo.direction in UNSEEN_DIRECTIONS:  # a diagonal: the same speed along the path, both axes kept inside
        dx, dy = UNSEEN_DIRECTIONS[combo.direction]
        travel_x, travel_y = width - 2 * r - 4, height - 2 * r - 4
        distance = min(rng.uniform(*SPEED) * height * (frames - 1), travel_x / abs(dx), travel_y / abs(dy))
        along_x = margin + rng.uniform(0, travel_x - distance * abs(dx))
        along_y = margin + rng.uniform(0, travel_y - distance * abs(dy))
        cx0 = along_x if dx > 0 else width - along_x
        cy0 = along_y if dy > 0 else height - along_y
    else:
        dx, dy = DIRECTIONS[combo.direction]
        travel = (width if dx else height) - 2 * r - 4
        distance = min(rng.uniform(*SPEED) * height * (frames - 1), travel)  # 0 for an image (1 frame)
        # Start so the whole path stays inside the frame; the other axis is free.
        start_along = margin + rng.uniform(0, travel - distance)
        if dx:
            cx0 = start_along if dx > 0 else width - start_along
            cy0 = rng.uniform(margin, height - margin)
        else:
            cy0 = start_along if dy > 0 else height - start_along
            cx0 = rng.uniform(margin, width - margin)
    clip = np.empty((3, frames, height, width), np.float32)
    for t in range(frames):
        step = distance * t / max(frames - 1, 1)  # a 1-frame clip (an image) is the start frame
        clip[:, t] = _draw(combo.color, combo.shape, combo.background, cx0 + dx * step, cy0 + dy * step, r,
                           height, width)
    return clip * 2 - 1


def _draw(color: str, shape: str, background: str, cx: float, cy: float, r: float, height: int,
          width: int) -> np.ndarray:
    """One frame [3, height, width] in [0, 1]: the shape (soft edge) of ``color`` on ``background``."""
    palette = {**COLORS, **UNSEEN_COLORS}
    for name, value, valid in (("color", color, palette), ("background", background, BACKGROUNDS)):
        if value not in valid:
            raise ValueError(f"{name} must be one of {', '.join(valid)}, got {value!r}")
    ys, xs = np.mgrid[0:height, 0:width].astype(np.float32) + 0.5
    alpha = _coverage(shape, xs, ys, cx, cy, r)[None]
    fg = np.array(palette[color], np.float32)[:, None, None]
    bg = np.array(BACKGROUNDS[background], np.float32)[:, None, None]
    return bg * (1 - alpha) + fg * alpha


def draw_frame(color: str, shape: str, background: str, center: tuple[float, float] | None = None,
               radius: float | None = None, height: int = HEIGHT, width: int = WIDTH):
    """One still frame as a PIL RGB image, drawn as :func:`render_clip` draws its frames: a shape of ``radius``
    pixels (default 0.17 x height) centred at ``center`` = (x, y) pixels (default: the middle). Image-to-video's
    first frame."""
    from PIL import Image

    cx, cy = (width / 2, height / 2) if center is None else center
    frame = _draw(color, shape, background, cx, cy, 0.17 * height if radius is None else radius, height, width)
    return Image.fromarray((frame.transpose(1, 2, 0) * 255).round().astype(np.uint8))


def make_dataset(combos: list[Combo], clips_per_combo: int, seed: int = 0) -> tuple[np.ndarray, list[str]]:
    """Render ``clips_per_combo`` seeded clips per caption: (clips [N, 3, F, H, W], captions [N])."""
    clips, captions = [], []
    for i, combo in enumerate(combos):
        for j in range(clips_per_combo):
            clips.append(render_clip(combo, seed=seed * 1_000_003 + i * 1009 + j))
            captions.append(combo.caption)
    return np.stack(clips), captions


def parse_caption(caption: str) -> Combo:
    """The inverse of ``Combo.caption``; a ValueError names what does not fit."""
    words = caption.split()
    if len(words) != 9 or words[0] != "a" or words[3] != "moving" or words[5:7] != ["on", "a"] or words[8] != "background":
        raise ValueError(f"caption must read 'a COLOR SHAPE moving DIRECTION on a BACKGROUND background', got {caption!r}")
    combo = Combo(words[1], words[2], words[4], words[7])
    for value, valid in ((combo.color, {**COLORS, **UNSEEN_COLORS}), (combo.shape, SHAPES),
                         (combo.direction, {**DIRECTIONS, **UNSEEN_DIRECTIONS}),
                         (combo.background, BACKGROUNDS)):
        if value not in valid:
            raise ValueError(f"{value!r} in caption is not one of {', '.join(valid)}")
    return combo
