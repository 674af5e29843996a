"""HunyuanVideo (13B) through hyv_lib's other runtimes and its public entry points, at tiny size against diffusers'
eager fp32 forward and HunyuanVideoPipeline, with a padded text mask: the JAX runtime sharded on 8 emulated devices
by the family's own rules, Ulysses and FSDP2 on gloo ranks, MagCache, the compile path from the meta device and the
real model's size; generate / stage1-3 / load_pipeline / a saved folder / a prompts file / the JAX VAE end to end."""

import copy
import json
import os
import textwrap

import pytest
import torch
from diffusers import HunyuanVideoPipeline
from safetensors.torch import load_file

from hyv_lib.cli.commands import run
from hyv_lib.models.hunyuan_video.adapter import HUNYUAN_VIDEO
from hyv_lib.models.hunyuan_video.components import COMPONENTS, build_tiny
from hyv_lib.models.hunyuan_video.presets import HUNYUANVIDEO_T2V, HUNYUANVIDEO_TINY
from hyv_lib.models.registry import adapter_for
from hyv_lib.parallel.sharding import plan
from hyv_lib.runtimes.deepcache import DeepCacheStep, TorchDeepCache

from test_hunyuan_video_family import inputs, oracle

# fp32 on the CPU. Measured: 8 emulated devices (tp, tp_replicated_out, fsdp) <= 5.1e-6 against outputs up to ~2.6;
# Ulysses on 2 gloo ranks 6.0e-7, the torch step over FSDP2 weights 4.2e-7; the loop (hyv_lib's attention) vs
# HunyuanVideoPipeline from the same latents 4.8e-7 (latents up to ~4.3), generate's stage-2 latents vs the pipeline
# from the seed 4.8e-7, stage 2 on the jax runtime vs torch 6.1e-6; the mp4's frames vs the pipeline's decode at most
# 1 level (rounding of the 4.8e-7); the JAX VAE decode vs diffusers' 1.1e-5 (values up to ~3.8, within TOL x 3.8)
# and its frames at most 1 level from the torch decode's.
TOL = 1e-5


def tiny_model() -> torch.nn.Module:
    """The tiny transformer of the family test's fixture (build_tiny is seeded: the same weights in every process)."""
    return build_tiny(HUNYUANVIDEO_TINY, seed=0, names=["transformer"])["transformer"]


@pytest.fixture(scope="module")
def model():
    return tiny_model()


@pytest.fixture(scope="module")
def tpu(model):
    """One JAX runtime for the cache tests."""
    pytest.importorskip("torchax")
    from hyv_lib.runtimes.jax_step import JaxTransformer

    return JaxTransformer(copy.deepcopy(model))


# ---------------------------------------------------------------------------------------------- 8 emulated devices
SHARDED_PROBE = textwrap.dedent("""
    import os, copy, json, sys
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    import torch
    torch.set_num_threads(1)
    sys.path.insert(0, sys.argv[1])
    from test_hunyuan_video_runtimes import inputs, oracle, tiny_model
    from hyv_lib.runtimes.jax_step import JaxTransformer
    model = tiny_model()
    kwargs = inputs(4, valid=(20, 5))
    expected = oracle(model, kwargs)
    results = {}
    for sharding, mesh in (("tp", "data=2,tensor=4"), ("tp_replicated_out", "tensor=2,sequence=4"),
                           ("fsdp", "data=2,sequence=4")):
        tpu = JaxTransformer(copy.deepcopy(model), mesh=mesh, sharding=sharding)
        results[mesh] = dict(error=(tpu(**kwargs) - expected).abs().max().item(),
                             rules={r["rule"]: r["tensors"] for r in tpu.placement if r["tensors"]})
    print(json.dumps(results))
""")


