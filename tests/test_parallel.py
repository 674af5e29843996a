"""Ulysses sequence parallelism on gloo CPU processes: equal to diffusers' forward, bad head splits rejected."""

import contextlib
import copy
import time

import pytest
import torch
import torch.distributed as dist
from tiny_inputs import forward_kwargs as inputs

from hyv_lib.models.families import get_preset
from hyv_lib.parallel.distributed import run_distributed
from hyv_lib.runtimes.ulysses import UlyssesTransformer, check_heads, shard_length

TINY = get_preset("tiny")


# Video token counts 120 (divides 2 and 4), 35 (divides neither), 3 (fewer tokens than 4 ranks: one
# rank holds only padding); t2v and i2v; CFG-style batches with different text lengths, no/partial ByT5.
CASES = [
    dict(seed=0),
    dict(seed=1, image=True, text_lengths=(128, 1), byt5_lengths=(32, 0), latent=(1, 5, 7)),
    dict(seed=2, text_lengths=(3, 77), byt5_lengths=(5, 5), latent=(3, 1, 1)),
]


def tiny_transformer(heads):
    """The tiny preset's transformer config (2 heads) with ``heads`` heads of the same size (16), seeded."""
    from diffusers.models.transformers.transformer_hunyuan_video15 import HunyuanVideo15Transformer3DModel

    torch.manual_seed(3)
    return HunyuanVideo15Transformer3DModel(**{**TINY.transformer, "num_attention_heads": heads}).eval()


