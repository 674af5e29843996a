"""FSDP2-sharded DiT weights (--shard_weights fsdp) on gloo CPU processes: equal to diffusers' forward, ~1/N of the
parameter bytes per rank between steps, one block (plus the root's own parameters) gathered at a time."""

import copy
import time

import pytest
import torch
import torch.distributed as dist
from tiny_inputs import forward_kwargs

from hyv_lib.base.errors import HyvInputError
from hyv_lib.models.families import get_preset
from hyv_lib.parallel.distributed import run_distributed
from hyv_lib.runtimes.fsdp import check_shard_weights, resident_parameter_bytes, shard_weights, sharded_step

TINY = get_preset("tiny")
# 15 video tokens: padded on both 2 and 4 ranks; a CFG-style batch of two with different text and ByT5 lengths.
CASE = dict(seed=7, latent=(1, 3, 5), text_lengths=(9, 30), byt5_lengths=(0, 5))


def tiny_transformer(heads):
    """The tiny preset's transformer (2 heads of 16) with ``heads`` heads of the same size, seeded: 4 ranks need 4."""
    from diffusers.models.transformers.transformer_hunyuan_video15 import HunyuanVideo15Transformer3DModel

    torch.manual_seed(3)
    return HunyuanVideo15Transformer3DModel(**{**TINY.transformer, "num_attention_heads": heads}).eval()


def nbytes(params):
    return sum(p.numel() * p.element_size() for p in params)


