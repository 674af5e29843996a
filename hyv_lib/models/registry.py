"""The model adapters by name, by model class and by what they take (the three families', register_adapter)."""

from __future__ import annotations

from ..base.errors import HyvInputError
from .adapter import ModelAdapter
from .cogvideox.adapter import COGVIDEOX
from .hunyuan_video.adapter import HUNYUAN_VIDEO
from .hunyuan_video15.adapter import HUNYUAN_VIDEO_15

#: Registered adapters by name.
ADAPTERS: dict[str, ModelAdapter] = {a.name: a for a in (HUNYUAN_VIDEO_15, COGVIDEOX, HUNYUAN_VIDEO)}


def register_adapter(adapter: ModelAdapter) -> ModelAdapter:
    """Add ``adapter`` (an instance) to :data:`ADAPTERS`; :func:`adapter_for` then finds it for its model classes."""
    if not adapter.name or not adapter.model_classes:
        raise ValueError("an adapter needs a name and the model class names it runs")
    ADAPTERS[adapter.name] = adapter
    return adapter


def get_adapter(name: str) -> ModelAdapter:
    """The registered adapter called ``name``."""
    if name not in ADAPTERS:
        raise HyvInputError("model", f"must be one of {', '.join(ADAPTERS)}, got {name!r}")
    return ADAPTERS[name]


def adapter_for(model, adapter: ModelAdapter | None = None) -> ModelAdapter:
    """``adapter`` if given, else the registered adapter whose model classes include ``model``'s class (or a base
    class of it); a ValueError names the class when none does."""
    if adapter is not None:
        return adapter
    names = [cls.__name__ for cls in type(model).__mro__]
    for candidate in ADAPTERS.values():
        if any(name in candidate.model_classes for name in names):
            return candidate
    known = ", ".join(c for a in ADAPTERS.values() for c in a.model_classes)
    raise ValueError(f"no model adapter runs {type(model).__name__} (adapters for: {known}); pass adapter=... "
                     "(a hyv_lib.models.adapter.ModelAdapter) or register one with register_adapter")


def adapters_with(capability: str) -> list[str]:
    """The names of the registered adapters whose attribute ``capability`` (e.g. ``runs_ssta``, ``takes_lora_files``:
    :class:`hyv_lib.models.adapter.ModelAdapter`'s capability flags) is true, for messages that say what does take a
    setting."""
    return [name for name, adapter in ADAPTERS.items() if getattr(adapter, capability)]