def compare_with_oracle(heads, group=None):
    """On every rank of ``group``: Ulysses vs diffusers' forward for each case. Returns the max error per
    case, the largest difference between ranks' outputs, the difference of a 3-step denoising loop
    (eager diffusers vs Ulysses as the step) and the seconds per Ulysses call."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    from hyv_lib.models.hunyuan_video15.sampling import denoise
    from hyv_lib.models.family import initial_latents
    from hyv_lib.runtimes.step import torch_step

    oracle = tiny_transformer(heads)
    ulysses = UlyssesTransformer(copy.deepcopy(oracle), group=group)
    errors, spreads, seconds = [], [], []
    for case in CASES:
        kwargs = inputs(**case)
        with torch.no_grad():
            expected = oracle(**kwargs).sample
        start = time.perf_counter()
        out = ulysses(**kwargs)
        seconds.append(time.perf_counter() - start)
        assert out.shape == expected.shape
        errors.append((out - expected).abs().max().item())
        every = [torch.empty_like(out) for _ in range(dist.get_world_size(group))]
        dist.all_gather(every, out, group=group)
        spreads.append(max((o - out).abs().max().item() for o in every))

    # The pipeline's loop takes the wrapper as its transformer step unchanged.
    kwargs = inputs(seed=4, latent=(1, 3, 5))
    conditioning = {k: v for k, v in kwargs.items() if k not in ("hidden_states", "timestep")}
    latents = initial_latents((1, TINY.latent_channels, 1, 3, 5), seed=0)
    runs = [denoise(step, latents, conditioning, FlowMatchEulerDiscreteScheduler(shift=TINY.flow_shift),
                             num_inference_steps=3, guidance_scale=6.0, progress=False)
            for step in (torch_step(oracle), ulysses)]
    return dict(heads=heads, ranks=dist.get_world_size(group), errors=errors, spread=max(spreads),
                loop=(runs[0] - runs[1]).abs().max().item(), seconds=seconds)


def check_everything():
    """One group of 4 processes: ranks {0,1} and {2,3} run 2-rank groups (2 and 4 heads), then all
    four run a 4-rank group (4 heads) and try 2 heads on 4 ranks. Returns every rank's findings."""
    rank = dist.get_rank()
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every rank takes part in creating both
    found = {"two_ranks": compare_with_oracle(2 if rank < 2 else 4, group=pairs[rank // 2]),
             "four_ranks": compare_with_oracle(4)}
    with pytest.raises(ValueError) as info:
        UlyssesTransformer(tiny_transformer(2))
    found["bad_split"] = str(info.value)
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, found)
    return everyone


@pytest.fixture(scope="module")
def findings():
    start = time.perf_counter()
    found = run_distributed(check_everything, 4, timeout=240)
    print(f"\n4 gloo processes: {time.perf_counter() - start:.1f} s")
    return found


def report(result):
    print(f"{result['ranks']} ranks, {result['heads']} heads: max errors {['%.1e' % e for e in result['errors']]}, "
          f"rank spread {result['spread']}, 3-step loop {result['loop']:.1e}, "
          f"seconds per call {['%.3f' % s for s in result['seconds']]}")


@pytest.mark.parametrize("ranks", [2, 4])
def test_ulysses_equals_the_oracle(findings, ranks):
    key = "two_ranks" if ranks == 2 else "four_ranks"
    results = [found[key] for found in findings]
    for result in (results[0], results[2]) if ranks == 2 else results[:1]:
        report(result)
    for result in results:
        assert result["ranks"] == ranks
        assert max(result["errors"]) <= 1e-5
        assert result["spread"] == 0.0  # every rank returns the same tensor
        assert result["loop"] <= 1e-4


def test_bad_head_split_is_a_clear_error(findings):
    assert all(found["bad_split"].startswith("2 heads cannot be split over 4 ranks") for found in findings)
    check_heads(16, 8)
    with pytest.raises(ValueError, match=r"^16 heads cannot be split over 3 ranks.*\(1, 2, 4, 8, 16\)$"):
        check_heads(16, 3)


def cast_after_build():
    """A Ulysses step built on an fp32 model, then the model cast to fp64: the step reads the model's dtype (and
    device) when it runs, so it serves the fp64 model and matches diffusers' fp64 forward."""
    oracle = tiny_transformer(2)
    model = copy.deepcopy(oracle)
    step = UlyssesTransformer(model)
    torch.nn.Module.to(model, torch.float64)  # (diffusers' own to() warns about fp32-pinned modules: none here)
    kwargs = inputs(seed=5)
    out = step(**kwargs)
    with torch.no_grad():
        expected = torch.nn.Module.to(oracle, torch.float64)(**{k: v.double() if v.is_floating_point() else v
                                                for k, v in kwargs.items()}).sample
    real_backend, refused = dist.get_backend, ""
    dist.get_backend = lambda group=None: "nccl"  # a stand-in: nccl with the model still on the host
    try:
        step(**kwargs)
    except ValueError as err:
        refused = str(err)
    finally:
        dist.get_backend = real_backend
    found = [None] * dist.get_world_size()
    dist.all_gather_object(found, (str(out.dtype), (out.double() - expected).abs().max().item(), refused))
    return found


def test_ulysses_step_serves_a_model_cast_after_it_was_built():
    """... and under nccl a model left on the host is a clear error before any collective (nccl takes GPU tensors
    only: the runs of run_distributed(..., backend="nccl") once handed it CPU tensors)."""
    for dtype, err, refused in run_distributed(cast_after_build, 2, timeout=240):  # every rank's findings
        assert dtype == "torch.float64" and err <= 1e-10, (dtype, err)
        assert refused.startswith("the model is on cpu, but nccl exchanges GPU tensors only"), refused


def test_shard_lengths():
    assert [shard_length(n, 4) for n in (120, 35, 3)] == [30, 9, 1]


def test_needs_an_initialised_process_group():
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    with pytest.raises(RuntimeError, match="init_process_group"):
        UlyssesTransformer(None)  # checked before the model is touched


@pytest.mark.slow  # its own processes
def test_torchrun_cli_with_the_ulysses_runtime_equals_torch(tiny_run, tmp_path):
    """`torchrun --nproc_per_node=2 -m hyv_lib stage2 --runtime ulysses` on gloo: rank 0 writes the file."""
    import subprocess
    import sys

    from safetensors.torch import load_file

    from hyv_lib.pipeline.stages import stage2

    common = ["--num_inference_steps", "3", "--video_length", "5", "--quiet"]
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "-m", "hyv_lib",
                        "stage2", "--input_dir", str(tiny_run), "--output_dir", str(tmp_path / "uly"),
                        "--runtime", "ulysses", *common], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    expected = stage2(str(tiny_run), output_dir=str(tmp_path / "torch"), num_inference_steps=3,
                      video_length=5, quiet=True)
    got = load_file(tmp_path / "uly" / "stage2_latents.safetensors")["latents"]
    assert (got - expected).abs().max() <= 1e-5


def test_ulysses_outside_torchrun_is_a_clear_error(tiny_run, tmp_path, capsys):
    from hyv_lib.cli.commands import run

    assert run(["stage2", "--input_dir", str(tiny_run), "--output_dir", str(tmp_path), "--runtime", "ulysses",
                "--quiet"]) == 2
    assert "torchrun --nproc_per_node" in capsys.readouterr().err


@contextlib.contextmanager
def torch_threads(n):
    """Run with ``n`` intra-op threads: CPU convolutions sum in a thread-count-dependent order, so bitwise
    comparisons across processes must use the same count on both sides."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _tile_parallel_job(vae, z):
    """Every rank's decode; returns rank 0's video, the thread count and every rank's tile timeline."""
    from hyv_lib.runtimes.tile_parallel import tile_parallel_decode

    timeline = []
    video = tile_parallel_decode(vae, z, timeline=timeline)
    timelines = [None] * dist.get_world_size()
    dist.all_gather_object(timelines, timeline)
    return video, torch.get_num_threads(), timelines


