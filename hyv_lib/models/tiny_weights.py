"""What the families' tiny builders share: seeded frozen networks, and a diffusers pipeline folder written whole."""

from __future__ import annotations

from typing import Any, Callable, Iterable

import torch


def seeded(seed: int, build: Callable[[], torch.nn.Module]) -> torch.nn.Module:
    """``build()`` with weights that depend on ``seed`` only, in eval mode without gradients; the caller's global RNG
    is left as found (``torch.random.fork_rng``)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build().eval().requires_grad_(False)


def save_pipeline_folder(pipeline_class, components: dict[str, Any], names: Iterable[str], path: str) -> None:
    """Write ``pipeline_class`` made of ``components[name]`` for each of ``names`` as a diffusers-format folder
    (model_index.json + one subfolder per component, safetensors); ValueError naming what is missing first."""
    names = list(names)
    missing = [n for n in names if n not in components]
    if missing:
        raise ValueError(f"a {pipeline_class.__name__} folder needs every component; missing {missing}")
    pipeline_class(**{n: components[n] for n in names}).save_pretrained(path, safe_serialization=True)
