"""--compile: the transformer blocks under torch.compile (inductor, CPU) against the eager steps, fp32.

Tiny HunyuanVideo-1.5 (2 dual-stream blocks) and tiny CogVideoX (2 blocks): a block traces to one graph with no break
(hyv_lib's attention is one opaque custom op), both blocks share one compilation, and the compiled steps (torch,
DeepCache, SSTA, Ulysses and FSDP2 on 2 gloo ranks, the CLI's stage 2) equal the eager ones. Measured here (fp32, CPU,
torch 2.12.1): every compiled output within 6e-7 of the eager one (outputs up to ~2-4 in magnitude; inductor fuses and
reorders float sums), so TOL is about 8x that.
"""

import copy
import json

import pytest
import torch
from diffusers import CogVideoXTransformer3DModel
from diffusers.models.transformers.transformer_hunyuan_video15 import HunyuanVideo15Transformer3DModel
from tiny_inputs import TINY
from tiny_inputs import forward_kwargs as hunyuan_inputs
from torch._dynamo.utils import counters

from hyv_lib.base.errors import HyvInputError
from hyv_lib.models.cogvideox.presets import COGVIDEOX_TINY
from hyv_lib.kernels.ssta import SstaConfig
from hyv_lib.kernels.ssta_torch import host_compile
from hyv_lib.models.cogvideox.adapter import COGVIDEOX
from hyv_lib.models.registry import adapter_for
from hyv_lib.parallel.distributed import run_distributed
from hyv_lib.runtimes.compiled import compile_blocks, is_compiled, warmup_calls
from hyv_lib.runtimes.deepcache import DeepCacheSchedule
from hyv_lib.runtimes.placement import offload_blocks
from hyv_lib.runtimes.step import make_step

TOL = 5e-6
#: Latents after a denoising loop with CFG 6, whose combination uncond + 6 (cond - uncond) scales a prediction's
#: error by up to 11 per step (measured: 1.4e-5 after 2 steps of the trained tiny model).
LOOP_TOL = 1e-4


def trust_cpu_isa() -> None:
    """Inductor checks each SIMD extension the CPU reports (AVX2, AVX-512, its VNNI, BF16 and AMX parts) by building
    a test library and loading it in a new Python process: 10-15 s once per process on this 2-core machine. Trust the
    CPU's flags instead (gcc builds them all here); the generated kernels are the same."""
    from torch._inductor.cpu_vec_isa import VecISA

    VecISA.check_build = lambda self, code: True


@pytest.fixture(scope="module", autouse=True)
def trusted_cpu_isa():
    """:func:`trust_cpu_isa` for this module's tests, put back after."""
    from torch._inductor.cpu_vec_isa import VecISA

    before = VecISA.check_build
    trust_cpu_isa()
    yield
    VecISA.check_build = before


def hunyuan(seed: int = 3) -> HunyuanVideo15Transformer3DModel:
    torch.manual_seed(seed)  # no gradients, as loaded (dynamo guards on requires_grad: the CLI's model then matches)
    return HunyuanVideo15Transformer3DModel(**TINY.transformer).eval().requires_grad_(False)


def cogvideox(seed: int = 0) -> CogVideoXTransformer3DModel:
    torch.manual_seed(seed)
    return CogVideoXTransformer3DModel(**COGVIDEOX_TINY.transformer).eval().requires_grad_(False)


def cogvideox_inputs(model, seed: int = 0, shape=(2, 4, 16, 4, 6)) -> dict:
    g = torch.Generator().manual_seed(seed)
    return dict(hidden_states=torch.randn(*shape, generator=g), timestep=torch.tensor([999, 400]),
                encoder_hidden_states=torch.randn(shape[0], 226, COGVIDEOX_TINY.text_dim, generator=g),
                image_rotary_emb=COGVIDEOX.rope(model, shape))


def graphs() -> int:
    """Graphs dynamo has compiled in this process so far."""
    return counters["stats"]["unique_graphs"]


def block_call(model, kwargs, index: int):
    """(args, kwargs) of block ``index`` as the model's forward calls it (an eager run, recorded by a pre-hook)."""
    seen = {}
    block = adapter_for(model).blocks(model)[index]
    handle = block.register_forward_pre_hook(lambda m, a, k: seen.update(args=a, kwargs=k), with_kwargs=True)
    with torch.no_grad():
        model(**kwargs)
    handle.remove()
    return block, seen["args"], seen["kwargs"]