def test_the_jax_runtime_sharded_on_eight_devices(run_probe, model):
    """8 emulated CPU devices (own process: XLA_FLAGS before JAX starts): tensor parallel over data=2 x tensor=4 (the
    tiny model's 8 heads split 4 ways), tensor=2 x sequence=4 (18 video tokens split between blocks), FSDP over
    data=2 x sequence=4; each equal to diffusers' forward with a padded text mask, the weights placed by HunyuanVideo's
    own rules: per dual-stream block 12 Q/K/V tensors (both streams, weights and biases), 4 MLP-in, 2 attention-out
    and 2 MLP-out matrices; per single-stream block 6 Q/K/V, 2 MLP-in (proj_mlp) and 1 MLP-out (proj_out)."""
    pytest.importorskip("torchax")
    result = run_probe("-c", SHARDED_PROBE, os.path.dirname(__file__), timeout=240)
    assert all(case["error"] <= TOL for case in result.values()), result
    dual = single = 2
    placed = {"attn_qkv column": 12 * dual + 6 * single, "mlp_in column": 4 * dual + 2 * single,
              "attn_out row": 2 * dual, "mlp_out row": 2 * dual + single}
    total = len(list(model.parameters()))
    assert result["data=2,tensor=4"]["rules"] == {
        **{f"tp/{rule}": n for rule, n in placed.items()}, "replicated (no rule)": total - sum(placed.values())}
    replicated_out = result["tensor=2,sequence=4"]["rules"]
    assert replicated_out["tp_replicated_out/attn_out replicated"] == 2 * dual
    assert replicated_out["tp_replicated_out/mlp_out replicated"] == 2 * dual + single
    assert replicated_out["tp_replicated_out/attn_qkv column"] == placed["attn_qkv column"]
    fsdp = result["data=2,sequence=4"]["rules"]
    assert set(fsdp) == {"fsdp/matrix", "replicated (no rule)"} and sum(fsdp.values()) == total


# ---------------------------------------------------------------------------------------------- gloo ranks
def ulysses_job():
    """Rank's Ulysses forward of the tiny model (2 gloo ranks: 18 video tokens, 9 per rank; 8 heads, 4 per rank)
    against diffusers' forward, a padded text mask (20 and 5 valid tokens)."""
    from hyv_lib.runtimes.ulysses import UlyssesTransformer

    torch.set_num_threads(1)
    model = tiny_model()
    kwargs = inputs(8, valid=(20, 5))
    expected = oracle(model, kwargs)
    out = UlyssesTransformer(copy.deepcopy(model))(**kwargs)
    return (out - expected).abs().max().item()


def test_ulysses_on_two_gloo_ranks():
    """Ulysses counts the video tokens through the adapter (one per 1x2x2 patch), shards them, runs the single-stream
    blocks through the adapter's SingleStreamView: equal to diffusers."""
    from hyv_lib.parallel.distributed import run_distributed

    assert run_distributed(ulysses_job, 2, timeout=240) <= TOL


def fsdp_job():
    """On every rank of 2 gloo processes: the torch step over FSDP2-sharded weights vs diffusers' forward."""
    from hyv_lib.runtimes.fsdp import shard_weights, sharded_step
    from hyv_lib.runtimes.step import make_step

    torch.set_num_threads(1)
    model = tiny_model()
    kwargs = inputs(9, valid=(20, 5))
    sharded = shard_weights(copy.deepcopy(model))
    out = sharded_step(make_step(sharded, "torch"), sharded)(**kwargs)
    return (out - oracle(model, kwargs)).abs().max().item()


def test_the_torch_runtime_over_fsdp_sharded_weights():
    """FSDP2 (``--shard_weights fsdp``) on 2 gloo processes: each block of the adapter's list (dual and single)
    gathered as it runs."""
    from hyv_lib.parallel.distributed import run_distributed

    assert run_distributed(fsdp_job, 2, timeout=240) <= TOL


# ---------------------------------------------------------------------------------------------- MagCache
def test_magcache_calibrates_and_runs_on_this_model(model, tpu):
    """MagCache needs only the cache runtimes' tokens: a calibration curve over four steps, then its schedule under
    DeepCacheStep skips a step on the torch and JAX runtimes alike, full steps equal to diffusers."""
    from hyv_lib.pipeline.calibration import CalibrationStep
    from hyv_lib.runtimes.magcache import MagCacheSchedule

    steps = [inputs(7, valid=(20, 5)) for _ in range(4)]
    for i, (kwargs, t) in enumerate(zip(steps, (900.0, 700.0, 500.0, 300.0))):  # a slowly changing trajectory
        kwargs["timestep"] = torch.tensor([t, t])
        kwargs["hidden_states"] = steps[0]["hidden_states"] * (1 - 0.05 * i)
    calibration = CalibrationStep(TorchDeepCache(model), 1)
    for kwargs in steps:
        calibration(**kwargs)
    curve = calibration.curve
    assert curve[0] == 0 and all(c > 0 for c in curve[1:]), curve
    schedule = MagCacheSchedule(curve, threshold=2 * max(curve), max_skip=1, retention=0.25)
    assert schedule.cached_steps, schedule.full_steps
    outs = []
    for runtime in (TorchDeepCache(model), tpu):
        step = DeepCacheStep(runtime, schedule, 1)
        outs.append([step(**kwargs) for kwargs in steps])
        assert step.skipped_steps == schedule.cached_steps
    for s in schedule.full_steps:
        assert (outs[0][s] - oracle(model, steps[s])).abs().max() <= TOL
    for torch_out, jax_out in zip(*outs):
        assert (torch_out - jax_out).abs().max() <= TOL


