"""Model-agnostic runtimes: a second, different transformer runs on the JAX runtime, sharded, and under DeepCache
through its own ModelAdapter, equal to its own eager forward; HunyuanVideo-1.5's adapter is found by class."""

import copy
import os
import textwrap

import pytest
import torch
from toy_adapter import CONFIG, TOY, toy_inputs, toy_model

from hyv_lib.models.hunyuan_video15.adapter import HUNYUAN_VIDEO_15
from hyv_lib.models.registry import ADAPTERS, adapter_for, get_adapter, register_adapter
from hyv_lib.parallel.sharding import plan
from hyv_lib.runtimes.deepcache import DeepCacheSchedule, DeepCacheStep, TorchDeepCache

TOL = 1e-5  # fp32 on the CPU: the jitted step and the eager forward differ by reordered float sums (~1e-6 seen)


def oracle(model, kwargs):
    with torch.no_grad():
        return model(**kwargs, return_dict=False)[0]


def test_the_registry_finds_hunyuan_by_class_and_refuses_an_unknown_model():
    from hyv_lib.models.families import get_preset
    from hyv_lib.models.components import build_tiny_components

    hunyuan = build_tiny_components(get_preset("tiny"), names=["transformer"])["transformer"]
    assert adapter_for(hunyuan) is HUNYUAN_VIDEO_15 and get_adapter("hunyuanvideo-1.5") is HUNYUAN_VIDEO_15
    with pytest.raises(ValueError, match="no model adapter runs ToyVideoDiT .*register_adapter"):
        adapter_for(toy_model())
    assert adapter_for(toy_model(), TOY) is TOY  # an explicit adapter needs no registration
    register_adapter(TOY)
    try:
        assert adapter_for(toy_model()) is TOY and get_adapter("toy") is TOY
    finally:
        del ADAPTERS["toy"]
    with pytest.raises(ValueError, match="model: must be one of hunyuanvideo-1.5, cogvideox, hunyuanvideo, got 'toy'"):
        get_adapter("toy")


def test_the_adapters_composed_forward_is_the_models_own():
    """ModelAdapter.forward (what the JAX runtime jits and a training step differentiates) equals the toy's forward,
    and gradients flow through it to every block's weights."""
    model = toy_model()
    kwargs = toy_inputs(0)
    prepared = TOY.prepare(model, encoder_hidden_states=kwargs["encoder_hidden_states"])
    rope = TOY.rope(model, tuple(kwargs["hidden_states"].shape))
    with torch.no_grad():
        out = TOY.forward(model, kwargs["hidden_states"], kwargs["timestep"], prepared, rope)
    torch.testing.assert_close(out, oracle(model, kwargs), rtol=0, atol=1e-6)
    model.requires_grad_(True)
    TOY.forward(model, kwargs["hidden_states"], kwargs["timestep"], prepared, rope).square().mean().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.layers.parameters())


def test_the_jax_runtime_runs_a_second_model_through_its_adapter():
    pytest.importorskip("torchax")
    from hyv_lib.runtimes.jax_step import JaxTransformer

    model = toy_model()
    tpu = JaxTransformer(copy.deepcopy(model), adapter=TOY)
    assert tpu.adapter is TOY
    for seed in (0, 1):  # new latents, timesteps and text: data, not a new program
        kwargs = toy_inputs(seed)
        out = tpu(**kwargs)
        assert out.shape == kwargs["hidden_states"].shape  # frames-first latents come back frames-first
        assert (out - oracle(model, kwargs)).abs().max() <= TOL
    assert tpu.compilations == 1
    with pytest.raises(ValueError, match="timestep_r is not an input of toy"):
        tpu(**toy_inputs(0), timestep_r=torch.tensor([1.0, 1.0]))
    with pytest.raises(TypeError, match="image_embeds"):  # a conditioning keyword the adapter does not take
        tpu(**toy_inputs(0), image_embeds=torch.zeros(2, 1, 4))