def test_the_attention_op_is_the_eager_attention_with_a_true_fake():
    """torch.ops.hyv.attention returns exactly the dispatch's result; opcheck compares its fake (what inductor plans
    with: shape, dtype, strides) with the real output, and its schema, on padded, transposed and SSTA calls."""
    from hyv_lib.kernels.custom_op import OPTION_SETS, attention_op, options_key
    from hyv_lib.kernels.dispatch import attention

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 12, 8, generator=g) for _ in range(3))
    mask = torch.arange(12)[None] < torch.tensor([[12], [7]])
    config = SstaConfig(tile=(1, 2, 2), window=(1, 1, 1), topk=2)
    key = options_key({"ssta": config})
    assert options_key({"ssta": SstaConfig(tile=(1, 2, 2), window=(1, 1, 1), topk=2)}) == key  # interned by value
    assert OPTION_SETS[key] == {"ssta": config} and options_key({}) == 0
    assert torch.equal(torch.ops.hyv.attention(q, k, v, mask, "sdpa", [], 0), attention(q, k, v, mask, backend="sdpa"))
    assert torch.equal(torch.ops.hyv.attention(q, k, v, mask, "ssta_reference", [2, 2, 2], key),
                       attention(q, k, v, mask, backend="ssta_reference", ssta=config, grid=(2, 2, 2)))
    for args in ((q, k, v, mask, "sdpa", [], 0), (q, k, v, mask, "ssta_reference", [2, 2, 2], key),
                 (q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), None, "reference", [], 0)):
        with host_compile(torch.device("cpu")):  # opcheck's RNG freeze asks the accelerator (torchax's "jax")
            results = torch.library.opcheck(attention_op, args)
        assert set(results.values()) == {"SUCCESS"}, results
    with pytest.raises(TypeError, match="not hashable"):
        options_key({"ssta": {"tile": [1, 2, 2]}})


CASES = {"hunyuan": (hunyuan, lambda m: hunyuan_inputs(), {}),
         # ssta_reference: SSTA's float32 oracle, the same grid and SstaConfig binding as `ssta` (which calls a
         # compiled FlexAttention inside the op: ~30 s more to compile here; measured compiled vs eager 3e-7 too)
         "hunyuan_ssta": (hunyuan, lambda m: hunyuan_inputs(), {"attention": "ssta_reference", "attention_options": {
             "ssta": SstaConfig(tile=(1, 2, 2), window=(1, 1, 1), topk=2)}}),
         "cogvideox": (cogvideox, cogvideox_inputs, {})}


@pytest.mark.parametrize("case", list(CASES))
def test_a_block_traces_to_one_graph_without_breaks(case):
    """fullgraph=True fails on any graph break; a counting backend sees one graph holding the attention op.
    (Dynamo only: no inductor.) Without the custom op, SDPA's per-sample ``int(valid.sum())`` breaks the graph."""
    build, inputs, step_options = CASES[case]
    model = build()
    make_step(model, **step_options)  # hyv_lib's attention installed
    found = []

    def count(graph, example_inputs):
        found.append(graph)
        return graph.forward

    block, args, kwargs = block_call(model, inputs(model), -1)
    with torch.no_grad(), host_compile(torch.device("cpu")):  # an earlier test may have imported torchax
        torch.compile(block.forward, fullgraph=True, backend=count, dynamic=False)(*args, **kwargs)
    ops = [str(node.target) for node in found[0].graph.nodes if node.op == "call_function"]
    print(f"{case}: {len(found)} graph of {len(ops)} ops, {sum('hyv.attention' in op for op in ops)} attention op")
    assert len(found) == 1 and sum("hyv.attention" in op for op in ops) == 1


@pytest.mark.parametrize("case", ["hunyuan", "cogvideox"])
def test_compiled_step_equals_eager_with_one_compilation_for_all_blocks(case):
    build, inputs, _ = CASES[case]
    eager_model = build()
    model = copy.deepcopy(eager_model)
    eager, compiled = make_step(eager_model), make_step(model, compile=True)
    assert compile_blocks(model) == 2 and is_compiled(model) and not is_compiled(eager_model)
    kwargs = inputs(model)
    before = graphs()
    with torch.no_grad():
        expected, out = eager(**kwargs), compiled(**kwargs)
        after_first = graphs()
        again = compiled(**kwargs)
    err = (out - expected).abs().max().item()
    print(f"{case}: compiled vs eager {err:.1e} (outputs up to {expected.abs().max():.2f}); "
          f"graphs compiled: {after_first - before} for the first call, {graphs() - after_first} for the second")
    assert err <= TOL and torch.equal(out, again)
    assert after_first - before == 1  # two blocks of one class: one compilation
    assert graphs() == after_first  # same shapes: no recompilation


