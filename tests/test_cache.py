"""DeepCache schedule: the published 11/45/4 plan and its edge cases."""

import pytest

from hyv_lib.runtimes.deepcache import DeepCacheSchedule


def test_default_schedule_has_25_full_steps_of_50():
    schedule = DeepCacheSchedule(50)
    assert schedule.full_steps == list(range(11)) + [11, 15, 19, 23, 27, 31, 35, 39, 43] + list(range(45, 50))
    assert len(schedule.full_steps) == 25
    assert [schedule.is_full(s) for s in (10, 11, 12, 14, 15, 44, 45)] == [True, True, False, False, True, False, True]


def test_block_count_speedup_bound():
    # 25 full steps x 54 blocks + 25 cached steps x 1 block, vs 50 x 54: the 1.96x of the issue
    assert DeepCacheSchedule(50).block_speedup(54, 1) == pytest.approx(50 * 54 / (25 * 54 + 25), rel=1e-12)
    assert round(DeepCacheSchedule(50).block_speedup(54), 2) == 1.96


def test_every_step_full_when_interval_is_one_or_range_empty():
    assert DeepCacheSchedule(20, start=5, end=15, interval=1).full_steps == list(range(20))
    assert DeepCacheSchedule(20, start=7, end=7).full_steps == list(range(20))


@pytest.mark.parametrize("kwargs", [dict(num_steps=0), dict(num_steps=10, interval=0),
                                    dict(num_steps=10, start=5, end=3), dict(num_steps=10, start=-1)])
def test_bad_schedules_raise(kwargs):
    with pytest.raises(ValueError):
        DeepCacheSchedule(**kwargs)


def test_step_outside_the_schedule():
    with pytest.raises(IndexError):
        DeepCacheSchedule(10).is_full(10)


# ------------------------------------------------------------------------------------- the cached step
import copy  # noqa: E402

import torch  # noqa: E402
from tiny_inputs import TINY, forward_kwargs  # noqa: E402

from hyv_lib.models.hunyuan_video15.sampling import denoise  # noqa: E402
from hyv_lib.runtimes.deepcache import DeepCacheStep, TorchDeepCache  # noqa: E402
from hyv_lib.runtimes.step import make_step, torch_step  # noqa: E402


@pytest.fixture(scope="module")
def model():
    from hyv_lib.models.components import build_tiny_components

    return build_tiny_components(TINY, names=["transformer"])["transformer"]


