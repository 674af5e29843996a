"""The stages' settings: stage 2's typed list and its resolution against a preset, stage 3's VAE checks."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from ..base.checks import as_number
from ..base.errors import HyvInputError
from ..base.presets import DEFAULT_SEED, Preset, check_data_axis, samples_per_step, video_size
from ..kernels.registry import BACKENDS
from ..kernels.ssta import SstaConfig
from ..models.lora import lora_file
from ..models.registry import adapters_with, get_adapter
from ..parallel.jax_env import init_multi_host, jax_devices, multi_host_joined
from ..parallel.mesh import ONE_DEVICE, default_mesh, make_mesh, mesh_text, parse_mesh
from ..parallel.sharding import DEFAULT_STRATEGY, STRATEGIES
from ..runtimes.compiled import check_compile
from ..runtimes.fsdp import check_shard_weights
from ..runtimes.magcache import DEFAULT_MAX_SKIP, DEFAULT_RETENTION, DEFAULT_THRESHOLD
from ..runtimes.names import RUNTIMES, runtime_choices, runtime_name
from ..runtimes.placement import OFFLOAD_MODES, offload_applies
from ..runtimes.step import check_attention
from .size_check import check_fits

#: The step caches (``--cache_method``): DeepCache's fixed schedule, or the adaptive MagCache-style one
#: (:mod:`hyv_lib.runtimes.magcache`). Both run DeepCache's full and cached programs.
CACHE_METHODS = ("deepcache", "magcache")
#: Upper bounds of ``--guidance_scale`` and ``--flow_shift``, far above every preset's value (guidance 1 to 6, shift 3
#: to 9): a huge finite value only broke the run late (``guidance_scale=1e308``: Inf latents, a black video;
#: ``flow_shift=1e308``: NaN timesteps, an IndexError in the scheduler).
MAX_GUIDANCE_SCALE = 100.0
MAX_FLOW_SHIFT = 1000.0


#: The ``--help`` groups of the stage-2 flags, by a field's ``group``.
SETTING_GROUPS = {"denoising": "stage 2: denoising", "cache": "stage 2: DeepCache (torch, jax and ulysses runtimes)"}


def setting(default: Any, help: str, *, group: str = "denoising", kind: Any = None) -> Any:
    """A :class:`Stage2Settings` field and its flag ``--<name>``, described once: ``help`` (its ``--help`` text, and
    its line in the class's documentation), the ``group`` of :data:`SETTING_GROUPS` it is listed in, and ``kind``, how
    the flag parses (None: the annotation's type, a switch for a bool; ``"true_false"``: ``--flag`` or ``--flag
    true|false``, as the official scripts take ``--sparse_attn``; ``"ssta_fields"``: one ``--ssta_<field>`` flag per
    field of :class:`hyv_lib.SstaConfig`)."""
    return dataclasses.field(default=default, metadata={"help": help, "group": group, "kind": kind})


# ----------------------------------------------------------------------------------------------- validation
@dataclasses.dataclass(frozen=True)
class Stage2Settings:
    """Every stage-2 setting, with its default: the one list that :func:`stage2`, :func:`generate`,
    :class:`hyv_lib.pipeline.batch.BatchRunner`, :class:`hyv_lib.VideoPipeline` and the CLI share; each field is
    one flag of the same name (``python -m hyv_lib stage2 --help``). None takes the preset's value;
    :func:`resolve_settings` checks types and ranges."""

    aspect_ratio: str = setting("16:9", "W:H, picks the preset's resolution bucket (default 16:9)")
    height: int | None = setting(None, "pixels, multiple of 16 (overrides --aspect_ratio)")
    width: int | None = setting(None, "pixels, multiple of 16 (overrides --aspect_ratio)")
    video_length: int | None = setting(None, "frames, 4n+1 (default: the preset's)")
    num_inference_steps: int | None = setting(None, "denoising steps (default: the preset's)")
    guidance_scale: float | None = setting(None, "CFG scale >= 1 (default: the preset's)")
    flow_shift: float | None = setting(
        None, "sigma shift (default: the preset's; HunyuanVideo-1.5 only, CogVideoX's scheduler has none)")
    seed: int = setting(DEFAULT_SEED, f"seed of the initial noise (default {DEFAULT_SEED})")
    warmup_steps: int = setting(
        0, "untimed transformer calls before the loop; they never touch the scheduler or change the result "
           "(default 0)")
    runtime: str = setting(
        "torch", "torch (eager diffusers) | jax (torchax/JAX jit on the present JAX backend; tpu is an alias) | "
                 "ulysses (sequence parallel; launch with torchrun --nproc_per_node=N)")
    mesh: str | None = setting(
        None, "jax runtime: device mesh, e.g. tensor=8 or data=2,tensor=4, or 1 for one device (default: every "
              "device, as compile lays them out: data=2 for the CFG pair, tensor = the rest, as far as the heads "
              "split; the mesh used is printed and recorded)")
    sharding: str = setting(
        DEFAULT_STRATEGY, "jax runtime on more than one device (a --mesh, or the default one): "
                          f"{' | '.join(STRATEGIES)} (default {DEFAULT_STRATEGY})")
    enable_cache: bool = setting(False, "reuse deep features on the schedule's cached steps", group="cache")
    cache_method: str | None = setting(
        None, "deepcache (the fixed schedule of the --cache_*_step flags) | magcache (adaptive: skips by a "
              "calibrated per-step curve) (default deepcache)", group="cache")
    cache_start_step: int = setting(11, "first step of the cached range (default 11)", group="cache")
    cache_end_step: int = setting(45, "steps from here on are full again (default 45)", group="cache")
    cache_step_interval: int = setting(4, "in the range, every N-th step is full (default 4)", group="cache")
    no_cache_blocks: int = setting(
        1, "trailing blocks recomputed on cached steps; 0: a cached step runs only the output layer (default 1)",
        group="cache")
    cache_threshold: float | None = setting(
        None, "magcache: reuse the cache while the accumulated estimated error stays under this; 0 runs every step "
              f"full (default {DEFAULT_THRESHOLD})", group="cache")
    cache_max_skip: int | None = setting(
        None, f"magcache: at most this many cached steps in a row (default {DEFAULT_MAX_SKIP})", group="cache")
    cache_retention: float | None = setting(
        None, f"magcache: this fraction of the first steps always runs full (default {DEFAULT_RETENTION})",
        group="cache")
    cache_calibration: str | None = setting(
        None, "magcache: calibration JSON of `calibrate_cache` (default: the one shipped with tiny_trained, or, "
              "for a tiny preset, one uncached calibration run first; required for real presets)", group="cache")
    multi_host: bool = setting(
        False, "jax runtime on a multi-host slice: join the hosts (jax.distributed.initialize) first; run the same "
               "command on every host (gcloud ... ssh --worker=all)")
    attention: str | None = setting(
        None, "auto (exact; on CUDA by GPU generation: SDPA (cuDNN) first on Hopper and newer, flash-attn first "
              "before; Splash/XLA for jax) | sdpa | flash | flash3 | sage (lossy) | splash | xla | ssta (SSTA "
              "sparse attention, what the 720p sparse checkpoints were trained with) | ... | diffusers (stock "
              "dense-mask processor, torch runtime only) (default: the preset's: ssta for the sparse 720p "
              "checkpoints, else auto)")
    sparse_attn: bool = setting(
        False, "the official scripts' switch: --attention ssta (--sparse_attn or --sparse_attn true)",
        kind="true_false")
    ssta: Any = setting(
        None, "SSTA's options: a hyv_lib.SstaConfig, or a dict of its fields (flags: --ssta_<field>)",
        kind="ssta_fields")
    offload: str | None = setting(
        None, "torch runtime: block (the transformer's weights stay on the host, one block at a time is streamed "
              "to the GPU: about a quarter of the GPU memory at 480p on an H200, 3.5% slower) | model (the "
              "transformer is on the GPU for the denoising loop only, so the VAE decode after it has the card); "
              "without a GPU neither does anything (one warning line; recorded as offload_requested and "
              "offload_applied) (default: off)")
    shard_weights: str | None = setting(
        None, "fsdp: split the transformer's weights over the torchrun ranks (PyTorch FSDP2; each rank holds 1/N "
              "of them and gathers one block at a time) with --runtime ulysses (or torch: every rank computes the "
              "whole step) (default: off, every rank holds all of them)")
    lora: str | None = setting(
        None, "a LoRA in diffusers' format: the .safetensors file, or the folder holding "
              "pytorch_lora_weights.safetensors (what `train` writes); merged into the transformer's weights "
              "before the step is built, on every runtime (default: none)")
    lora_scale: float = setting(
        1.0, "the LoRA's strength: W += scale x alpha/rank x B @ A (default 1.0; 0 leaves the model as is)")
    compile: bool = setting(
        False, "torch and ulysses runtimes: torch.compile the transformer blocks (one compiled program shared by "
               "all of them; inductor fuses the norms, modulation, RoPE and copies around the matmuls and the "
               "attention). The first step compiles (an extra untimed warm-up call when --warmup_steps is 0); "
               "another size, frame count or batch compiles again. Not with --offload block; the jax runtime is "
               "always compiled (default: off)")

    @classmethod
    def from_kwargs(cls, kwargs: dict[str, Any]) -> "Stage2Settings":
        """The settings of ``kwargs``; an unknown name is a HyvInputError listing the valid ones."""
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(kwargs) - set(names))
        if unknown:
            raise HyvInputError(f"{unknown[0]}", f"is not a stage-2 setting; valid: {', '.join(names)}")
        return cls(**kwargs)


STAGE2_SETTINGS = tuple(f.name for f in dataclasses.fields(Stage2Settings))


def _field_lines() -> str:
    """The fields' documentation, one list item each, from their ``help`` (RST markup characters escaped)."""
    def text(help_text: str) -> str:
        return "".join("\\" + c if c in "*|`_" else c for c in help_text)

    return "\n".join(f"    - ``{f.name}``: {text(f.metadata['help'])}"
                     for f in dataclasses.fields(Stage2Settings))


Stage2Settings.__doc__ += "\n\n    Fields:\n\n" + _field_lines() + "\n"


@dataclasses.dataclass(frozen=True)
class ResolvedSettings:
    """Stage-2 settings after :func:`resolve_settings`: every value checked, Python numbers, the preset's defaults
    filled in and the size resolved. The cache fields hold what was asked (``cache_calibration``: the file given, or
    None); which calibration a MagCache run uses is decided where its schedule is built
    (:func:`hyv_lib.pipeline.calibration.cache_schedule`). :meth:`config` gives the generation_config.json fields."""

    aspect_ratio: str
    height: int
    width: int
    video_length: int
    num_inference_steps: int
    guidance_scale: float
    flow_shift: float
    seed: int
    warmup_steps: int
    runtime: str
    attention: str  #: resolved: the preset's when none was given
    mesh: str | None  #: jax runtime: the mesh used (``1``: one device), the default layout's without --mesh
    sharding: str | None  #: None without a mesh
    enable_cache: bool
    cache_method: str | None  #: ``deepcache`` or ``magcache`` with the cache on, else None
    cache_start_step: int
    cache_end_step: int
    cache_step_interval: int
    no_cache_blocks: int
    cache_threshold: float | None  #: magcache only (default filled in)
    cache_max_skip: int | None
    cache_retention: float | None
    cache_calibration: str | None
    multi_host: bool
    offload: str | None = None  #: ``block``, ``model`` or None: as asked (``place_transformer`` takes it)
    offload_applied: bool = False  #: ``offload`` does something: a GPU to offload to (``offload_applies``)
    shard_weights: str | None = None  #: ``fsdp`` or None
    lora: str | None = None  #: the LoRA file (absolute path), or None
    lora_scale: float = 1.0
    ssta: dict[str, Any] | None = None  #: the SSTA options (every field of SstaConfig) when attention takes a grid
    compile: bool = False  #: the transformer blocks torch.compiled (torch and ulysses runtimes)
    mesh_source: str | None = None  #: jax runtime: ``default`` (no mesh given: :func:`default_mesh`) or ``--mesh``

    def attention_options(self) -> dict[str, Any]:
        """The keyword options of the attention backend (:func:`hyv_lib.runtimes.step.make_step`'s
        ``attention_options``): SSTA's :class:`hyv_lib.SstaConfig`, or none."""
        return {} if self.ssta is None else {"ssta": SstaConfig(**self.ssta)}

    def config(self) -> dict[str, Any]:
        """The generation_config.json fields of these settings: the cache method's own fields only when it is on,
        ``multi_host`` only when set (the file format of the staged scripts)."""
        names = ["aspect_ratio", "height", "width", "video_length", "num_inference_steps", "guidance_scale",
                 "flow_shift", "seed", "warmup_steps", "runtime", "attention", "mesh", "sharding", "enable_cache"]
        if self.cache_method == "deepcache":
            names += ["cache_method", "cache_start_step", "cache_end_step", "cache_step_interval", "no_cache_blocks"]
        elif self.cache_method == "magcache":
            names += ["cache_method", "cache_threshold", "cache_max_skip", "cache_retention", "cache_calibration",
                      "no_cache_blocks"]
        if self.mesh_source:
            names.insert(names.index("mesh") + 1, "mesh_source")
        if self.multi_host:
            names.append("multi_host")
        offload = {}
        if self.offload:  # asked for: what applies (None with no GPU to offload to), what was asked, whether it applies
            offload = dict(offload=self.offload if self.offload_applied else None, offload_requested=self.offload,
                           offload_applied=self.offload_applied)
        if self.shard_weights:
            names.append("shard_weights")
        if self.lora:
            names += ["lora", "lora_scale"]
        if self.ssta is not None:
            names.append("ssta")
        if self.compile:
            names.append("compile")
        return {**{name: getattr(self, name) for name in names}, **offload}


def check_model_settings(preset: Preset, settings: Stage2Settings) -> None:
    """HyvInputError naming the first flag that ``preset``'s model does not take, as its adapter says
    (:class:`hyv_lib.models.adapter.ModelAdapter`'s ``takes_flow_shift``, ``takes_lora_files``, ``runs_ssta``):
    CogVideoX1.5 samples with CogVideoXDDIMScheduler (v-prediction, no flow shift), and LoRA files are made for
    HunyuanVideo-1.5's transformer. (A MagCache calibration is checked against the run's preset where it is read: one
    made for HunyuanVideo-1.5 is refused for CogVideoX, one made with ``calibrate_cache --preset cogvideox...``
    runs.)"""
    adapter = get_adapter(preset.model)
    # the preset's own shift (1.0 where there is none) passes
    if not adapter.takes_flow_shift and settings.flow_shift is not None and settings.flow_shift != preset.flow_shift:
        raise HyvInputError("flow_shift", f"{preset.name} samples with a v-prediction scheduler, which has no "
                                          "flow shift: drop it")
    if not adapter.takes_lora_files and settings.lora is not None:
        takes = " and ".join(adapters_with("takes_lora_files"))
        raise HyvInputError("lora", f"LoRA files here are for the transformers of {takes}, not {preset.name}'s")
    if not adapter.runs_ssta and (settings.sparse_attn or settings.attention in ("ssta", "ssta_reference")):
        raise HyvInputError("sparse_attn" if settings.sparse_attn else "attention",
                            f"SSTA is the sparse attention of {', '.join(adapters_with('runs_ssta'))} (its sparse "
                            f"checkpoints), not {preset.name}'s")


def takes_grid(attention: str) -> bool:
    """Whether the attention backend runs on the video's token grid (SSTA and its reference)."""
    return attention in BACKENDS and "grid" in BACKENDS[attention].options


def ssta_options(ssta: Any) -> dict[str, Any]:
    """SSTA's options as every field of :class:`hyv_lib.SstaConfig`: from a SstaConfig, or a dict of overrides of the
    official defaults (the CLI's ``--ssta_<field>`` flags; tile and window may be ``"6,8,8"``); a bad value is a
    HyvInputError naming its flag."""
    if isinstance(ssta, SstaConfig):
        return dataclasses.asdict(ssta)
    if not isinstance(ssta, dict):
        raise HyvInputError("ssta", f"must be a hyv_lib.SstaConfig or a dict of its fields, got {type(ssta).__name__}")
    fields = {f.name: f for f in dataclasses.fields(SstaConfig)}
    values = {}
    for name, value in ssta.items():
        flag = f"ssta_{name.rstrip('_')}"
        if name.rstrip("_") == "lambda":
            name = "lambda_"
        if name not in fields:
            valid = ", ".join("`ssta_" + n.rstrip("_") + "`" for n in fields)
            raise HyvInputError(flag, f"is not an SSTA option; valid: {valid}")
        if name in ("tile", "window") and isinstance(value, str):
            try:
                value = tuple(int(x) for x in value.split(","))
            except ValueError:
                raise HyvInputError(flag, f"must be three positive integers t,h,w (e.g. 6,8,8), got {value!r}") from None
        elif name in ("tile", "window") and isinstance(value, (list, tuple)):
            value = tuple(value)
        values[name] = value
    try:
        return dataclasses.asdict(SstaConfig(**values))
    except (ValueError, TypeError) as err:
        message = str(err)
        name = message.split(" ")[0].removeprefix("SstaConfig.") if message.startswith("SstaConfig.") else "ssta"
        raise HyvInputError(f"ssta_{name.rstrip('_')}" if name != "ssta" else "ssta",
                            message.removeprefix(f"SstaConfig.{name} ")) from None


def resolve_attention(preset: Preset, attention: str | None, sparse_attn: Any, ssta: Any) -> tuple[str, dict | None]:
    """``--attention`` (None: the preset's), ``--sparse_attn`` (the official scripts' switch to SSTA) and SSTA's
    options: the backend's name and, for SSTA, its options as a dict (what generation_config.json records)."""
    if sparse_attn not in (True, False, None):
        raise HyvInputError("sparse_attn", f"must be true or false, got {sparse_attn!r}")
    if sparse_attn:
        if attention is not None and not takes_grid(attention):
            raise HyvInputError("sparse_attn", f"runs `attention` ssta; drop `attention` {attention}")
        attention = attention or "ssta"
    attention = preset.attention if attention is None else attention
    if not takes_grid(attention):
        if ssta is not None:
            given = sorted(ssta) if isinstance(ssta, dict) else ["tile"]
            raise HyvInputError(f"ssta_{given[0].rstrip('_')}" if given else "ssta",
                                f"applies to `attention` ssta (or `sparse_attn`), not {attention!r}")
        return attention, None
    return attention, ssta_options(SstaConfig() if ssta is None else ssta)


def prepare_runtime(settings: Stage2Settings) -> None:
    """The process-wide side effect a run's ``settings`` ask for, done once before they are resolved
    (:func:`resolve_settings` has none): a multi-host run (``multi_host`` on the jax runtime) joins the hosts of its
    slice (:func:`hyv_lib.parallel.jax_env.init_multi_host`), after which JAX sees every host's devices and the mesh
    can be checked. Anything else: nothing."""
    if settings.multi_host and runtime_name(settings.runtime) == "jax":
        init_multi_host()


def resolve_settings(preset: Preset, settings: Stage2Settings | None = None, **kwargs: Any) -> ResolvedSettings:
    """Fill unset stage-2 settings (a :class:`Stage2Settings`, or its fields as keyword arguments) from the preset,
    validate them, and resolve (height, width): a frozen :class:`ResolvedSettings`.

    Bad values raise HyvInputError naming the parameter. Height and width come from the ``aspect_ratio``
    bucket unless both are given. A multi-host run's hosts join in :func:`prepare_runtime`, before this.
    """
    if settings is not None and kwargs:
        raise HyvInputError("settings", "give a Stage2Settings or keyword arguments, not both")
    settings = settings if settings is not None else Stage2Settings.from_kwargs(kwargs)
    s = settings
    check_model_settings(preset, s)
    aspect_ratio, height, width, video_length = s.aspect_ratio, s.height, s.width, s.video_length
    num_inference_steps, guidance_scale, flow_shift = s.num_inference_steps, s.guidance_scale, s.flow_shift
    seed, warmup_steps, mesh, sharding = s.seed, s.warmup_steps, s.mesh, s.sharding
    runtime = runtime_name(s.runtime)  # recorded as ``jax`` when asked as ``tpu``
    enable_cache, cache_start_step, cache_end_step = s.enable_cache, s.cache_start_step, s.cache_end_step
    cache_step_interval, no_cache_blocks, cache_method = s.cache_step_interval, s.no_cache_blocks, s.cache_method
    multi_host = s.multi_host
    attention, ssta = resolve_attention(preset, s.attention, s.sparse_attn, s.ssta)
    # numpy and torch scalars are taken; from here on they are Python numbers (torch's manual_seed takes no np.int64)
    height, width, video_length = video_size(preset, height, width, video_length, aspect_ratio)
    num_inference_steps, seed, warmup_steps = (as_number(name, value, int) for name, value in (
        ("num_inference_steps", num_inference_steps), ("seed", seed), ("warmup_steps", warmup_steps)))
    guidance_scale, flow_shift = (as_number(name, value) for name, value in (("guidance_scale", guidance_scale),
                                                                              ("flow_shift", flow_shift)))
    num_inference_steps = preset.default_steps if num_inference_steps is None else num_inference_steps
    guidance_scale = preset.guidance_scale if guidance_scale is None else guidance_scale
    flow_shift = preset.flow_shift if flow_shift is None else flow_shift
    if num_inference_steps < 1:
        raise HyvInputError("num_inference_steps", f"must be >= 1, got {num_inference_steps}")
    if not 1.0 <= guidance_scale <= MAX_GUIDANCE_SCALE:
        raise HyvInputError("guidance_scale", f"must be >= 1 (1 disables CFG's effect) and <= {MAX_GUIDANCE_SCALE:g} "
                                              f"(the presets use 1 to 6), got {guidance_scale}")
    if not 0 < flow_shift <= MAX_FLOW_SHIFT:
        raise HyvInputError("flow_shift", f"must be > 0 and <= {MAX_FLOW_SHIFT:g} (the presets use 3 to 9; at "
                                          f"{MAX_FLOW_SHIFT:g} even the last of 50 steps starts at sigma 0.95), got "
                                          f"{flow_shift}")
    if seed is None or not 0 <= seed < 2**63:
        raise HyvInputError("seed", f"must be an integer in [0, 2**63), got {seed}")
    if warmup_steps is None or warmup_steps < 0:
        raise HyvInputError("warmup_steps", f"must be >= 0, got {warmup_steps}")
    if runtime not in RUNTIMES:
        raise HyvInputError("runtime", f"must be one of {runtime_choices()}, got {runtime!r}")
    check_fits(height, width, video_length, runtime)  # a size whose decoded video cannot fit in memory: refused now
    check_attention(attention, runtime)
    mesh = None if mesh == "" else mesh  # as if not given
    axes = None if mesh == ONE_DEVICE else parse_mesh(mesh)
    if (axes or mesh == ONE_DEVICE) and runtime != "jax":
        raise HyvInputError("mesh", "needs `runtime` jax")
    if axes:  # a data axis splits the CFG pair; with --guidance_scale 1 there is one sample per step and none
        check_data_axis(axes, samples_per_step(guidance_scale, preset.guidance_embedded), "mesh")
    if multi_host:
        if runtime != "jax":
            raise HyvInputError("multi_host", "needs `runtime` jax")
        if not multi_host_joined():  # until then a host sees only its own devices: the mesh check would be wrong
            raise HyvInputError("multi_host", "the hosts have not joined yet: call "
                                              "hyv_lib.pipeline.settings.prepare_runtime(settings) first")
    if axes:
        try:
            make_mesh(**axes)  # the device count must match before any stage writes a file
        except ValueError as err:
            raise HyvInputError("mesh", str(err)) from None
    mesh_source = None if runtime != "jax" else "--mesh" if mesh is not None else "default"
    if mesh_source == "default":  # every device, as compile lays them out (the step picks the same at its first call)
        batch = samples_per_step(guidance_scale, preset.guidance_embedded)
        layout, why = default_mesh(preset.transformer["num_attention_heads"], batch, sharding)
        mesh = mesh_text(layout)
        if multi_host and layout["data"] * layout["tensor"] * layout["sequence"] < len(jax_devices()):
            raise HyvInputError("mesh", f"the default layout is {mesh} ({why}), and a multi-host run needs "
                                        "every device: give a `mesh` that uses them all")
    if s.offload is not None:
        if s.offload not in OFFLOAD_MODES:
            raise HyvInputError("offload", f"must be one of {', '.join(OFFLOAD_MODES)}, got {s.offload!r}")
        if runtime != "torch":
            raise HyvInputError("offload", f"moves weights to one GPU on `runtime` torch, not {runtime!r}")
        if enable_cache and s.offload == "block":
            raise HyvInputError("offload", "block is not combined with `enable_cache` (the cached step's block hooks "
                                           "and the offload hooks are untested together): choose one")
    check_shard_weights(s.shard_weights, runtime, s.offload)  # under torchrun, ulysses or torch
    check_compile(s.compile, runtime, s.offload)
    lora_scale = 1.0 if s.lora_scale is None else as_number("lora_scale", s.lora_scale)
    lora = None if s.lora is None else lora_file(s.lora, "lora")  # ~ expanded; a missing file refused now
    if lora is None and lora_scale != 1.0:
        raise HyvInputError("lora_scale", "needs `lora`")
    if sharding not in STRATEGIES:
        raise HyvInputError("sharding", f"must be one of {', '.join(STRATEGIES)}, got {sharding!r}")
    magcache_flags = {"cache_threshold": s.cache_threshold, "cache_max_skip": s.cache_max_skip,
                      "cache_retention": s.cache_retention, "cache_calibration": s.cache_calibration}
    if cache_method is not None and cache_method not in CACHE_METHODS:
        raise HyvInputError("cache_method", f"must be one of {', '.join(CACHE_METHODS)}, got {cache_method!r}")
    if cache_method is not None and not enable_cache:
        raise HyvInputError("cache_method", "needs `enable_cache`")
    given = [flag for flag, value in magcache_flags.items() if value is not None]
    if given and cache_method != "magcache":
        raise HyvInputError(given[0], "applies to `enable_cache` `cache_method` magcache only")
    if enable_cache:  # every runtime (ulysses: each rank caches its sequence shard)
        cache_start_step, cache_end_step, cache_step_interval, no_cache_blocks = (
            as_number(name, value, int, low=low) for name, value, low in (
                ("cache_start_step", cache_start_step, 0), ("cache_end_step", cache_end_step, 0),
                ("cache_step_interval", cache_step_interval, 1), ("no_cache_blocks", no_cache_blocks, 0)))
        if cache_end_step < cache_start_step:
            raise HyvInputError("cache_end_step", f"must be >= `cache_start_step` ({cache_start_step}), "
                                                  f"got {cache_end_step}")
        num_layers = preset.transformer.get("num_layers")
        if num_layers is not None and no_cache_blocks > num_layers:
            raise HyvInputError("no_cache_blocks", f"must be at most the model's {num_layers} blocks, "
                                                   f"got {no_cache_blocks}")
    threshold = max_skip = retention = None
    if enable_cache and cache_method == "magcache":
        threshold = as_number("cache_threshold", DEFAULT_THRESHOLD if s.cache_threshold is None
                              else s.cache_threshold, low=0)
        max_skip = as_number("cache_max_skip", DEFAULT_MAX_SKIP if s.cache_max_skip is None else s.cache_max_skip,
                             int, low=1)
        retention = as_number("cache_retention", DEFAULT_RETENTION if s.cache_retention is None
                              else s.cache_retention, low=0, high=1)
        if s.cache_calibration is not None and not isinstance(s.cache_calibration, (str, os.PathLike)):
            raise HyvInputError("cache_calibration", f"must be a file path, got {s.cache_calibration!r}")
    return ResolvedSettings(
        aspect_ratio=aspect_ratio, height=height, width=width, video_length=video_length,
        num_inference_steps=num_inference_steps, guidance_scale=guidance_scale, flow_shift=flow_shift, seed=seed,
        warmup_steps=warmup_steps, runtime=runtime, attention=attention, mesh=mesh,
        sharding=sharding if mesh not in (None, ONE_DEVICE) else None, mesh_source=mesh_source,
        enable_cache=bool(enable_cache), cache_method=(cache_method or "deepcache") if enable_cache else None,
        cache_start_step=cache_start_step, cache_end_step=cache_end_step, cache_step_interval=cache_step_interval,
        no_cache_blocks=no_cache_blocks, cache_threshold=threshold, cache_max_skip=max_skip, cache_retention=retention,
        cache_calibration=None if s.cache_calibration is None else str(s.cache_calibration),
        multi_host=bool(multi_host), offload=s.offload, shard_weights=s.shard_weights, lora=lora,
        offload_applied=runtime == "torch" and offload_applies(s.offload),
        lora_scale=lora_scale, ssta=ssta, compile=bool(s.compile))


def check_vae_settings(vae_dtype: str, vae_memory_gb: Any = None, tiling: bool = True,
                       runtime: str = "torch") -> float | None:
    """``--vae_dtype`` and ``--vae_memory_gb`` (HyvInputError naming the parameter); returns the budget as a float."""
    if vae_dtype not in ("fp32", "bf16"):
        raise HyvInputError("vae_dtype", f"must be fp32 or bf16, got {vae_dtype!r}")
    if vae_memory_gb is None:
        return None
    budget = as_number("vae_memory_gb", vae_memory_gb, low=0, low_open=True)
    if not tiling:
        raise HyvInputError("vae_memory_gb", "picks the tile size of a tiled decode: drop `disable_tiling`")
    if runtime != "torch":
        raise HyvInputError("vae_memory_gb", f"sizes the tiles of the torch decode (its memory model is fitted on "
                                             f"a GPU), not of `runtime` {runtime}")
    return budget


def check_vae_model(preset: Preset, vae_memory_gb: float | None) -> None:
    """``--vae_memory_gb`` sizes tiles with a memory model of HunyuanVideo-1.5's VAE: refused for a model whose
    adapter says its VAE was not measured (:attr:`hyv_lib.models.adapter.ModelAdapter.vae_memory_model`)."""
    if vae_memory_gb is not None and not get_adapter(preset.model).vae_memory_model:
        measured = ", ".join(adapters_with("vae_memory_model"))
        raise HyvInputError("vae_memory_gb", f"its memory model is fitted on the VAE of {measured}, not "
                                             f"{preset.name}'s: drop it (the decode uses the VAE's own tiles)")
