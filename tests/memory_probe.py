"""A test helper: the peak bytes of CPU tensors a call holds alive at once, from torch's profiler."""

import warnings

from torch.profiler import ProfilerActivity, profile


def live_peak_bytes(fn) -> int:
    """Peak bytes of the tensors ``fn`` allocates and has alive at once on the CPU: the allocation and free events of
    torch's profiler, in time order (what was allocated before the call is not counted)."""
    with warnings.catch_warnings():  # "Profiler clears events at the end of each cycle": one cycle here
        warnings.simplefilter("ignore", UserWarning)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            fn()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return peak
