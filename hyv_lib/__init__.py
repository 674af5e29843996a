"""hyv_lib: HunyuanVideo-1.5 on TPU and GPU — presets, staged pipeline, kernels and runtimes."""

__version__ = "0.1.0"

from .errors import HyvInputError  # noqa: E402
from .presets import PRESETS, Preset, get_preset  # noqa: E402

__all__ = ["__version__", "HyvInputError", "PRESETS", "Preset", "get_preset"]
