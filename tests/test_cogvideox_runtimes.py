"""CogVideoX1.5 through hyv_lib's runtimes via its model adapter: tiny fp32 model vs diffusers' eager forward given the
pipeline's RoPE tables (the composed pieces, the JAX runtime on 1 and 8 emulated devices, the torch runtime with
hyv_lib's attention, DeepCache and MagCache, FSDP2 on gloo); the real model's rules and shapes from the meta device; stage 3's tile-parallel decode on gloo."""

import copy
import os
import textwrap

import pytest
import torch
from diffusers import CogVideoXTransformer3DModel
from diffusers.models.embeddings import get_3d_rotary_pos_embed
from diffusers.pipelines.cogvideo.pipeline_cogvideox import get_resize_crop_region_for_grid

from hyv_lib.models.cogvideox.presets import COGVIDEOX_15_5B, COGVIDEOX_TINY
from hyv_lib.models.cogvideox.adapter import COGVIDEOX
from hyv_lib.models.registry import adapter_for, get_adapter
from hyv_lib.parallel.sharding import plan
from hyv_lib.runtimes.deepcache import DeepCacheStep, TorchDeepCache

# fp32 on the CPU. Measured: composed pieces 0 (same ops), torch runtime with hyv_lib's SDPA attention 0, the jitted
# JAX step 1.1e-6 (reordered float sums; outputs up to ~3.2), 8 emulated devices <= 1.5e-6, DeepCache <= 1.1e-6.
TOL = 1e-5
SHAPE = (2, 4, 16, 4, 6)  # [B, F, C, H, W]: 2 x 2 x 3 = 12 video tokens (patch 2x2x2), 226 text tokens


def tiny_model(**overrides) -> CogVideoXTransformer3DModel:
    torch.manual_seed(0)
    return CogVideoXTransformer3DModel(**{**COGVIDEOX_TINY.transformer, **overrides}).eval().requires_grad_(False)