def padded_shard_bytes(params, world):
    """FSDP2's layout, worked by hand: each parameter split on dim 0 into ``world`` equal parts of
    ``ceil(dim0 / world)`` rows (the last ones padded), so a rank holds that many rows of every parameter, and a
    gathered parameter is ``world`` times that."""
    return sum(-(-p.shape[0] // world) * (p.numel() // p.shape[0]) * p.element_size() for p in params)


def sharded_job(heads, run=None, out_dir=None):
    """On every rank: the Ulysses and torch steps over FSDP-sharded weights vs diffusers' eager fp32 forward (and vs
    the unsharded Ulysses step), this rank's parameter bytes at rest, inside every block (hooks) and after. With a
    stage-1 folder ``run``: also the CLI's stage2 with ``--shard_weights fsdp`` on the ulysses and torch runtimes into
    ``out_dir``/<runtime> (rank 0 writes), as ``torchrun --nproc_per_node N -m hyv_lib stage2 ...`` runs it."""
    from hyv_lib.cli.commands import run as cli
    from hyv_lib.runtimes.step import torch_step
    from hyv_lib.runtimes.ulysses import UlyssesTransformer

    world = dist.get_world_size()
    oracle = tiny_transformer(heads)
    kwargs = forward_kwargs(**CASE)
    with torch.no_grad():
        expected = oracle(**kwargs).sample
    unsharded = UlyssesTransformer(copy.deepcopy(oracle))(**kwargs)

    model = shard_weights(copy.deepcopy(oracle))
    assert shard_weights(model) is model  # idempotent
    rest = resident_parameter_bytes(model)
    inside = []

    def record(module, *_):
        inside.append(resident_parameter_bytes(model))

    for block in model.transformer_blocks:  # after FSDP's gather, before its free
        block.register_forward_pre_hook(record)
        block.register_forward_hook(record, prepend=True)
    step = sharded_step(UlyssesTransformer(model), model)
    start = time.perf_counter()
    out = step(**kwargs)
    seconds = time.perf_counter() - start
    after = resident_parameter_bytes(model)

    plain = shard_weights(copy.deepcopy(oracle))  # diffusers' own forward, every rank the full sequence
    out_torch = sharded_step(torch_step(plain), plain)(**kwargs)
    twice = sharded_step(torch_step(plain), plain)(**kwargs)

    with pytest.raises(HyvInputError, match="outside hyv_lib") as info:  # FSDP applied by someone else
        from torch.distributed.fsdp import fully_shard
        shard_weights(fully_shard(copy.deepcopy(oracle)))
    found = dict(
        world=world, error=(out - expected).abs().max().item(), vs_unsharded=(out - unsharded).abs().max().item(),
        torch_error=(out_torch - expected).abs().max().item(), torch_again=(twice - out_torch).abs().max().item(),
        total=nbytes(oracle.parameters()), padded=padded_shard_bytes(oracle.parameters(), world),
        blocks=[world * padded_shard_bytes(b.parameters(), world) for b in oracle.transformer_blocks],
        root=world * padded_shard_bytes([p for n, p in oracle.named_parameters()
                                         if not n.startswith("transformer_blocks.")], world),
        rest=tuple(rest), inside=[tuple(b) for b in inside], after=tuple(after), seconds=seconds,
        outside_error=info.value.argument)
    if run is not None:
        steps = [f"--{name}={value}" for name, value in SURFACE_STEPS.items()]
        found["cli"] = [cli(["stage2", "--input_dir", run, "--output_dir", f"{out_dir}/{runtime}", "--quiet",
                             "--runtime", runtime, "--shard_weights", "fsdp", *steps])
                        for runtime in ("ulysses", "torch")]
    everyone = [None] * world
    dist.all_gather_object(everyone, found)
    return everyone


@pytest.fixture(scope="module")
def cli_out(tmp_path_factory):
    return tmp_path_factory.mktemp("fsdp_cli")


RUNS = {}  # world size -> every rank's findings, one run each for this module


def run_ranks(world, tiny_run, cli_out):
    if world not in RUNS:
        start = time.perf_counter()
        cli_args = (str(tiny_run), str(cli_out)) if world == 2 else ()  # the CLI on the tiny preset's 2 heads
        RUNS[world] = run_distributed(sharded_job, world, world, *cli_args, timeout=240)  # as many heads as ranks
        print(f"\n{world} gloo processes: {time.perf_counter() - start:.1f} s")
    return RUNS[world]


@pytest.fixture(scope="module", params=[2, 4], ids=["2_ranks", "4_ranks"])
def findings(request, tiny_run, cli_out):
    return run_ranks(request.param, tiny_run, cli_out)


def test_sharded_ulysses_and_torch_steps_equal_the_oracle(findings):
    for f in findings:
        print(f"rank of {f['world']}: ulysses+fsdp max error {f['error']:.1e} (vs unsharded ulysses "
              f"{f['vs_unsharded']:.1e}), torch+fsdp {f['torch_error']:.1e}, step {f['seconds']:.2f} s")
        assert f["error"] <= 2e-6  # measured 2.4e-7 (2 ranks) and 3.6e-7 (4 ranks)
        assert f["vs_unsharded"] == 0.0  # gathering the weights is exact: the same step as unsharded Ulysses
        assert f["torch_error"] == 0.0 and f["torch_again"] == 0.0  # diffusers' forward on gathered weights
        assert f["outside_error"] == "shard_weights"


def test_each_rank_holds_its_shards_and_one_block_at_a_time(findings):
    for rank, f in enumerate(findings):
        world, total, root, blocks = f["world"], f["total"], f["root"], f["blocks"]
        shards, whole = f["rest"]
        if rank == 0:
            print(f"{world} ranks: {shards} of {total} parameter bytes per rank at rest ({shards / total:.3f}; "
                  f"1/N = {1 / world:.3f}), peak inside a block {max(sum(b) for b in f['inside'])} "
                  f"(root {root}, block {max(blocks)})")
        assert whole == 0 and shards == f["padded"]  # exactly FSDP's dim-0 rows, padding included
        assert total / world <= shards <= total / world * 1.05  # padding: under 5% here
        assert len(f["inside"]) == 2 * len(blocks)  # a pre and a post record per block
        for i, (shards_now, whole_now) in enumerate(f["inside"]):
            assert whole_now == root + blocks[i // 2]  # the root's own parameters and this block (padded), no more
            assert shards_now + whole_now <= shards + root + max(blocks)
        assert f["after"] == f["rest"]  # everything freed after the step


def test_bad_combinations_name_shard_weights():
    cases = [dict(shard_weights="zero3", runtime="ulysses", distributed=True),
             dict(shard_weights="fsdp", runtime="jax", distributed=True),
             dict(shard_weights="fsdp", runtime="ulysses", offload="block", distributed=True),
             dict(shard_weights="fsdp", runtime="ulysses", distributed=False)]
    for case in cases:
        with pytest.raises(HyvInputError) as info:
            check_shard_weights(**case)
        assert info.value.argument == "shard_weights", case
    check_shard_weights(None, "jax", offload="block", distributed=False)  # no sharding asked
    check_shard_weights("fsdp", "ulysses", distributed=True)
    check_shard_weights("fsdp", "torch", distributed=True)


def test_outside_torchrun_is_a_clear_error(monkeypatch):
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(HyvInputError, match="torchrun --nproc_per_node") as info:
        shard_weights(torch.nn.Linear(2, 2))
    assert info.value.argument == "shard_weights"


def test_per_rank_bytes_of_the_real_model():
    """The 8.3B DiT (720p_t2v, bf16, built on the meta device) laid out as FSDP2 shards it on the gloo runs above:
    each rank's bytes between steps and with the root's parameters and one block gathered."""
    from diffusers.models.transformers.transformer_hunyuan_video15 import HunyuanVideo15Transformer3DModel

    with torch.device("meta"):
        model = HunyuanVideo15Transformer3DModel(**get_preset("720p_t2v").transformer)
    torch.nn.Module.to(model, torch.bfloat16)  # (diffusers' own to() warns about fp32-pinned modules: none here)
    blocks = model.transformer_blocks
    root = [p for n, p in model.named_parameters() if not n.startswith("transformer_blocks.")]
    # the counts of /work/shared/reference/hunyuanvideo15_facts.md section 1.5 (meta-device build)
    assert sum(p.numel() for p in model.parameters()) == 8_326_608_160
    assert sum(p.numel() for p in blocks[0].parameters()) == 151_056_896 and len(blocks) == 54
    gib = 2**30
    total = nbytes(model.parameters())
    for world in (2, 4, 8):
        shards = padded_shard_bytes(model.parameters(), world)
        gathered = world * (padded_shard_bytes(root, world) + padded_shard_bytes(blocks[0].parameters(), world))
        print(f"720p_t2v bf16 on {world} ranks: {shards / gib:.2f} GiB per rank between steps, "
              f"{(shards + gathered) / gib:.2f} GiB inside a block (all {total / gib:.2f} GiB replicated)")
        assert total / world <= shards <= total / world * 1.001


# ---------------------------------------------------------------------------------------------- public surfaces
SURFACE_STEPS = dict(num_inference_steps=2, video_length=5)


def test_cli_stage2_on_two_ranks_writes_the_single_process_latents(tiny_run, cli_out, tmp_path):
    """`torchrun --nproc_per_node 2 -m hyv_lib stage2 --runtime ulysses|torch --shard_weights fsdp`, run in-process on
    the 2 gloo ranks of :func:`sharded_job`, writes the latents of the single-process run and records the setting."""
    import json

    from safetensors.torch import load_file

    from hyv_lib.pipeline.stages import stage2

    assert all(f["cli"] == [0, 0] for f in run_ranks(2, tiny_run, cli_out))
    expected = stage2(str(tiny_run), output_dir=str(tmp_path), quiet=True, **SURFACE_STEPS)
    for runtime in ("ulysses", "torch"):
        got = load_file(cli_out / runtime / "stage2_latents.safetensors")["latents"]
        config = json.loads((cli_out / runtime / "generation_config.json").read_text())
        print(f"stage2 --runtime {runtime} --shard_weights fsdp on 2 ranks: max difference "
              f"{(got - expected).abs().max():.1e}")
        assert (got - expected).abs().max() <= 1e-5  # measured 2.6e-6 (1 thread per rank vs 2 here)
        assert config["shard_weights"] == "fsdp" and config["runtime"] == runtime
    assert "shard_weights" not in json.loads((tmp_path / "generation_config.json").read_text())  # only when set


def test_load_pipeline_with_ulysses_and_sharded_weights(monkeypatch):
    """``load_pipeline("tiny", runtime="ulysses", shard_weights="fsdp")`` in a torchrun process (a group of one here:
    the wiring; the splits are the tests above) gives the single-process pipeline's latents, and with a cache the
    single-process cached latents (2 ranks: tests/test_cache_parallel.py)."""
    import hyv_lib
    from hyv_lib.parallel.distributed import free_port
    from hyv_lib.runtimes.fsdp import SHARDED, ShardedStep

    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    video = dict(num_inference_steps=2, video_length=1, height=32, width=32, seed=3, progress=False)
    expected = hyv_lib.load_pipeline("tiny", progress=False).generate("a red ball", **video)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        pipe = hyv_lib.load_pipeline("tiny", runtime="ulysses", shard_weights="fsdp", progress=False)
        got = pipe.generate("a red ball", **video)
        assert isinstance(pipe.step, ShardedStep) and pipe.components["transformer"] in SHARDED
        cache = hyv_lib.DeepCacheSchedule(3, 1, 3, 2)  # steps 0 and 1 full, 2 cached
        cached = pipe.generate("a red ball", cache=cache, **{**video, "num_inference_steps": 3})
    finally:
        dist.destroy_process_group()
    print(f"load_pipeline ulysses+fsdp: max difference {(got.latents - expected.latents).abs().max():.1e}")
    assert (got.latents - expected.latents).abs().max() <= 1e-5
    assert got.config["shard_weights"] == "fsdp" and "shard_weights" not in expected.config
    single = hyv_lib.load_pipeline("tiny", progress=False).generate("a red ball", cache=cache,
                                                                   **{**video, "num_inference_steps": 3})
    print(f"  with a cache: max difference {(cached.latents - single.latents).abs().max():.1e}")
    assert (cached.latents - single.latents).abs().max() <= 1e-5
    assert (cached.config["cache_full_steps"], cached.config["cache_cached_steps"]) == (2, 1)


def test_the_surfaces_refuse_sharding_outside_torchrun(tiny_run, tmp_path, capsys, monkeypatch):
    import hyv_lib
    from hyv_lib.cli.commands import run as cli
    from hyv_lib.pipeline.batch import BatchRunner

    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    monkeypatch.delenv("RANK", raising=False)
    assert cli(["stage2", "--input_dir", str(tiny_run), "--output_dir", str(tmp_path), "--runtime", "ulysses",
                "--shard_weights", "fsdp", "--quiet"]) == 2
    assert "error: --shard_weights: splits the weights over one process per device: torchrun" in capsys.readouterr().err
    with pytest.raises(HyvInputError) as info:  # before anything loads
        hyv_lib.load_pipeline("tiny", runtime="ulysses", shard_weights="fsdp")
    assert info.value.argument == "shard_weights"
    monkeypatch.setenv("RANK", "0")  # under torchrun: a pipeline for many prompts still refuses it
    with pytest.raises(HyvInputError) as info:
        BatchRunner("tiny", stage2=dict(runtime="torch", shard_weights="fsdp"))
    assert info.value.argument == "shard_weights"
    assert cli(["stage2", "--input_dir", str(tiny_run), "--output_dir", str(tmp_path), "--runtime", "jax",
                "--shard_weights", "fsdp", "--quiet"]) == 2
    assert "error: --shard_weights:" in capsys.readouterr().err