@pytest.mark.parametrize("no_cache_blocks", [1, 0])
def test_deepcache_runs_a_second_model_on_both_runtimes(no_cache_blocks):
    """Eager (hooks on the model's own forward) and JAX: an all-full schedule is exactly the uncached step, a cached
    step on the same input reproduces the full one, and the cached step runs only the last blocks."""
    pytest.importorskip("torchax")
    from hyv_lib.runtimes.jax_step import JaxTransformer

    model = toy_model()
    kwargs = toy_inputs(2)
    expected = oracle(model, kwargs)
    for runtime in (TorchDeepCache(model, TOY), JaxTransformer(copy.deepcopy(model), adapter=TOY)):
        full, cache = runtime.run_and_cache(no_cache_blocks, **kwargs)
        assert (full - expected).abs().max() <= TOL
        torch.testing.assert_close(runtime.run_from_cache(cache, no_cache_blocks, **kwargs), full, rtol=0, atol=1e-5)
    calls = [0] * len(model.layers)
    handles = [b.register_forward_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))
               for i, b in enumerate(model.layers)]
    try:
        step = DeepCacheStep(TorchDeepCache(model, TOY), DeepCacheSchedule(4, start=1, end=4, interval=2),
                             no_cache_blocks)
        outs = [step(**kwargs) for _ in range(4)]  # full: 0, 1, 3; cached: 2
    finally:
        for h in handles:
            h.remove()
    assert (step.full_calls, step.cached_calls) == (3, 1)
    assert calls == [3, 3, 3 + no_cache_blocks]
    assert torch.equal(outs[0], expected)


def test_rule_sets_come_from_the_adapter():
    class Mesh:
        shape = {"data": 1, "tensor": 4, "sequence": 1}

    shapes = {name: tuple(p.shape) for name, p in toy_model().named_parameters()}
    specs, rows = plan(shapes, TOY.rules("tp"), Mesh())
    assert specs["layers.0.qkv.weight"] == ("tensor", None) and specs["layers.2.mlp_out.weight"] == (None, "tensor")
    assert specs["layers.1.modulation.weight"] == () and specs["proj_out.weight"] == ()
    assert [r["rule"] for r in rows] == ["tp/qkv column", "tp/out row", "replicated (no rule)"]
    with pytest.raises(ValueError, match="matched no parameter"):  # HunyuanVideo's names are not the toy's
        plan(shapes, HUNYUAN_VIDEO_15.rules("tp"), Mesh())


SHARDED_PROBE = textwrap.dedent("""
    import os, copy, json, sys
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    import torch
    sys.path.insert(0, sys.argv[1])
    from toy_adapter import TOY, toy_inputs, toy_model
    from hyv_lib.runtimes.jax_step import JaxTransformer
    model = toy_model()
    kwargs = toy_inputs(3)
    with torch.no_grad():
        expected = model(**kwargs, return_dict=False)[0]
    results = {}
    for sharding, mesh in (("tp", "data=2,tensor=4"), ("fsdp", "data=2,sequence=4")):
        tpu = JaxTransformer(copy.deepcopy(model), mesh=mesh, sharding=sharding, adapter=TOY)
        results[sharding] = dict(error=(tpu(**kwargs) - expected).abs().max().item(),
                                 rules=[r["rule"] for r in tpu.placement if r["tensors"]])
    print(json.dumps(results))
""")


@pytest.mark.slow  # its own process (8 emulated CPU devices need XLA_FLAGS before JAX starts)
def test_a_second_model_sharded_on_eight_devices_by_its_own_rules(run_probe):
    pytest.importorskip("torchax")
    result = run_probe("-c", SHARDED_PROBE, os.path.dirname(__file__))
    assert result["tp"]["error"] <= TOL and result["fsdp"]["error"] <= TOL, result
    assert result["tp"]["rules"] == ["tp/qkv column", "tp/out row", "replicated (no rule)"]
    assert result["fsdp"]["rules"] == ["fsdp/matrix", "replicated (no rule)"]


def test_the_compile_only_path_lowers_a_second_model_from_the_meta_device():
    """What ``compile_step`` does for a preset's model: build it on the meta device with its adapter, place abstract
    weights by the adapter's rules, lower the jitted step; the program takes the toy's frames-first latents."""
    pytest.importorskip("torchax")
    from hyv_lib.runtimes.jax_step import JaxTransformer

    with torch.device("meta"):
        model = TOY.build(dict(CONFIG))
    step = JaxTransformer(model, mesh="tensor=1", sharding="tp", adapter=TOY)
    kwargs = toy_inputs(0)
    lowered = step.lower(**kwargs)
    assert lowered.args_info[1]["hidden_states"].shape == tuple(kwargs["hidden_states"].shape)
    assert [r["rule"] for r in step.placement if r["tensors"]] == ["tp/qkv column", "tp/out row",
                                                                   "replicated (no rule)"]
    with pytest.raises(RuntimeError, match="compile only"):
        step(**kwargs)
