"""Step caches for the denoising loop: the DeepCache schedule (which steps run the full network)."""

from __future__ import annotations

from dataclasses import dataclass, field


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

    def block_speedup(self, num_blocks: int, uncached_blocks: int = 1) -> float:
        """Upper bound on the speed-up from skipping blocks alone: blocks run without the cache divided by
        blocks run with it (cached steps still run ``uncached_blocks`` trailing blocks)."""
        cached = self.num_steps - len(self.full_steps)
        return self.num_steps * num_blocks / (len(self.full_steps) * num_blocks + cached * uncached_blocks)