def test_vae_tile_parallel_decode_equals_the_single_process_tiled_decode():
    from hyv_lib.models.families import get_preset
    from hyv_lib.models.components import build_tiny_components
    from hyv_lib.runtimes.tile_parallel import tile_parallel_decode

    tiny = get_preset("tiny")
    vae = build_tiny_components(tiny, names=["vae"])["vae"]
    z = torch.randn(1, tiny.latent_channels, 1, 20, 20, generator=torch.Generator().manual_seed(0))
    vae.enable_tiling()  # 16-latent tiles with overlap: a 20 x 20 latent is a 2 x 2 grid of tiles
    with torch.no_grad():
        expected = vae.decode(z).sample
    assert torch.equal(tile_parallel_decode(vae, z), expected)  # one process: the plain tiled decode
    got, rank_threads, timelines = run_distributed(_tile_parallel_job, 2, vae, z)
    with torch_threads(rank_threads), torch.no_grad():  # the ranks share the cores: fewer threads each
        expected = vae.decode(z).sample
    assert torch.equal(got, expected)
    # Each rank decoded only its share (tiles 0, 2 and 1, 3 of the 2 x 2 grid), and the two ranks decoded at
    # the same time: rank 1 started its first tile before rank 0 had finished its first (the old code made it
    # wait for tile 0's broadcast).
    assert [[i for i, _, _ in t] for t in timelines] == [[0, 2], [1, 3]]
    (_, start0, end0), (_, start1, _) = timelines[0][0], timelines[1][0]
    assert start1 < end0 and start0 < timelines[1][0][2], timelines


@pytest.mark.slow  # its own processes
def test_torchrun_stage3_spreads_tiles_and_rank0_writes(tiny_run, tmp_path):
    """stage3 under torchrun gives the same frames as one process, on a video of 2 x 2 VAE tiles."""
    import os
    import shutil
    import subprocess
    import sys

    from safetensors.torch import load_file

    from hyv_lib.cli.commands import run as cli_run

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    # 320 x 320 px: 20 x 20 latents, past diffusers' 16-latent (256 px) tile, so 2 x 2 tiles with overlap
    assert cli_run(["stage2", "--input_dir", str(run), "--height", "320", "--width", "320", "--video_length", "5",
                    "--num_inference_steps", "2", "--quiet"]) == 0
    latents = load_file(run / "stage2_latents.safetensors")["latents"]
    assert latents.shape[-2:] == (20, 20)
    # torchrun gives each rank OMP_NUM_THREADS=1; the single-process reference uses 1 thread too
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "-m", "hyv_lib",
                        "stage3", "--input_dir", str(run), "--output_video", str(tmp_path / "v.mp4"),
                        "--save_frames", "--quiet"], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    single = tmp_path / "single"
    single.mkdir()
    with torch_threads(1):
        assert cli_run(["stage3", "--input_dir", str(run), "--output_video", str(single / "v.mp4"),
                        "--save_frames", "--quiet"]) == 0
    frames = load_file(tmp_path / "stage3_frames.safetensors")["frames"]
    assert torch.equal(frames, load_file(single / "stage3_frames.safetensors")["frames"])


def test_torchrun_without_a_split_is_refused_before_any_file(tiny_run, tmp_path, monkeypatch, capsys):
    """Under torchrun (WORLD_SIZE 2) a stage that would run whole in every rank into the same files stops with one
    error line and writes nothing: stage 1, generate, stage 2 on --runtime torch or tpu without --shard_weights.
    (Stage 3 spreads its tiles: test_torchrun_stage3_spreads_tiles_and_rank0_writes.)"""
    import shutil

    from hyv_lib.cli.commands import run as cli

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    before = sorted(p.name for p in run.iterdir())
    monkeypatch.setenv("WORLD_SIZE", "2")
    fresh = tmp_path / "fresh"
    for argv, message in ((["stage1", "--preset", "tiny", "--prompt", "x", "--output_dir", str(fresh)],
                           "error: stage1: runs in one process, not in each of 2 torchrun ranks"),
                          (["generate", "--preset", "tiny", "--prompt", "x", "--output_dir", str(fresh)],
                           "error: generate: runs in one process"),
                          (["stage2", "--input_dir", str(run)], "error: --runtime: this process is one of 2 torchrun"),
                          (["stage2", "--input_dir", str(run), "--runtime", "jax"], "--runtime jax would run")):
        assert cli(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(message) or message in err, err
    assert sorted(p.name for p in run.iterdir()) == before and not fresh.exists()