# ---------------------------------------------------------------------------------------------- meta device
def linear(i: int, o: int) -> int:
    return i * o + o


def expected_parameters(config: dict) -> int:
    """HunyuanVideoTransformer3DModel's parameter count from its config alone, module by module as diffusers 0.42's
    transformer_hunyuan_video.py declares them (width D = heads x head_dim, MLP width r x D, all linears with biases,
    LayerNorms of the blocks without affine weights, RMS QK-norms of head_dim each)."""
    d, hd = config["num_attention_heads"] * config["attention_head_dim"], config["attention_head_dim"]
    mlp, text_dim, pooled = int(d * config["mlp_ratio"]), config["text_embed_dim"], config["pooled_projection_dim"]
    p, p_t, cin, cout = config["patch_size"], config["patch_size_t"], config["in_channels"], config["out_channels"]
    timestep = linear(256, d) + linear(d, d)  # TimestepEmbedding(256 -> D -> D)
    dual = (2 * linear(d, 6 * d)  # norm1, norm1_context: AdaLayerNormZero
            + 8 * linear(d, d) + 4 * hd  # Q/K/V and out of both streams; norm_q/k, norm_added_q/k
            + 2 * (linear(d, mlp) + linear(mlp, d)))  # ff, ff_context
    single = linear(d, 3 * d) + 3 * linear(d, d) + 2 * hd + linear(d, mlp) + linear(d + mlp, d)
    refiner_block = (2 * 2 * d  # norm1, norm2 (affine LayerNorms)
                     + 4 * linear(d, d)  # to_q/k/v, to_out.0
                     + linear(d, int(d * 4.0)) + linear(int(d * 4.0), d)  # ff ("linear-silu"), ratio 4
                     + linear(d, 2 * d))  # norm_out (HunyuanVideoAdaNorm)
    context = (timestep + linear(text_dim, d) + linear(d, d)  # its CombinedTimestepTextProjEmbeddings (text pooled)
               + linear(text_dim, d) + config["num_refiner_layers"] * refiner_block)  # proj_in, refiner
    condition = timestep + linear(pooled, d) + linear(d, d) + (timestep if config["guidance_embeds"] else 0)
    embed = cin * p_t * p * p * d + d  # the patch Conv3d
    head = linear(d, 2 * d) + linear(d, p_t * p * p * cout)  # norm_out (AdaLayerNormContinuous), proj_out
    return (embed + context + condition + config["num_layers"] * dual + config["num_single_layers"] * single + head)