def test_deepcache_with_compiled_blocks_equals_eager_deepcache():
    """DeepCache's hooks on the blocks still fire (a full step records what enters the last block), and its cached
    steps run the compiled last block."""
    schedule = DeepCacheSchedule(4, start=1, end=4, interval=2)  # steps 0 and 1 full, 2 cached, 3 full
    eager_model = hunyuan()
    eager = make_step(eager_model, cache=schedule)
    compiled = make_step(copy.deepcopy(eager_model), cache=schedule, compile=True)
    errors = []
    with torch.no_grad():
        for i in range(schedule.num_steps):
            kwargs = hunyuan_inputs(seed=i)
            errors.append((compiled(**kwargs) - eager(**kwargs)).abs().max().item())
    print(f"DeepCache compiled vs eager per step: {['%.1e' % e for e in errors]}")
    assert (compiled.full_calls, compiled.cached_calls) == (eager.full_calls, eager.cached_calls) == (3, 1)
    assert max(errors) <= TOL


def test_ssta_runs_compiled():
    """SSTA's token grid reaches the opaque op as an int list, its SstaConfig as a bound option set."""
    build, inputs, options = CASES["hunyuan_ssta"]
    eager_model = build()
    eager, compiled = make_step(eager_model, **options), make_step(copy.deepcopy(eager_model), compile=True, **options)
    kwargs = inputs(eager_model)
    with torch.no_grad():
        err = (compiled(**kwargs) - eager(**kwargs)).abs().max().item()
    print(f"SSTA compiled vs eager: {err:.1e}")
    assert err <= TOL


def test_warmup_calls():
    model = hunyuan()
    assert warmup_calls(model, 0, ((1, 8, 2, 6, 10), 2)) == 0  # not compiled: nothing extra
    compile_blocks(model)
    assert warmup_calls(model, 0, ((1, 8, 2, 6, 10), 2)) == 1  # the first loop of these inputs compiles untimed
    assert warmup_calls(model, 0, ((1, 8, 2, 6, 10), 2)) == 0
    assert warmup_calls(model, 0, ((1, 8, 3, 6, 10), 2)) == 1  # another frame count compiles again
    assert warmup_calls(model, 3, ((1, 8, 2, 6, 10), 2)) == 3  # asked for: as asked


def test_refusals():
    with pytest.raises(HyvInputError, match="jax runtime is always compiled") as info:
        make_step(hunyuan(), "jax", compile=True)
    assert info.value.argument == "compile"
    model = hunyuan()
    offload_blocks(model, torch.device("cpu"))
    with pytest.raises(HyvInputError, match="`offload` block") as info:
        make_step(model, compile=True)
    assert info.value.argument == "compile"


def hyv(*args):
    """The CLI in this process: (exit code, stderr)."""
    import contextlib
    import io

    from hyv_lib.cli.commands import run

    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = run(list(args))
    return code, err.getvalue()


def test_cli_stage2_compile_equals_eager_and_records_it(tmp_path):
    from safetensors.torch import load_file

    folder = tmp_path / "run"
    # the tiny preset's transformer (in-code, seeded) has the blocks of `hunyuan()`, and its latents [1, 8, 2, 6, 10]
    # the shapes of `hunyuan_inputs()`: the compiled block of test_compiled_step_equals_eager... is reused
    assert hyv("stage1", "--preset", "tiny", "--prompt", "a red ball", "--output_dir", str(folder), "--quiet")[0] == 0
    common = ["--video_length", "5", "--num_inference_steps", "2", "--quiet"]
    assert hyv("stage2", "--input_dir", str(folder), "--output_dir", str(tmp_path / "eager"), *common)[0] == 0
    before = graphs()
    assert hyv("stage2", "--input_dir", str(folder), "--output_dir", str(tmp_path / "compiled"), "--compile",
               *common)[0] == 0
    config = json.loads((tmp_path / "compiled" / "generation_config.json").read_text())
    assert config["compile"] is True and config["warmup_steps"] == 0
    assert "compile" not in json.loads((tmp_path / "eager" / "generation_config.json").read_text())
    expected, got = (load_file(tmp_path / name / "stage2_latents.safetensors")["latents"]
                     for name in ("eager", "compiled"))
    err = (got - expected).abs().max().item()
    print(f"stage2 --compile vs eager latents: {err:.1e}; graphs compiled by the CLI run: {graphs() - before}")
    assert err <= LOOP_TOL


