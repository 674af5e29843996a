"""hyv_lib: HunyuanVideo-1.5 on TPU and GPU — presets, staged pipeline, kernels and runtimes.

The public API is this package's names (``hyv_lib.load_pipeline``, ``hyv_lib.JaxTransformer``, ...), each imported
from its layer on first use, so ``import hyv_lib`` stays light (no torch, no JAX). The layers, bottom to top:
``base``, ``parallel``, ``kernels``, ``models``, ``runtimes``, ``pipeline`` and ``planning`` (peers), ``tiny`` and
``notebook``, then ``cli``; each imports only from the layers below it (checked by ``lint-imports``).
"""

import importlib
import logging

__version__ = "0.1.0"

# Library messages go through module loggers (logging.getLogger(__name__)); an application decides whether to show
# them (the CLI shows INFO unless --quiet). Without a configured handler nothing is printed.
logging.getLogger(__name__).addHandler(logging.NullHandler())

#: Public name -> the module that defines it (relative to hyv_lib).
_PUBLIC = {
    "HyvInputError": "base.errors",
    "HyvFaultError": "base.errors",
    "PRESETS": "models.families", "Preset": "base.presets", "get_preset": "models.families",
    "PeakMemory": "base.memory",
    "make_mesh": "parallel.mesh", "parse_mesh": "parallel.mesh", "enable_compile_cache": "parallel.jax_env",
    "available_backends": "kernels.dispatch", "attention": "kernels.dispatch", "register_backend": "kernels.registry",
    "SstaConfig": "kernels.ssta", "ssta_mask": "kernels.ssta",
    "build_tiny_components": "models.components", "load_components": "models.components",
    "use_attention": "models.hunyuan_video15.processors", "ModelAdapter": "models.adapter",
    "adapter_for": "models.registry", "register_adapter": "models.registry", "ModelFamily": "models.family",
    "family_for": "models.families", "register_family": "models.families",
    "make_step": "runtimes.step", "JaxTransformer": "runtimes.jax_step",
    "TpuTransformer": "runtimes.jax_step", "UlyssesTransformer": "runtimes.ulysses",
    "DeepCacheSchedule": "runtimes.deepcache", "MagCacheSchedule": "runtimes.magcache",
    "Stage2Settings": "pipeline.settings", "resolve_settings": "pipeline.settings",
    "stage1": "pipeline.stages", "stage2": "pipeline.stages", "stage3": "pipeline.stages",
    "generate": "pipeline.stages",
    "load_pipeline": "pipeline.inference", "VideoPipeline": "pipeline.inference", "Video": "pipeline.inference",
    "magcache_schedule": "pipeline.calibration",
    "compile_step": "planning.tpu_compile", "device_plan": "planning.planner", "bounds": "planning.planner",
}


def __getattr__(name: str):
    """Import a public name's module on first use (PEP 562)."""
    if name in _PUBLIC:
        value = getattr(importlib.import_module(f".{_PUBLIC[name]}", __name__), name)
        globals()[name] = value  # later look-ups skip this function
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC])


__all__ = ["__version__", *_PUBLIC]