def test_the_real_model_from_the_meta_device():
    """hunyuanvideo_t2v built from its preset without weights: 12,821,012,544 parameters, the count the config gives
    module by module (the paper's "13B"); every rule set places only 2-D block matrices (tp: 12 per dual-stream block
    (Q/K/V, attention out and the MLP's two layers of both streams), 5 per single-stream one (Q/K/V, proj_mlp,
    proj_out); tp_replicated_out 8 and 4: the row-parallel ones replicated); example_inputs at 720x1280x129 give
    HunyuanVideoPipeline's shapes (33 x 45 x 80 = 118,800 video tokens) and RoPE rows of 128."""
    with torch.device("meta"):
        real = HUNYUAN_VIDEO.build(HUNYUANVIDEO_T2V.transformer)
    assert adapter_for(real) is HUNYUAN_VIDEO
    count = sum(p.numel() for p in real.parameters())
    assert count == expected_parameters(HUNYUANVIDEO_T2V.transformer) == 12_821_012_544
    assert expected_parameters(HUNYUANVIDEO_TINY.transformer) == sum(p.numel() for p in tiny_model().parameters())

    class Mesh:
        shape = {"data": 2, "tensor": 4, "sequence": 1}

    shapes = {name: tuple(p.shape) for name, p in real.named_parameters()}
    for strategy, per_dual, per_single in (("tp", 12, 5), ("tp_replicated_out", 8, 4)):
        specs, _ = plan(shapes, HUNYUAN_VIDEO.rules(strategy), Mesh())
        placed = [n for n, spec in specs.items() if spec and n.endswith(".weight")]
        assert len(placed) == 20 * per_dual + 40 * per_single, strategy
        assert all(len(shapes[n]) == 2 and "transformer_blocks." in n for n in placed)
    specs, _ = plan(shapes, HUNYUAN_VIDEO.rules("tp"), Mesh())
    assert specs["transformer_blocks.19.attn.add_k_proj.weight"] == ("tensor", None)
    assert specs["single_transformer_blocks.39.proj_out.weight"] == (None, "tensor")
    assert specs["transformer_blocks.0.norm1.linear.weight"] == () and specs["proj_out.weight"] == ()
    kwargs = HUNYUAN_VIDEO.example_inputs(HUNYUANVIDEO_T2V, 720, 1280, 129)
    assert kwargs["hidden_states"].shape == (1, 16, 33, 90, 160)
    assert kwargs["encoder_hidden_states"].shape == (1, 256, 4096) and kwargs["pooled_projections"].shape == (1, 768)
    assert HUNYUAN_VIDEO.video_token_count(real, kwargs["hidden_states"].shape) == 33 * 45 * 80
    cos, sin = HUNYUAN_VIDEO.rope(real, tuple(kwargs["hidden_states"].shape))
    assert cos.shape == sin.shape == (33 * 45 * 80, 128)


def test_the_compile_path_lowers_the_tiny_model_from_the_meta_device():
    """What planning.tpu_compile does for a preset: the meta-device model, abstract weights placed by the adapter's
    rules, the jitted step lowered for example_inputs (a padded text mask, the embedded guidance)."""
    pytest.importorskip("torchax")
    from hyv_lib.runtimes.jax_step import JaxTransformer

    with torch.device("meta"):
        meta = HUNYUAN_VIDEO.build(HUNYUANVIDEO_TINY.transformer)
    step = JaxTransformer(meta, mesh="tensor=1", sharding="tp")
    kwargs = HUNYUAN_VIDEO.example_inputs(HUNYUANVIDEO_TINY, 64, 96, 9, dtype=torch.float32, text_tokens=5)
    lowered = step.lower(**kwargs)
    assert lowered.args_info[1]["hidden_states"].shape == (1, 16, 3, 8, 12)
    prepared = lowered.args_info[1]["prepared"]
    assert prepared["guidance"].shape == (1,) and prepared["context_mask"].shape == (1, HUNYUANVIDEO_TINY.text_len)
    assert prepared["pooled"].shape == (1, 16)
    with pytest.raises(RuntimeError, match="compile only"):
        step(**kwargs)


# ---------------------------------------------------------------------------------------------- the public entry points
STEPS = 2


@pytest.fixture(scope="module")
def components():
    return build_tiny(HUNYUANVIDEO_TINY, seed=0)


@pytest.fixture(scope="module")
def pipe(components):
    pipe = HunyuanVideoPipeline(**{name: components[name] for name in COMPONENTS})
    pipe.set_progress_bar_config(disable=True)
    return pipe


def pipeline_latents(pipe, stage1, seed=None, latents=None, height=96, width=160, frames=9,
                     guidance_scale=HUNYUANVIDEO_TINY.guidance_scale):
    """HunyuanVideoPipeline(output_type="latent") on stage 1's tensors (the prompt's: guidance is embedded), from
    ``latents`` or the noise of a CPU generator seeded with ``seed``."""
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    return pipe(prompt_embeds=stage1["prompt_embeds"], pooled_prompt_embeds=stage1["pooled_prompt_embeds"],
                prompt_attention_mask=stage1["prompt_embeds_mask"], height=height, width=width, num_frames=frames,
                num_inference_steps=STEPS, guidance_scale=guidance_scale, generator=generator,
                latents=None if latents is None else latents.clone(), output_type="latent").frames


