"""hyv_lib: HunyuanVideo-1.5 on TPU and GPU — presets, staged pipeline, kernels and runtimes."""

__version__ = "0.1.0"

from .errors import HyvInputError  # noqa: E402
from .presets import PRESETS, Preset, get_preset  # noqa: E402


_LAZY = {"load_pipeline": "inference", "VideoPipeline": "inference", "Video": "inference"}


def __getattr__(name: str):
    """The in-memory pipeline, imported on first use so that ``import hyv_lib`` stays light (no torch import)."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["__version__", "HyvInputError", "PRESETS", "Preset", "get_preset", "load_pipeline", "VideoPipeline", "Video"]
