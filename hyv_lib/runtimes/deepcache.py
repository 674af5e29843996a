"""DeepCache for the denoising loop: the schedule, and a transformer step that skips the deep blocks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from ..models.adapter import ModelAdapter
from ..models.registry import adapter_for


@dataclass(frozen=True)
class DeepCacheSchedule:
    """Which denoising steps run every block ("full") and which reuse the cached deep features.

    A step is full when ``step < start``, when ``start <= step < end`` and ``(step - start) % interval == 0``,
    or when ``step >= end``. The defaults are HunyuanVideo-1.5's (official ``generate.py``: 11 / 45 / 4),
    which make 25 of 50 steps full.
    """

    num_steps: int
    start: int = 11
    end: int = 45
    interval: int = 4
    full_steps: list[int] = field(init=False, repr=False)

    def __post_init__(self):
        for name, value, low in (("num_steps", self.num_steps, 1), ("start", self.start, 0),
                                 ("end", self.end, 0), ("interval", self.interval, 1)):
            if not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        if self.end < self.start:
            raise ValueError(f"end ({self.end}) must be >= start ({self.start})")
        full = [s for s in range(self.num_steps)
                if s < self.start or s >= self.end or (s - self.start) % self.interval == 0]
        object.__setattr__(self, "full_steps", full)

    def is_full(self, step: int) -> bool:
        """True if ``step`` (0-based) runs the whole network and refreshes the cache."""
        if not 0 <= step < self.num_steps:
            raise IndexError(f"step {step} outside 0..{self.num_steps - 1}")
        return step < self.start or step >= self.end or (step - self.start) % self.interval == 0

    def cached_in(self, steps: int) -> int:
        """How many of the first ``steps`` steps reuse the cache (0: a loop that long caches nothing)."""
        return sum(1 for s in range(min(steps, self.num_steps)) if not self.is_full(s))

    def block_speedup(self, num_blocks: int, no_cache_blocks: int = 1) -> float:
        """Upper bound on the speed-up from skipping blocks alone: blocks run without the cache divided by
        blocks run with it (cached steps still run ``no_cache_blocks`` trailing blocks)."""
        return block_speedup(self.num_steps, len(self.full_steps), num_blocks, no_cache_blocks)

    def describe(self) -> str:
        """The schedule in a few words, for messages."""
        return f"cached range {self.start}..{self.end}, interval {self.interval}"

    def settings(self) -> dict[str, Any]:
        """The generation_config.json fields of this schedule (the CLI flags' names)."""
        return dict(cache_method="deepcache", cache_start_step=self.start, cache_end_step=self.end,
                    cache_step_interval=self.interval)


def block_speedup(num_steps: int, full_steps: int, num_blocks: int, no_cache_blocks: int = 1) -> float:
    """Blocks run by ``num_steps`` uncached steps over blocks run when only ``full_steps`` of them run every block
    and the others run ``no_cache_blocks`` trailing blocks: the speed-up bound of any step cache here."""
    cached = num_steps - full_steps
    return num_steps * num_blocks / (full_steps * num_blocks + cached * no_cache_blocks)


class CacheableRuntime(Protocol):
    """What a runtime offers DeepCache: a full forward that also returns the cache, and a cached forward."""

    def run_and_cache(self, no_cache_blocks: int, **forward_kwargs) -> tuple[torch.Tensor, Any]: ...

    def run_from_cache(self, cache: Any, no_cache_blocks: int, **forward_kwargs) -> torch.Tensor: ...


class TorchDeepCache:
    """The eager-torch halves of DeepCache around diffusers' own forward.

    A full step *is* ``model(**kwargs)``, with a pre-hook on the first uncached block recording what enters
    it (video and context tokens, the block inputs such as HunyuanVideo-1.5's 1-D mask, RoPE; read by the adapter's
    :meth:`~hyv_lib.models.adapter.ModelAdapter.block_call`), or with ``no_cache_blocks=0`` a hook on the last block
    recording what leaves it, so a schedule of only full steps gives exactly the uncached latents. A cached step
    recomputes the timestep embedding, runs the last blocks (none for 0) on the recorded tokens, and applies the
    output layer. Each step's keyword arguments (MeanFlow's ``timestep_r`` included) reach both halves.
    ``adapter``: the model's glue (default: the registered one for its class).
    """

    def __init__(self, model, adapter: ModelAdapter | None = None):
        self.adapter = adapter_for(model, adapter)
        self.adapter.check(model, "DeepCache")
        self.model = model

    def _tail(self, no_cache_blocks: int):
        blocks = self.adapter.blocks(self.model)
        return blocks[len(blocks) - no_cache_blocks:]  # empty for 0

    @torch.no_grad()
    def run_and_cache(self, no_cache_blocks: int, **kwargs) -> tuple[torch.Tensor, Any]:
        self.adapter.check_timestep_r(self.model, kwargs.get("timestep_r"))
        recorded = {}

        def record(module, args, block_kwargs):
            # (video, context, temb, inputs, rope): temb is recomputed per step
            recorded["inputs"] = self.adapter.block_call(args, block_kwargs)

        def record_output(module, args, block_kwargs, output):  # no_cache_blocks=0: what leaves the last block
            _, _, *rest = self.adapter.block_call(args, block_kwargs)
            recorded["inputs"] = (*output, *rest)
        if no_cache_blocks:
            handle = self._tail(no_cache_blocks)[0].register_forward_pre_hook(record, with_kwargs=True)
        else:
            handle = self.adapter.blocks(self.model)[-1].register_forward_hook(record_output, with_kwargs=True)
        try:
            out = self.model(**kwargs, return_dict=False)[0]
        finally:
            handle.remove()
        video, context, _, inputs, rope = recorded["inputs"]
        return out, (video, context, inputs, rope)

    @torch.no_grad()
    def run_from_cache(self, cache: Any, no_cache_blocks: int, hidden_states, timestep, timestep_r=None,
                       **conditioning) -> torch.Tensor:
        a = self.adapter
        a.check_timestep_r(self.model, timestep_r)
        video, context, inputs, rope = cache
        a.note_latent_shape(self.model, tuple(hidden_states.shape))  # this step's token grid (SSTA's tiles)
        temb = a.time_embedding(self.model, timestep, timestep_r)  # as the model's forward computes it
        temb = a.condition_embedding(self.model, temb, {**inputs, **a.condition_inputs(self.model, **conditioning)})
        for block in self._tail(no_cache_blocks):
            video, context = a.run_block(block, video, context, temb, inputs, rope)
        return a.unpatchify(a.output_tokens(self.model, video, temb), hidden_states.shape)


class DeepCacheStep:
    """A transformer step that runs every block only on the schedule's full steps (DeepCache).

    On full steps the runtime runs the whole network and keeps the tokens entering the last
    ``no_cache_blocks`` blocks; on cached steps it recomputes only the timestep embedding, those blocks and
    the output layer. ``no_cache_blocks=0`` caches the tokens leaving the whole block stack: a cached step is
    then the output layer alone (with the fresh timestep), the cheapest step and the coarsest. CFG's two
    branches are one batch, so they are cached together. The step counts its calls; the denoising loop calls
    :meth:`reset` before its first step, so warmup calls do not shift the schedule. On the TPU runtime the full
    and cached steps are two jitted functions chosen by a Python branch, so nothing recompiles from step to step.
    Full or cached is decided from the call count and the schedule's precomputed plan alone (no tensor, no timing,
    nothing local to a process), so the ranks of a Ulysses run, given the same schedule
    (:meth:`hyv_lib.runtimes.ulysses.UlyssesTransformer.agreed_schedule`), take the same decision at every step.
    """

    def __init__(self, runtime: CacheableRuntime, schedule: DeepCacheSchedule, no_cache_blocks: int = 1):
        num_blocks = _num_blocks(runtime)
        if not isinstance(no_cache_blocks, int) or not 0 <= no_cache_blocks <= num_blocks:
            raise ValueError(f"no_cache_blocks (--no_cache_blocks) must be an integer in 0..{num_blocks} "
                             f"(the model has {num_blocks} blocks), got {no_cache_blocks!r}")
        self.runtime, self.schedule, self.no_cache_blocks = runtime, schedule, no_cache_blocks
        self.reset()

    def reset(self) -> None:
        """Forget the cache and restart the step count (a new denoising run)."""
        self.calls, self.full_calls, self.cached_calls, self.cache = 0, 0, 0, None
        self.skipped_steps: list[int] = []

    def __call__(self, **kwargs) -> torch.Tensor:
        index, self.calls = self.calls, self.calls + 1
        if index == self.schedule.num_steps:  # once: every later call runs full, which is rarely what was meant
            import warnings

            warnings.warn(f"DeepCacheStep called more than its schedule's {self.schedule.num_steps} steps: the "
                          "extra calls run every block; call reset() before each denoising loop", stacklevel=2)
        full = self.cache is None or index >= self.schedule.num_steps or self.schedule.is_full(index)
        if full:
            self.full_calls += 1
            out, self.cache = self.runtime.run_and_cache(self.no_cache_blocks, **kwargs)
            return out
        self.cached_calls += 1
        self.skipped_steps.append(index)
        return self.runtime.run_from_cache(self.cache, self.no_cache_blocks, **kwargs)


def step_times(runtime: CacheableRuntime, no_cache_blocks: int = 1, rounds: int = 15,
               **forward_kwargs) -> tuple[float, float]:
    """Median seconds of a full step (``run_and_cache``) and of a cached step (``run_from_cache``) of ``runtime`` on
    the same inputs: one warm-up call each, then ``rounds`` interleaved rounds, so a busy machine slows both alike."""
    import time

    with torch.no_grad():
        _, cache = runtime.run_and_cache(no_cache_blocks, **forward_kwargs)  # fills the cache, warms the full step
        runtime.run_from_cache(cache, no_cache_blocks, **forward_kwargs)
        times: tuple[list[float], list[float]] = ([], [])
        for _ in range(rounds):
            for kind, call in enumerate((lambda: runtime.run_and_cache(no_cache_blocks, **forward_kwargs),
                                         lambda: runtime.run_from_cache(cache, no_cache_blocks, **forward_kwargs))):
                start = time.perf_counter()
                call()
                times[kind].append(time.perf_counter() - start)
    return tuple(sorted(t)[len(t) // 2] for t in times)


def _num_blocks(runtime) -> int:
    return len(runtime.adapter.blocks(runtime.model))
