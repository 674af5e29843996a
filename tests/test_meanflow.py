"""MeanFlow (step-distilled) models: ``timestep_r`` reaches every runtime, each equal to diffusers' eager forward."""

import copy
import dataclasses
import os
import textwrap

import pytest
import torch

from hyv_lib.models.hunyuan_video15.presets import TINY
from hyv_lib.models.components import build_tiny_components
from hyv_lib.models.hunyuan_video15.components import example_forward_kwargs
from hyv_lib.runtimes.deepcache import DeepCacheSchedule, TorchDeepCache
from hyv_lib.runtimes.step import make_step

MEANFLOW = dataclasses.replace(TINY, transformer=dict(TINY.transformer, use_meanflow=True))
# Max errors measured against diffusers (fp32, i2v with real padding; outputs up to |x| = 1.8): torch runtime 2.4e-7,
# jax runtime 8.0e-7 on one device and 9.5e-7 on data=2,tensor=4, Ulysses on 2 ranks 3.6e-7, tpu DeepCache 7.7e-7.
TOL = 5e-6
# Moving timestep_r from 500 to 0 (or dropping it) moves the output by 0.12: 2e4 x TOL.
EFFECT = 1e3 * TOL


def kwargs(r=500.0, preset=MEANFLOW, seed=0):
    """Image-to-video forward kwargs (non-zero image embeddings, real text padding) plus ``timestep_r`` (None: none)."""
    extra = {} if r is None else {"timestep_r": torch.tensor([r, r])}
    return dict(example_forward_kwargs(preset, seed=seed, image=True), **extra)


def diffusers_forward(model, kw):
    with torch.no_grad():
        return model(**kw, return_dict=False)[0]


def max_err(a, b):
    return (a - b).abs().max().item()


@pytest.fixture(scope="module")
def oracle():
    """The tiny MeanFlow transformer with diffusers' own attention processor (runtimes get copies)."""
    return build_tiny_components(MEANFLOW, names=["transformer"])["transformer"]


@pytest.fixture(scope="module")
def expected(oracle):
    return {r: diffusers_forward(oracle, kwargs(r)) for r in (500.0, 250.0)}


def test_timestep_r_changes_the_output(oracle, expected):
    """So the runtime tests can fail: a runtime that drops timestep_r (or zeroes it) is far outside TOL."""
    assert oracle.time_embed.timestep_embedder_r is not None
    for other in (None, 0.0):
        assert max_err(expected[500.0], diffusers_forward(oracle, kwargs(other))) > EFFECT


def test_torch_runtime(oracle, expected):
    step = make_step(copy.deepcopy(oracle), "torch")  # hyv_lib's masked attention inside diffusers' forward
    for r in (500.0, 250.0):
        assert max_err(step(**kwargs(r)), expected[r]) <= TOL


def test_tpu_runtime_takes_timestep_r_as_a_traced_input(oracle, expected):
    tpu = make_step(copy.deepcopy(oracle), "jax")
    for r in (500.0, 250.0):
        assert max_err(tpu(**kwargs(r)), expected[r]) <= TOL
    assert tpu.compilations == 1  # a new timestep_r is data, not a new program


def test_timestep_r_on_a_model_without_meanflow_is_a_clear_error():
    """diffusers fails deep in its time embedding (TypeError: 'NoneType' object is not callable); hyv_lib names
    the argument instead. timestep_r=None on a MeanFlow model skips the r-embedding in every runtime, as in diffusers."""
    from hyv_lib.runtimes.jax_step import JaxTransformer

    plain = build_tiny_components(TINY, names=["transformer"])["transformer"]
    for runtime in (JaxTransformer(copy.deepcopy(plain)), make_step(copy.deepcopy(plain), "torch",
                                                                   cache=DeepCacheSchedule(2, 0, 2, 2))):
        with pytest.raises(ValueError, match="timestep_r"):
            runtime(**kwargs(500.0, TINY))