def pipeline_frames(pipe, latents) -> torch.Tensor:
    """HunyuanVideoPipeline's decode of its latents (what it does after the loop for output_type="np"), as uint8."""
    from hyv_lib.runtimes.vae import to_uint8_frames

    with torch.no_grad():
        video = pipe.vae.decode(latents / pipe.vae.config.scaling_factor, return_dict=False)[0]
    return to_uint8_frames(video[0])


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """``generate --preset hunyuanvideo_tiny`` into a folder (default size 96x160, 9 frames), frames saved too."""
    out = str(tmp_path_factory.mktemp("hunyuanvideo") / "run")
    assert run(["generate", "--preset", "hunyuanvideo_tiny", "--prompt", "a cat", "--negative_prompt", "blurry",
                "--output_dir", out, "--num_inference_steps", str(STEPS), "--save_frames", "--quiet"]) == 0
    return out


def test_loop_equals_the_pipeline_from_the_same_latents(components, pipe):
    """From the same latents and stage-1 tensors (a padded text mask: 6 of 32 tokens valid), the family's loop on
    the torch step with hyv_lib's attention ends where HunyuanVideoPipeline(..., output_type="latent") does."""
    from hyv_lib.models.hunyuan_video.recipe import denoise
    from hyv_lib.pipeline.text import encode_pair
    from hyv_lib.runtimes.step import make_step

    embeds = encode_pair(components, HUNYUANVIDEO_TINY, "a cat", "blurry")
    assert embeds["prompt_embeds_mask"].sum().item() == 6  # padded
    latents = torch.randn(1, 16, 2, 4, 6, generator=torch.Generator().manual_seed(1))
    expected = pipeline_latents(pipe, embeds, latents=latents, height=32, width=48, frames=5,
                                guidance_scale=4.5)
    scheduler = type(components["scheduler"]).from_config(components["scheduler"].config)
    conditioning = {"encoder_hidden_states": embeds["prompt_embeds"],
                    "pooled_projections": embeds["pooled_prompt_embeds"],
                    "encoder_attention_mask": embeds["prompt_embeds_mask"].float()}
    got = denoise(make_step(copy.deepcopy(components["transformer"]), "torch", attention="auto"), latents.clone(),
                  conditioning, scheduler,
                  num_inference_steps=STEPS, guidance_scale=4.5, guidance_embeds=True, progress=False)
    assert got.shape == expected.shape == latents.shape
    assert (got - expected).abs().max() <= TOL and not torch.equal(got, latents)


def test_generate_files_equal_diffusers(generated, pipe):
    """The stage files: Llama's and CLIP's tensors, latents [1, 16, 3, 12, 20] equal to HunyuanVideoPipeline run from
    the same seed and tensors; the mp4 has 9 frames of 96x160 and its frames are the pipeline's decode."""
    from hyv_lib.pipeline.video_io import read_mp4

    stage1 = load_file(os.path.join(generated, "stage1_embeddings.safetensors"))
    assert {k: tuple(v.shape) for k, v in stage1.items()} == {
        **{f"{n}prompt_embeds": (1, 32, 32) for n in ("", "negative_")},
        **{f"{n}prompt_embeds_mask": (1, 32) for n in ("", "negative_")},
        **{f"{n}pooled_prompt_embeds": (1, 16) for n in ("", "negative_")}}
    latents = load_file(os.path.join(generated, "stage2_latents.safetensors"))["latents"]
    assert latents.shape == (1, 16, 3, 12, 20)
    expected = pipeline_latents(pipe, stage1, seed=42)
    assert (latents - expected).abs().max() <= TOL * max(1.0, float(expected.abs().max()))
    frames, meta = read_mp4(os.path.join(generated, "output_video.mp4"))
    assert frames.shape == (9, 96, 160, 3) and meta["fps"] == HUNYUANVIDEO_TINY.fps
    saved = load_file(os.path.join(generated, "stage3_frames.safetensors"))["frames"][0].permute(1, 2, 3, 0)
    assert (saved.int() - pipeline_frames(pipe, expected).int()).abs().max() <= 1
    config = json.load(open(os.path.join(generated, "generation_config.json")))
    assert config["preset"] == "hunyuanvideo_tiny" and config["video_length"] == 9
    assert config["guidance_scale"] == HUNYUANVIDEO_TINY.guidance_scale