def run_loop(step, steps=8, warmup=0):
    """The pipeline's own CFG loop on tiny latents with real padding in the masks."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    kwargs = forward_kwargs(seed=1)
    conditioning = {k: v for k, v in kwargs.items() if k not in ("hidden_states", "timestep")}
    latents = torch.randn(1, TINY.latent_channels, 2, 6, 10, generator=torch.Generator().manual_seed(3))
    return denoise(step, latents, conditioning, FlowMatchEulerDiscreteScheduler(shift=5.0), num_inference_steps=steps,
                   guidance_scale=6.0, warmup_steps=warmup, progress=False)


def count_block_calls(model):
    counts = [0] * len(model.transformer_blocks)
    handles = [b.register_forward_hook(lambda *_, i=i: counts.__setitem__(i, counts[i] + 1))
               for i, b in enumerate(model.transformer_blocks)]
    return counts, handles


def test_all_full_schedule_gives_exactly_the_uncached_latents(model):
    every_step = DeepCacheSchedule(8, start=0, end=8, interval=1)
    cached = make_step(model, "torch", cache=every_step)
    with pytest.warns(UserWarning, match="caches none"):  # a schedule like this is almost always a mistake
        latents = run_loop(cached)
    assert torch.equal(latents, run_loop(torch_step(model)))
    assert (cached.full_calls, cached.cached_calls) == (8, 0)


def test_cached_steps_skip_the_deep_blocks(model):
    schedule = DeepCacheSchedule(8, start=2, end=8, interval=3)  # full: 0, 1, 2, 5
    assert schedule.full_steps == [0, 1, 2, 5]
    step = make_step(model, "torch", cache=schedule, no_cache_blocks=1)
    counts, handles = count_block_calls(model)
    try:
        run_loop(step, warmup=2)
    finally:
        for h in handles:
            h.remove()
    # warmup: 2 full calls; the loop: 4 full + 4 cached (the reset keeps warmup from shifting the schedule)
    assert (step.full_calls, step.cached_calls) == (4, 4)
    assert counts == [2 + 4, 2 + 8]  # block 0 runs on full steps only, the last block on every step


def test_caching_the_whole_stack_runs_no_block_on_cached_steps(model):
    """--no_cache_blocks 0: cached steps are the output layer alone; an all-full schedule is still the uncached run."""
    schedule = DeepCacheSchedule(8, start=2, end=8, interval=3)  # full: 0, 1, 2, 5
    step = make_step(model, "torch", cache=schedule, no_cache_blocks=0)
    counts, handles = count_block_calls(model)
    try:
        cached = run_loop(step)
    finally:
        for h in handles:
            h.remove()
    assert counts == [4, 4] and (step.full_calls, step.cached_calls) == (4, 4)
    plain = run_loop(torch_step(model))
    assert not torch.equal(cached, plain) and (cached - plain).abs().max() < 0.5 * plain.abs().max()
    with pytest.warns(UserWarning, match="caches none"):
        every = run_loop(make_step(model, "torch", cache=DeepCacheSchedule(8, start=0, end=8, interval=1),
                                   no_cache_blocks=0))
    assert torch.equal(every, plain)


@pytest.mark.parametrize("no_cache_blocks", [1, 0])
def test_a_cached_step_on_the_same_input_reproduces_the_full_step(model, no_cache_blocks):
    runtime = TorchDeepCache(model)
    kwargs = forward_kwargs(seed=2)
    full, cache = runtime.run_and_cache(no_cache_blocks, **kwargs)
    torch.testing.assert_close(runtime.run_from_cache(cache, no_cache_blocks, **kwargs), full, rtol=0, atol=1e-6)
    with torch.no_grad():
        oracle = model(**kwargs).sample
    assert torch.equal(full, oracle)


def test_cache_changes_the_result_only_a_little_and_warmup_changes_nothing(model):
    schedule = DeepCacheSchedule(8, start=2, end=8, interval=3)
    plain = run_loop(torch_step(model))
    cached = run_loop(make_step(model, "torch", cache=schedule))
    assert not torch.equal(plain, cached)
    assert (cached - plain).abs().max() < 0.5 * plain.abs().max()
    assert torch.equal(cached, run_loop(make_step(model, "torch", cache=schedule), warmup=2))


def test_tpu_runtime_agrees_and_compiles_two_programs(model):
    from hyv_lib.runtimes.jax_step import JaxTransformer

    schedule = DeepCacheSchedule(8, start=2, end=8, interval=3)
    reference = run_loop(make_step(copy.deepcopy(model), "torch", cache=schedule))
    tpu = JaxTransformer(copy.deepcopy(model), attention="xla")
    step = DeepCacheStep(tpu, schedule)
    latents = run_loop(step)
    torch.testing.assert_close(latents, reference, rtol=0, atol=1e-5)
    assert tpu.compilations == 2  # one full program, one cached program, for all 8 steps
    whole_stack = run_loop(DeepCacheStep(tpu, schedule, no_cache_blocks=0))  # two more programs: 0 blocks cached
    torch.testing.assert_close(whole_stack, run_loop(make_step(copy.deepcopy(model), "torch", cache=schedule,
                                                               no_cache_blocks=0)), rtol=0, atol=1e-5)
    assert tpu.compilations == 4 and not torch.allclose(whole_stack, latents, atol=1e-3)
    every_step = DeepCacheStep(tpu, DeepCacheSchedule(8, start=0, end=8, interval=1))
    with pytest.warns(UserWarning, match="caches none"):
        latents = run_loop(every_step)
    torch.testing.assert_close(latents, run_loop(tpu), rtol=0, atol=1e-6)


def test_bad_cache_settings_name_the_flag(model):
    from hyv_lib.base.errors import HyvInputError
    from hyv_lib.pipeline.settings import resolve_settings

    with pytest.raises(HyvInputError, match="no_cache_blocks"):
        make_step(model, "torch", cache=DeepCacheSchedule(8), no_cache_blocks=3)
    assert resolve_settings(TINY, enable_cache=True, runtime="ulysses").enable_cache  # tests/test_cache_parallel.py
    with pytest.raises(HyvInputError, match="enable_cache"):  # still refused: the offload's hooks and the cache's
        resolve_settings(TINY, enable_cache=True, offload="block")
    with pytest.raises(HyvInputError, match="cache_end_step"):
        resolve_settings(TINY, enable_cache=True, cache_start_step=5, cache_end_step=2)
    with pytest.raises(HyvInputError, match="cache_step_interval"):
        resolve_settings(TINY, enable_cache=True, cache_step_interval=0)
    settings = resolve_settings(TINY, enable_cache=True, cache_start_step=1, cache_end_step=6)
    assert settings.enable_cache and settings.cache_step_interval == 4 and settings.no_cache_blocks == 1
    assert "cache_start_step" not in resolve_settings(TINY).config()


def test_a_schedule_that_does_not_fit_the_loop_warns(model):
    """A 50-step schedule in an 8-step loop caches nothing and says so; calls past the schedule warn once."""
    model = copy.deepcopy(model)
    with pytest.warns(UserWarning) as record:
        run_loop(make_step(model, "torch", cache=DeepCacheSchedule(50)))
    messages = " ".join(str(w.message) for w in record)
    assert "50 steps but the loop runs" in messages and "caches none" in messages
    step = make_step(model, "torch", cache=DeepCacheSchedule(2, 0, 2, 2))
    kwargs = forward_kwargs(0)
    with pytest.warns(UserWarning, match="more than its schedule's 2 steps"):
        for _ in range(3):
            step(**kwargs)


def test_step_times_sees_a_cached_step_cheaper_than_a_full_one(model):
    """Two blocks: a cached step with none recomputed skips both, so it is cheaper than a full step."""
    from hyv_lib.runtimes.deepcache import step_times

    full, cached = step_times(TorchDeepCache(model), 0, rounds=5, **forward_kwargs(seed=2))
    assert 0 < cached < full