def pipeline_rope(model, latent_shape):
    """CogVideoXPipeline._prepare_rotary_positional_embeddings for latents of ``latent_shape``, restated from the
    pipeline with diffusers' own functions (pixels = 8 x latents, so the grid is the latent size over the patch)."""
    config = model.config
    _, frames, _, height, width = latent_shape
    p, p_t = config.patch_size, config.patch_size_t
    grid = (height * 8 // (8 * p), width * 8 // (8 * p))
    base_w, base_h = config.sample_width // p, config.sample_height // p
    if p_t is None:
        crops = get_resize_crop_region_for_grid(grid, base_w, base_h)
        return get_3d_rotary_pos_embed(config.attention_head_dim, crops, grid, frames)
    return get_3d_rotary_pos_embed(config.attention_head_dim, None, grid, (frames + p_t - 1) // p_t,
                                   grid_type="slice", max_size=(base_h, base_w))


def inputs(seed, shape=SHAPE, timestep=(999, 400)):
    g = torch.Generator().manual_seed(seed)
    return dict(hidden_states=torch.randn(*shape, generator=g), timestep=torch.tensor(timestep),
                encoder_hidden_states=torch.randn(shape[0], 226, COGVIDEOX_TINY.text_dim, generator=g))


def oracle(model, kwargs):
    with torch.no_grad():
        return model(**kwargs, image_rotary_emb=pipeline_rope(model, kwargs["hidden_states"].shape)).sample


@pytest.fixture(scope="module")
def model():
    return tiny_model()


@pytest.fixture(scope="module")
def tpu(model):
    """One JAX runtime for the cache tests: its compiled DeepCache programs are shared between them."""
    pytest.importorskip("torchax")
    from hyv_lib.runtimes.jax_step import JaxTransformer

    return JaxTransformer(copy.deepcopy(model))


@pytest.mark.parametrize("patch_size_t", [2, None])
def test_the_composed_pieces_are_diffusers_forward(patch_size_t):
    """ModelAdapter.forward (what the runtimes jit) equals diffusers' forward for CogVideoX1.5 (temporal patch 2) and
    1.0 (none: a Conv2d patch embedding, the crop-region RoPE grid); its RoPE tables are the pipeline's."""
    model = tiny_model(patch_size_t=patch_size_t)
    kwargs = inputs(0, shape=(2, 3, 16, 4, 6) if patch_size_t is None else SHAPE)
    shape = tuple(kwargs["hidden_states"].shape)
    rope = COGVIDEOX.rope(model, shape)
    assert all(torch.equal(a, b) for a, b in zip(rope, pipeline_rope(model, shape)))
    prepared = COGVIDEOX.prepare(model, encoder_hidden_states=kwargs["encoder_hidden_states"], image_rotary_emb=rope)
    with torch.no_grad():
        out = COGVIDEOX.forward(model, kwargs["hidden_states"], kwargs["timestep"], prepared, rope)
    assert out.shape == shape
    assert (out - oracle(model, kwargs)).abs().max() <= TOL


@pytest.mark.parametrize("patch_size_t", [2, None])
def test_a_token_range_embeds_those_tokens(patch_size_t):
    """Ulysses-style ranges: three ranges of 5 tokens are the 12 tokens of the whole embedding, then zero patches."""
    model = tiny_model(patch_size_t=patch_size_t)
    latents = inputs(1)["hidden_states"]
    with torch.no_grad():
        whole = COGVIDEOX.embed_video(model, latents)
        parts = torch.cat([COGVIDEOX.embed_video(model, latents, s, s + 5) for s in (0, 5, 10)], dim=1)
        zero_patch = COGVIDEOX.embed_video(model, torch.zeros_like(latents))[:, :1]
    tokens = whole.shape[1]
    assert tokens == (12 if patch_size_t else 24)
    torch.testing.assert_close(parts[:, :min(tokens, 15)], whole[:, :15], rtol=0, atol=1e-6)
    if tokens < 15:
        torch.testing.assert_close(parts[:, tokens:], zero_patch.expand(-1, 15 - tokens, -1), rtol=0, atol=0)


def test_conditioning_checks(model):
    with pytest.raises(ValueError, match="ofs is not supported .*text-to-video only"):
        COGVIDEOX.prepare(model, encoder_hidden_states=torch.zeros(1, 226, 32), ofs=torch.ones(1))
    with pytest.raises(ValueError, match="timestep_cond is not supported"):
        COGVIDEOX.prepare(model, encoder_hidden_states=torch.zeros(1, 226, 32), timestep_cond=torch.ones(1, 8))
    with pytest.raises(ValueError, match="text-to-video CogVideoX only"):
        COGVIDEOX.check(tiny_model(ofs_embed_dim=32), "JaxTransformer")
    with pytest.raises(ValueError, match="rotary positional embeddings only"):
        COGVIDEOX.check(tiny_model(use_rotary_positional_embeddings=False, sample_height=8, sample_width=8,
                                   sample_frames=5), "JaxTransformer")


def test_the_jax_runtime_on_one_device(model):
    """hyv_lib.JaxTransformer(model) finds the adapter by class, equals diffusers, compiles once for new data, and
    return_dict=True gives ``.sample`` as diffusers' forward does."""
    pytest.importorskip("torchax")
    import hyv_lib

    assert adapter_for(model) is COGVIDEOX and get_adapter("cogvideox") is COGVIDEOX
    tpu = hyv_lib.JaxTransformer(copy.deepcopy(model))
    assert tpu.adapter is COGVIDEOX
    for seed, timestep in ((2, (999, 400)), (3, (10, 10))):
        kwargs = inputs(seed, timestep=timestep)
        rope = pipeline_rope(model, kwargs["hidden_states"].shape)
        out = tpu(**kwargs, image_rotary_emb=rope, return_dict=True).sample
        err = (out - oracle(model, kwargs)).abs().max().item()
        assert err <= TOL, err
    assert tpu.compilations == 1
    with pytest.raises(ValueError, match="timestep_r is not an input of cogvideox"):
        tpu(**inputs(2), timestep_r=torch.tensor([1.0, 1.0]))


SHARDED_PROBE = textwrap.dedent("""
    import os, copy, json, sys
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    import torch
    torch.set_num_threads(1)
    sys.path.insert(0, sys.argv[1])
    from test_cogvideox_runtimes import inputs, oracle, tiny_model
    from hyv_lib.runtimes.jax_step import JaxTransformer
    model = tiny_model()
    kwargs = inputs(4)
    expected = oracle(model, kwargs)
    results = {}
    for sharding, mesh in (("tp", "data=2,tensor=4"), ("tp_replicated_out", "tensor=2,sequence=4"),
                           ("fsdp", "data=2,sequence=4")):
        tpu = JaxTransformer(copy.deepcopy(model), mesh=mesh, sharding=sharding)
        results[mesh] = dict(error=(tpu(**kwargs) - expected).abs().max().item(),
                             rules={r["rule"]: r["tensors"] for r in tpu.placement if r["tensors"]})
    print(json.dumps(results))
""")


def test_the_jax_runtime_sharded_on_eight_devices(run_probe):
    """8 emulated CPU devices (own process: XLA_FLAGS before JAX starts): tensor parallel over data=2 x tensor=4, with
    a sequence axis (tensor=2 x sequence=4: heads over both, video tokens split between blocks), FSDP over
    data=2 x sequence=4; each equal to diffusers, its weights placed by CogVideoX's own rules."""
    pytest.importorskip("torchax")
    result = run_probe("-c", SHARDED_PROBE, os.path.dirname(__file__))
    assert all(case["error"] <= TOL for case in result.values()), result
    blocks = COGVIDEOX_TINY.transformer["num_layers"]
    assert result["data=2,tensor=4"]["rules"] == {
        "tp/attn_qkv column": 6 * blocks, "tp/mlp_in column": 2 * blocks, "tp/attn_out row": blocks,
        "tp/mlp_out row": blocks, "replicated (no rule)": len(list(tiny_model().parameters())) - 10 * blocks}
    assert result["tensor=2,sequence=4"]["rules"]["tp_replicated_out/attn_out replicated"] == blocks
    assert "fsdp/matrix" in result["data=2,sequence=4"]["rules"]


@pytest.mark.parametrize("attention", ["auto", "diffusers"])
def test_the_torch_runtime(model, attention):
    """The pipeline's torch step (runtimes.step.make_step) with hyv_lib's attention installed by the adapter, and
    with diffusers' own processor kept."""
    from diffusers.models.attention_processor import CogVideoXAttnProcessor2_0

    from hyv_lib.models.cogvideox.processor import CogVideoXJointAttnProcessor
    from hyv_lib.runtimes.step import make_step

    copied = copy.deepcopy(model)
    step = make_step(copied, "torch", attention=attention)
    kind = CogVideoXJointAttnProcessor if attention == "auto" else CogVideoXAttnProcessor2_0
    assert all(isinstance(b.attn1.processor, kind) for b in copied.transformer_blocks)
    kwargs = inputs(5)
    with torch.no_grad():
        out = step(**kwargs, image_rotary_emb=pipeline_rope(model, kwargs["hidden_states"].shape))
    assert (out - oracle(model, kwargs)).abs().max() <= TOL


def fsdp_job():
    """On every rank of 2 gloo processes: the torch step over FSDP2-sharded weights vs diffusers' forward."""
    from hyv_lib.runtimes.fsdp import shard_weights, sharded_step
    from hyv_lib.runtimes.step import make_step

    torch.set_num_threads(1)
    model = tiny_model()
    kwargs = inputs(8)
    sharded = shard_weights(copy.deepcopy(model))
    out = sharded_step(make_step(sharded, "torch"), sharded)(**kwargs, image_rotary_emb=pipeline_rope(model, SHAPE))
    return (out - oracle(model, kwargs)).abs().max().item()


def test_the_torch_runtime_over_fsdp_sharded_weights():
    """FSDP2 (``--shard_weights fsdp``) on 2 gloo processes: each block of the adapter's list gathered as it runs."""
    from hyv_lib.parallel.distributed import run_distributed

    assert run_distributed(fsdp_job, 2, timeout=240) <= TOL


def ulysses_job():
    """Rank's Ulysses forward of the tiny model (2 gloo ranks: 12 video tokens, 6 per rank; 8 heads, 4 per rank)
    against diffusers' forward."""
    from hyv_lib.runtimes.ulysses import UlyssesTransformer

    torch.set_num_threads(1)
    model = tiny_model()
    kwargs = inputs(8)
    expected = oracle(model, kwargs)
    out = UlyssesTransformer(copy.deepcopy(model))(**kwargs, image_rotary_emb=pipeline_rope(model, SHAPE))
    return (out - expected).abs().max().item()


def test_ulysses_on_two_gloo_ranks():
    """Ulysses counts the video tokens through the adapter (one per 2x2x2 patch) and shards them: equal to diffusers."""
    from hyv_lib.parallel.distributed import run_distributed

    assert run_distributed(ulysses_job, 2, timeout=240) <= TOL


def swapped_oracle(model, kwargs, cache_kwargs, no_cache_blocks):
    """What a cached step must give, from diffusers' forward alone: the forward at ``kwargs`` with the tokens entering
    the last ``no_cache_blocks`` blocks (0: leaving the last block) replaced by those of a forward at
    ``cache_kwargs``."""
    rope = pipeline_rope(model, kwargs["hidden_states"].shape)
    blocks = model.transformer_blocks
    recorded = {}
    if no_cache_blocks:
        target = blocks[len(blocks) - no_cache_blocks]
        handle = target.register_forward_pre_hook(
            lambda m, a, kw: recorded.update(kw), with_kwargs=True)
        with torch.no_grad():
            model(**cache_kwargs, image_rotary_emb=rope)
        handle.remove()
        handle = target.register_forward_pre_hook(
            lambda m, a, kw: (a, {**kw, "hidden_states": recorded["hidden_states"],
                                  "encoder_hidden_states": recorded["encoder_hidden_states"]}), with_kwargs=True)
    else:
        handle = blocks[-1].register_forward_hook(lambda m, a, out: recorded.update(out=out))
        with torch.no_grad():
            model(**cache_kwargs, image_rotary_emb=rope)
        handle.remove()
        handle = blocks[-1].register_forward_hook(lambda m, a, out: recorded["out"])
    try:
        with torch.no_grad():
            return model(**kwargs, image_rotary_emb=rope).sample
    finally:
        handle.remove()


@pytest.mark.parametrize("no_cache_blocks", [1, 0])
def test_deepcache_on_both_runtimes(model, tpu, no_cache_blocks):
    """DeepCache on the torch runtime (hooks on diffusers' forward) and the JAX one: the full step is the forward; a
    cached step at a new timestep equals diffusers' forward at that timestep with the cached tokens put back in front
    of the last blocks (or after the last block, for 0)."""
    first, later = inputs(6), inputs(6, timestep=(500, 200))
    rope = pipeline_rope(model, SHAPE)
    expected_full = oracle(model, first)
    expected_cached = swapped_oracle(model, later, first, no_cache_blocks)
    assert (expected_cached - oracle(model, later)).abs().max() > 1e-3  # the swap changes the result
    for runtime in (TorchDeepCache(model), tpu):
        full, cache = runtime.run_and_cache(no_cache_blocks, **first, image_rotary_emb=rope)
        assert (full - expected_full).abs().max() <= TOL
        cached = runtime.run_from_cache(cache, no_cache_blocks, **later, image_rotary_emb=rope)
        assert (cached - expected_cached).abs().max() <= TOL


def test_magcache_calibrates_and_runs_on_this_model(model, tpu):
    """MagCache needs only the cache runtimes' tokens: a calibration curve over four steps, then its schedule under
    DeepCacheStep skips a step on the torch and JAX runtimes alike, full steps equal to diffusers."""
    from hyv_lib.pipeline.calibration import CalibrationStep
    from hyv_lib.runtimes.magcache import MagCacheSchedule

    steps = [inputs(7, timestep=(t, t)) for t in (900, 700, 500, 300)]
    for i, kwargs in enumerate(steps[1:], 1):  # a slowly changing trajectory, as in denoising
        kwargs["hidden_states"] = steps[0]["hidden_states"] * (1 - 0.05 * i)
        kwargs["encoder_hidden_states"] = steps[0]["encoder_hidden_states"]
    rope = pipeline_rope(model, SHAPE)
    calibration = CalibrationStep(TorchDeepCache(model), 1)
    for kwargs in steps:
        calibration(**kwargs, image_rotary_emb=rope)
    curve = calibration.curve
    assert curve[0] == 0 and all(c > 0 for c in curve[1:]), curve
    schedule = MagCacheSchedule(curve, threshold=2 * max(curve), max_skip=1, retention=0.25)
    assert schedule.cached_steps, schedule.full_steps
    outs = []
    for runtime in (TorchDeepCache(model), tpu):
        step = DeepCacheStep(runtime, schedule, 1)
        outs.append([step(**kwargs, image_rotary_emb=rope) for kwargs in steps])
        assert step.skipped_steps == schedule.cached_steps
    for s in schedule.full_steps:
        assert (outs[0][s] - oracle(model, steps[s])).abs().max() <= TOL
    for torch_out, jax_out in zip(*outs):
        assert (torch_out - jax_out).abs().max() <= TOL


def test_the_real_model_from_the_meta_device():
    """CogVideoX1.5-5B built from its preset without weights: 5.57B parameters; every rule set places the 42 blocks'
    6 matrices (Q, K, V, attention out, MLP in and out) and only those; example_inputs at 768x1360x81 give
    CogVideoXPipeline's shapes (21 latent frames padded to 22: 11 x 48 x 85 = 44,880 video tokens) and RoPE rows."""
    with torch.device("meta"):
        model = COGVIDEOX.build(COGVIDEOX_15_5B.transformer)
    assert adapter_for(model) is COGVIDEOX
    assert abs(sum(p.numel() for p in model.parameters()) / 1e9 - 5.57) < 0.01

    class Mesh:
        shape = {"data": 2, "tensor": 4, "sequence": 1}

    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    for strategy in ("tp", "tp_replicated_out"):
        specs, _ = plan(shapes, COGVIDEOX.rules(strategy), Mesh())
        placed = [n for n, spec in specs.items() if spec and n.endswith(".weight")]
        assert len(placed) == 42 * 6 if strategy == "tp" else 42 * 4
        assert all(len(shapes[n]) == 2 and n.startswith(COGVIDEOX.block_prefix) for n in placed)
    specs, _ = plan(shapes, COGVIDEOX.rules("tp"), Mesh())
    assert specs["transformer_blocks.41.attn1.to_k.weight"] == ("tensor", None)
    assert specs["transformer_blocks.0.ff.net.2.weight"] == (None, "tensor")
    assert specs["transformer_blocks.0.norm1.linear.weight"] == () and specs["proj_out.weight"] == ()
    kwargs = COGVIDEOX.example_inputs(COGVIDEOX_15_5B, 768, 1360, 81)
    assert kwargs["hidden_states"].shape == (2, 22, 16, 96, 170)
    assert kwargs["encoder_hidden_states"].shape == (2, 226, 4096)
    cos, sin = COGVIDEOX.rope(model, tuple(kwargs["hidden_states"].shape))
    assert cos.shape == sin.shape == (11 * 48 * 85, 64)
    assert COGVIDEOX.example_inputs(COGVIDEOX_15_5B, 720, 1280, 81)["hidden_states"].shape[1:] == (22, 16, 90, 160)


def test_the_compile_path_lowers_the_tiny_model_from_the_meta_device():
    """What planning.tpu_compile does for a preset: the meta-device model, abstract weights placed by the adapter's
    rules, the jitted step lowered for example_inputs (frames-first latents)."""
    pytest.importorskip("torchax")
    from hyv_lib.runtimes.jax_step import JaxTransformer

    with torch.device("meta"):
        model = COGVIDEOX.build(COGVIDEOX_TINY.transformer)
    step = JaxTransformer(model, mesh="tensor=1", sharding="tp")
    kwargs = COGVIDEOX.example_inputs(COGVIDEOX_TINY, 64, 96, 9, dtype=torch.float32)
    lowered = step.lower(**kwargs)
    assert lowered.args_info[1]["hidden_states"].shape == (2, 4, 16, 8, 12)
    with pytest.raises(RuntimeError, match="compile only"):
        step(**kwargs)


def test_a_bf16_model_gets_its_timesteps_exactly():
    """The pipeline's integer timesteps reach the bf16 model's time embedding in float32, as diffusers embeds them:
    999 and 1000 are distinct integers that bf16 rounds to one value (1000), and the runtimes must tell them apart."""
    from hyv_lib.runtimes.jax_step import JaxTransformer

    model = tiny_model().to(torch.bfloat16)
    tpu = JaxTransformer(copy.deepcopy(model))
    kwargs = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in inputs(9).items()}
    outs = [tpu(**dict(kwargs, timestep=torch.tensor([t, t]))) for t in (999, 1000)]
    # a bf16 timestep would make the two calls one input, and so the one program's outputs bit-identical
    assert not torch.equal(outs[0], outs[1])