def test_stage_commands_round_trip(generated, tmp_path):
    """stage2 and stage3 rerun from the generate folder's files give the same latents and frames; stage 2 on the
    jax runtime within TOL."""
    import shutil

    folder = str(tmp_path / "again")
    shutil.copytree(generated, folder)
    os.remove(os.path.join(folder, "stage2_latents.safetensors"))
    assert run(["stage2", "--input_dir", folder, "--num_inference_steps", str(STEPS), "--quiet"]) == 0
    first = load_file(os.path.join(generated, "stage2_latents.safetensors"))["latents"]
    assert torch.equal(load_file(os.path.join(folder, "stage2_latents.safetensors"))["latents"], first)
    jitted = str(tmp_path / "jax")
    assert run(["stage2", "--input_dir", folder, "--output_dir", jitted, "--runtime", "jax",
                "--num_inference_steps", str(STEPS), "--quiet"]) == 0
    on_jax = load_file(os.path.join(jitted, "stage2_latents.safetensors"))["latents"]
    assert (on_jax - first).abs().max() <= TOL * max(1.0, float(first.abs().max()))
    frames = load_file(os.path.join(generated, "stage3_frames.safetensors"))["frames"]
    assert run(["stage3", "--input_dir", folder, "--save_frames", "--quiet"]) == 0
    assert torch.equal(load_file(os.path.join(folder, "stage3_frames.safetensors"))["frames"], frames)