def test_deepcache_on_torch(oracle, expected):
    """Mirrors tests/test_cache.py: the full step is diffusers' forward; a cached step on the same input gives it
    again (so the cached step embeds timestep_r too), and a new timestep_r changes the cached step."""
    runtime = TorchDeepCache(oracle)
    full, cache = runtime.run_and_cache(1, **kwargs(500.0))
    assert torch.equal(full, expected[500.0])
    torch.testing.assert_close(runtime.run_from_cache(cache, 1, **kwargs(500.0)), full, rtol=0, atol=1e-6)
    assert max_err(runtime.run_from_cache(cache, 1, **kwargs(250.0)), full) > EFFECT


def test_deepcache_on_tpu(oracle, expected):
    """A full step then cached steps through DeepCacheStep (the pipeline's path): the full step equals diffusers'
    forward, the cached steps equal the torch DeepCache's cached computation; two programs for every timestep_r."""
    schedule = DeepCacheSchedule(3, start=0, end=3, interval=3)  # step 0 full, steps 1 and 2 cached
    step = make_step(copy.deepcopy(oracle), "jax", cache=schedule)
    reference = TorchDeepCache(oracle)
    _, cache = reference.run_and_cache(1, **kwargs(500.0))
    assert max_err(step(**kwargs(500.0)), expected[500.0]) <= TOL
    for r in (500.0, 250.0):
        assert max_err(step(**kwargs(r)), reference.run_from_cache(cache, 1, **kwargs(r))) <= TOL
    assert (step.full_calls, step.cached_calls) == (1, 2)
    assert step.runtime.compilations == 2  # one full program, one cached program


def test_compile_only_path_lowers_timestep_r_as_an_input():
    """``python -m hyv_lib compile`` of a MeanFlow preset: its example inputs carry timestep_r, and the step lowered
    from the meta-device model takes it as a traced [B] input."""
    from hyv_lib.planning.tpu_compile import abstract_transformer, example_inputs
    from hyv_lib.runtimes.jax_step import JaxTransformer

    assert "timestep_r" not in example_inputs(TINY, 128, 128, 5)
    inputs = example_inputs(MEANFLOW, 128, 128, 5, dtype=torch.float32)
    step = JaxTransformer(abstract_transformer(MEANFLOW, torch.float32), mesh="tensor=1")
    for method in ("forward", "forward_and_cache"):
        assert step.lower(**inputs, method=method).args_info[1]["timestep_r"].shape == (2,)


def ulysses_outputs(model, cases):
    """Each case's Ulysses forward on this rank (module level, so run_distributed's ranks can import it)."""
    from hyv_lib.runtimes.ulysses import UlyssesTransformer

    ulysses = UlyssesTransformer(model)
    return [ulysses(**kw) for kw in cases]


def test_ulysses_on_two_gloo_processes(oracle, expected):
    from hyv_lib.parallel.distributed import run_distributed

    outs = run_distributed(ulysses_outputs, 2, copy.deepcopy(oracle), [kwargs(500.0), kwargs(250.0)], timeout=240)
    for out, r in zip(outs, (500.0, 250.0)):
        assert max_err(out, expected[r]) <= TOL


SHARDED_PROBE = textwrap.dedent("""
    import os, copy, dataclasses, json, sys
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    import torch
    sys.path.insert(0, sys.argv[1])
    from test_meanflow import MEANFLOW, diffusers_forward, kwargs, max_err
    from hyv_lib.models.components import build_tiny_components
    from hyv_lib.runtimes.jax_step import JaxTransformer
    # 8 heads of the tiny size (16), so data=2 x tensor=4 can split them
    preset = dataclasses.replace(MEANFLOW, transformer=dict(MEANFLOW.transformer, num_attention_heads=8))
    oracle = build_tiny_components(preset, names=["transformer"])["transformer"]
    tpu = JaxTransformer(copy.deepcopy(oracle), mesh="data=2,tensor=4")
    errors = [max_err(tpu(**kwargs(r, preset)), diffusers_forward(oracle, kwargs(r, preset))) for r in (500.0, 250.0)]
    print(json.dumps(dict(errors=errors, compilations=tpu.compilations)))
""")


@pytest.mark.slow  # its own process (8 emulated CPU devices need XLA_FLAGS before JAX starts)
def test_tpu_runtime_sharded_on_eight_devices(run_probe):
    result = run_probe("-c", SHARDED_PROBE, os.path.dirname(__file__))
    assert max(result["errors"]) <= TOL, result
    assert result["compilations"] == 1