def test_load_pipeline_compile_warms_up_once_per_size():
    """The in-memory pipeline: the first video of a size makes one untimed warm-up call (the compilation) before its
    steps, the next video of that size none; its latents equal the eager pipeline's."""
    from hyv_lib import load_pipeline

    settings = dict(video_length=5, num_inference_steps=2, seed=1, progress=False)
    eager = load_pipeline("tiny", progress=False).generate("a red ball", **settings)
    pipe = load_pipeline("tiny", progress=False, compile=True)
    assert is_compiled(pipe.components["transformer"])
    calls, step = [], pipe.step
    pipe.step = lambda **kwargs: calls.append(kwargs["hidden_states"].shape) or step(**kwargs)
    video = pipe.generate("a red ball", **settings)
    first = len(calls)
    pipe.generate("a red ball", **settings)
    err = (video.latents - eager.latents).abs().max().item()
    print(f"load_pipeline(compile=True) vs eager latents: {err:.1e}; calls {first}, then {len(calls) - first}")
    assert (first, len(calls) - first) == (3, 2) and err <= LOOP_TOL
    assert video.config["compile"] is True and "compile" not in eager.config


@pytest.mark.parametrize("flags, message", [
    (["--runtime", "jax"], "error: --compile: is for --runtime torch or ulysses: the jax runtime is always compiled"),
    (["--offload", "block"], "error: --compile: is not combined with --offload block"),
])
def test_cli_compile_refusals_are_one_line(tmp_path, flags, message):
    code, err = hyv("generate", "--compile", *flags, "--output_dir", str(tmp_path / "out"))
    assert code == 2 and len(err.strip().splitlines()) == 1 and err.startswith(message), err
    assert not (tmp_path / "out").exists()


def test_compiles_on_the_cpu_after_torchax_registered_its_jax_device():
    """Once torchax is imported (the jax runtime ran in this process), torch reports "jax" as its accelerator and a
    plain torch.compile on CPU tensors fails in dynamo ("PyTorch is not linked with support for jax devices"); the
    compiled blocks run inside host_compile."""
    import torchax  # noqa: F401 - registers the device

    assert torch.accelerator.current_accelerator().type == "jax"
    eager_model = hunyuan()
    kwargs = hunyuan_inputs(latent=(1, 3, 5))  # new shapes: dynamo traces again, with "jax" registered
    with torch.no_grad():
        expected = make_step(eager_model)(**kwargs)
        err = (make_step(copy.deepcopy(eager_model), compile=True)(**kwargs) - expected).abs().max().item()
    assert err <= TOL


def ulysses_and_fsdp_compiled():
    """On each of 2 gloo ranks: Ulysses with compiled blocks, and the torch step over FSDP2-sharded weights with
    compiled blocks (compiled after sharding), against the single-process eager step."""
    import torch.distributed as dist

    from hyv_lib.runtimes.fsdp import shard_weights, sharded_step

    trust_cpu_isa()  # this rank's own process
    oracle = hunyuan()
    kwargs = hunyuan_inputs()
    with torch.no_grad():
        expected = make_step(copy.deepcopy(oracle))(**kwargs)
        before = graphs()
        ulysses = make_step(copy.deepcopy(oracle), "ulysses", compile=True)(**kwargs)
        ulysses_graphs = graphs() - before
        sharded = shard_weights(copy.deepcopy(oracle), "fsdp")
        fsdp = sharded_step(make_step(sharded, "torch", compile=True), sharded)(**kwargs)
    found = [None] * dist.get_world_size()
    dist.all_gather_object(found, ((ulysses - expected).abs().max().item(), (fsdp - expected).abs().max().item(),
                                   ulysses_graphs))
    return found


@pytest.mark.slow  # its own processes, each compiling
def test_ulysses_and_fsdp_on_two_ranks_with_compile_equal_single_process_eager():
    found = run_distributed(ulysses_and_fsdp_compiled, 2, timeout=300)
    print(f"2 gloo ranks, compiled: (Ulysses error, FSDP error, Ulysses graphs) per rank {found}")
    for ulysses_err, fsdp_err, ulysses_graphs in found:
        assert ulysses_err <= TOL and fsdp_err <= TOL
        assert ulysses_graphs == 1  # both blocks, collectives included, in one graph