def tile_parallel_job(vae, z):
    """Every rank's tile-parallel decode of AutoencoderKLCogVideoX, with the tiles each rank decoded."""
    from hyv_lib.runtimes.tile_parallel import tile_parallel_decode

    torch.set_num_threads(1)
    timeline = []
    return tile_parallel_decode(vae, z, timeline=timeline), timeline


def test_tile_parallel_decode_of_a_vae_whose_tiles_carry_a_cache():
    """CogVideoX's VAE passes a convolution cache from one frame batch's decoder call to the next, so its tiles are
    not independent: under 2 gloo ranks (stage 3 under torchrun) every rank decodes the whole video, equal to one
    process's tiled decode, instead of failing on the decoder's extra arguments."""
    from hyv_lib.models.components import build_tiny_components
    from hyv_lib.models.families import get_preset
    from hyv_lib.parallel.distributed import run_distributed
    from test_parallel import torch_threads

    preset = get_preset("cogvideox_tiny")
    vae = build_tiny_components(preset, names=["vae"])["vae"]
    vae.enable_tiling(tile_sample_min_height=32, tile_sample_min_width=32)  # 4-latent tiles: 8 x 8 is several
    z = torch.randn(1, preset.latent_channels, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    video, timeline = run_distributed(tile_parallel_job, 2, vae, z, timeout=240)
    with torch_threads(1), torch.no_grad():  # the ranks' count, restored after (later tests compare bitwise)
        expected = vae.decode(z).sample
    assert torch.equal(video, expected) and timeline == []  # decoded whole, not spread