def test_the_jax_vae_decode(generated, tmp_path, components):
    """stage3 --runtime jax: AutoencoderKLHunyuanVideo's decoder jitted through torchax (diffusers' own tiling and
    blending kept) gives the torch decode's frames within one level; decode_on_jax against diffusers' decode."""
    pytest.importorskip("torchax")
    import shutil

    from hyv_lib.runtimes.jax_vae import decode_on_jax

    vae = components["vae"]
    z = torch.randn(1, 16, 3, 4, 4, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = vae.decode(z).sample
    got, programs = decode_on_jax(vae, z)
    assert programs == 1 and got.shape == expected.shape == (1, 3, 9, 32, 32)
    assert (got - expected).abs().max() <= TOL * max(1.0, float(expected.abs().max()))
    folder = str(tmp_path / "jax_vae")
    shutil.copytree(generated, folder)
    assert run(["stage3", "--input_dir", folder, "--runtime", "jax", "--save_frames", "--quiet"]) == 0
    torch_frames = load_file(os.path.join(generated, "stage3_frames.safetensors"))["frames"]
    jax_frames = load_file(os.path.join(folder, "stage3_frames.safetensors"))["frames"]
    assert (jax_frames.int() - torch_frames.int()).abs().max() <= 1


def test_the_torch_decode_with_tiles_of_a_given_size(components):
    """decode_latents(tile_px=32) on AutoencoderKLHunyuanVideo (tiles set by sample-side sizes and strides, no
    latent-side minimums): diffusers' tiled decode with 32 px tiles at the VAE's own overlap (stride 24 = 32 x 192 /
    256), the caller's tiling settings left as found."""
    from hyv_lib.runtimes.vae import decode_latents, to_uint8_frames

    vae = copy.deepcopy(components["vae"])
    before = {k: v for k, v in vars(vae).items() if k.startswith(("tile_", "use_"))}
    z = torch.randn(1, 16, 2, 8, 8, generator=torch.Generator().manual_seed(4))
    got = decode_latents(vae, z, tile_px=32)
    assert {k: v for k, v in vars(vae).items() if k.startswith(("tile_", "use_"))} == before
    vae.enable_tiling(tile_sample_min_height=32, tile_sample_min_width=32, tile_sample_stride_height=24,
                      tile_sample_stride_width=24)
    with torch.no_grad():
        expected = to_uint8_frames(vae.decode(z / vae.config.scaling_factor).sample[0])
    assert got.shape == (5, 64, 64, 3) and torch.equal(got, expected)
    assert not torch.equal(decode_latents(vae, z, tiling=False), got)  # the tiles were used


def tile_parallel_job(vae, z):
    """Every rank's tile-parallel decode of AutoencoderKLHunyuanVideo, with the tiles each rank decoded."""
    import torch.distributed as dist

    from hyv_lib.runtimes.tile_parallel import tile_parallel_decode

    torch.set_num_threads(1)
    timeline = []
    video = tile_parallel_decode(vae, z, timeline=timeline)
    timelines = [None] * dist.get_world_size()
    dist.all_gather_object(timelines, timeline)
    return video, timelines


def test_tile_parallel_decode_over_spatial_tiles_and_temporal_chunks(components):
    """AutoencoderKLHunyuanVideo has no latent-side tile minimums and decodes long videos in temporal chunks:
    tile_parallel_decode spreads the tiles of both over 2 gloo ranks and equals the VAE's own tiled decode."""
    from hyv_lib.parallel.distributed import run_distributed
    from hyv_lib.runtimes.vae import latent_tile
    from test_parallel import torch_threads

    vae = copy.deepcopy(components["vae"])
    vae.enable_tiling(tile_sample_min_height=32, tile_sample_min_width=32, tile_sample_stride_height=24,
                      tile_sample_stride_width=24, tile_sample_min_num_frames=4, tile_sample_stride_num_frames=4)
    assert latent_tile(vae) == (4, 4)  # what the VAE's _decode computes: 32 px / 8
    z = torch.randn(1, 16, 3, 6, 6, generator=torch.Generator().manual_seed(5))  # 3 latent frames
    (video, timelines) = run_distributed(tile_parallel_job, 2, vae, z, timeout=240)
    with torch_threads(1), torch.no_grad():  # the ranks' count, restored after (later tests compare bitwise)
        expected = vae.decode(z).sample
    assert video.shape == expected.shape == (1, 3, 9, 48, 48)
    assert torch.equal(video, expected)
    # 1-latent-frame chunks with their causal frame of overlap (3 chunks) x 2 x 2 spatial tiles, round robin
    assert [[i for i, _, _ in t] for t in timelines] == [[0, 2, 4, 6, 8, 10], [1, 3, 5, 7, 9, 11]]


def test_load_pipeline_generates_a_video(generated):
    """hyv_lib.load_pipeline("hunyuanvideo_tiny").generate gives the same latents as the CLI's generate."""
    import hyv_lib

    video = hyv_lib.load_pipeline("hunyuanvideo_tiny", progress=False).generate(
        "a cat", "blurry", num_inference_steps=STEPS, progress=False)
    assert video.frames.shape == (9, 96, 160, 3)
    assert torch.equal(video.latents, load_file(os.path.join(generated, "stage2_latents.safetensors"))["latents"])


def test_a_saved_real_layout_folder_through_the_stages(tmp_path):
    """save_tiny --preset hunyuanvideo_t2v writes the real pipeline's layout at tiny widths; stage1 --model_path
    (no --preset) detects hunyuanvideo_t2v from the folder, stage2 and stage3 follow from its files alone."""
    folder, out = str(tmp_path / "hunyuanvideo_t2v"), str(tmp_path / "out")
    assert run(["save_tiny", "--preset", "hunyuanvideo_t2v", "--output_dir", folder, "--quiet"]) == 0
    assert run(["stage1", "--model_path", folder, "--prompt", "a cat", "--output_dir", out, "--quiet"]) == 0
    config = json.load(open(os.path.join(out, "generation_config.json")))
    assert config["preset"] == "hunyuanvideo_t2v" and config["preset_source"] == "--model_path"
    assert config["model_path"] == folder
    assert run(["stage2", "--input_dir", out, "--num_inference_steps", str(STEPS), "--height", "32", "--width", "48",
                "--video_length", "5", "--quiet"]) == 0
    assert load_file(os.path.join(out, "stage2_latents.safetensors"))["latents"].shape == (1, 16, 2, 4, 6)
    assert run(["stage3", "--input_dir", out, "--quiet"]) == 0
    from hyv_lib.pipeline.video_io import read_mp4

    frames, meta = read_mp4(os.path.join(out, "output_video.mp4"))
    assert frames.shape == (5, 32, 48, 3) and meta["fps"] == HUNYUANVIDEO_T2V.fps


def test_a_prompts_file_with_two_lines(tmp_path, generated):
    """generate --prompts_file: one folder per line, each a whole run; the first line's equals generate's."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a cat\na red square moving left\n")
    out = str(tmp_path / "batch")
    assert run(["generate", "--preset", "hunyuanvideo_tiny", "--prompts_file", str(prompts), "--negative_prompt",
                "blurry", "--output_dir", out, "--num_inference_steps", str(STEPS), "--quiet"]) == 0
    runs = sorted(d for d in os.listdir(out) if os.path.isdir(os.path.join(out, d)))
    assert len(runs) == 2, os.listdir(out)
    latents = [load_file(os.path.join(out, d, "stage2_latents.safetensors"))["latents"] for d in runs]
    assert all(os.path.exists(os.path.join(out, d, "output_video.mp4")) for d in runs)
    assert torch.equal(latents[0], load_file(os.path.join(generated, "stage2_latents.safetensors"))["latents"])
    assert not torch.equal(latents[0], latents[1])
