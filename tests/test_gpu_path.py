"""The GPU path's choices, checked on the CPU: ``auto``'s kernel order by GPU generation, SDPA's own kernel choice
(against the kernel torch's profiler sees run), what generation_config.json records of them, and the official GPU
scripts' flags (``--attn_mode``, ``--use_sageattn``, ``--enable_offloading``, ...) as aliases or one error line."""

import json
import shutil

import pytest
import torch
import torch.nn.functional as F

from hyv_lib.cli.commands import build_parser
from hyv_lib.cli.official_flags import official_overrides
from hyv_lib.kernels import dispatch
from hyv_lib.kernels.registry import BACKENDS

from test_cli import hyv

CUDA = torch.device("cuda")
STEPS = ["--num_inference_steps", "1", "--quiet"]


@pytest.fixture
def gpu_of(monkeypatch):
    """Pretend a CUDA GPU of the given compute capability where the given backends are installed."""

    def pretend(capability, installed):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
        monkeypatch.setattr(dispatch, "available_backends",
                            lambda: {name: None if name in installed else "not installed" for name in BACKENDS})

    return pretend


@pytest.mark.parametrize("capability, installed, expected", [
    ((9, 0), ("flash3", "flash", "sdpa", "torch_varlen"), "sdpa"),  # Hopper: cuDNN through SDPA, measured fastest
    ((10, 0), ("flash", "sdpa", "torch_varlen"), "sdpa"),  # Blackwell follows Hopper
    ((9, 0), ("flash3", "flash", "torch_varlen"), "flash3"),  # without SDPA the next in the order
    ((8, 0), ("flash", "sdpa", "torch_varlen"), "flash"),  # Ampere: unmeasured, flash-attn first as before
    ((8, 9), ("sdpa", "torch_varlen"), "sdpa"),
    ((8, 0), ("torch_varlen",), "torch_varlen"),
])
def test_auto_orders_the_cuda_kernels_by_gpu_generation(gpu_of, capability, installed, expected):
    gpu_of(capability, installed)
    assert dispatch.resolve_backend("auto", CUDA, torch.bfloat16) == expected
    entry = dispatch.gpu_order(CUDA)
    assert entry.backends[0] == ("sdpa" if capability >= (9, 0) else "flash") and entry.reason


def test_every_order_names_only_exact_cuda_backends():
    for entry in dispatch.GPU_ORDERS:
        assert all(BACKENDS[name].exact and "cuda" in BACKENDS[name].devices for name in entry.backends)
    assert dispatch.GPU_ORDERS[-1].min_capability == (0, 0)  # every GPU has an entry


def profiled_sdpa_kernel(dtype):
    """The SDPA kernel torch's profiler sees run for an unmasked CPU call: the independent truth for sdpa_kernel."""
    q = torch.randn(1, 2, 256, 16, dtype=dtype)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], acc_events=True) as prof:
        F.scaled_dot_product_attention(q, q, q)
    names = {e.name for e in prof.events()}
    for kernel, op in (("flash", "aten::_scaled_dot_product_flash_attention_for_cpu"),
                       ("efficient", "aten::_scaled_dot_product_efficient_attention"),
                       ("math", "aten::_scaled_dot_product_attention_math")):
        if op in names:
            return kernel
    raise AssertionError(f"no SDPA kernel among {sorted(n for n in names if 'attention' in n)}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sdpa_kernel_names_the_kernel_sdpa_runs(dtype):
    assert dispatch.sdpa_kernel(torch.device("cpu"), dtype, head_dim=16, heads=2) == profiled_sdpa_kernel(dtype)


def test_kernel_record(gpu_of):
    cpu = torch.device("cpu")
    assert dispatch.kernel_record("auto", cpu, torch.float32, 16) == {
        "backend": "sdpa", "sdpa_kernel": profiled_sdpa_kernel(torch.float32)}
    assert dispatch.kernel_record("reference", cpu, torch.float32, 16) == {"backend": "reference"}
    assert dispatch.kernel_record("diffusers", cpu, torch.float32, 16) == {"backend": "diffusers"}
    gpu_of((9, 0), ("flash", "torch_varlen"))
    assert dispatch.kernel_record("auto", CUDA, torch.bfloat16) == {
        "backend": "flash", "auto_order": ["sdpa", "flash3", "flash", "torch_varlen"]}


# ------------------------------------------------------------------------------------ the official flags
def overrides(*flags):
    return official_overrides(build_parser().parse_args(["stage2", *flags]))


@pytest.mark.parametrize("flags, expected", [
    ([], {}),
    (["--attn_mode", "flash"], {"attention": "auto"}),
    (["--attn_mode", "flash2"], {"attention": "flash"}),
    (["--attn_mode", "flash3"], {"attention": "flash3"}),
    (["--attn_mode", "torch"], {"attention": "sdpa"}),
    (["--attn_mode", "sageattn"], {"attention": "sage"}),
    (["--attn_mode", "flex-block-attn"], {"attention": "ssta"}),
    (["--attn_mode", "torch", "--attention", "sdpa"], {"attention": "sdpa"}),  # the same thing twice is fine
    (["--use_sageattn"], {"attention": "sage"}),
    (["--use_sageattn", "false"], {}),
    (["--enable_offloading"], {"offload": "model"}),
    (["--disable_offloading"], {}),
    (["--enable_torch_compile"], {"compile": True}),
    (["--cache_type", "deepcache"], {"cache_method": "deepcache"}),
])
def test_official_flags_alias_hyv_libs_own(flags, expected):
    assert overrides(*flags) == expected


@pytest.mark.parametrize("flags, message", [
    (["--attn_mode", "xformers"], "error: --attn_mode: must be one of flash, flash2, flash3, torch, sageattn, "
                                  "flex-block-attn, got 'xformers'"),
    (["--attn_mode", "torch", "--attention", "flash"], "error: --attn_mode: torch is --attention sdpa, but "
                                                       "--attention flash was given too"),
    (["--use_sageattn", "--attention", "sdpa"], "error: --use_sageattn: is --attention sage, but attention sdpa"),
    (["--use_sageattn", "--sparse_attn"], "error: --use_sageattn: SageAttention and sparse attention"),
    (["--enable_offloading", "--disable_offloading"], "error: --enable_offloading: and --disable_offloading "
                                                      "contradict each other"),
    (["--enable_offloading", "--offload", "block"], "error: --enable_offloading: is --offload model, but --offload "
                                                    "block was given too"),
    (["--disable_offloading", "--offload", "model"], "error: --disable_offloading: contradicts --offload model"),
    (["--cache_type", "teacache"], "error: --cache_type: teacache is not in hyv_lib: use --cache_method magcache"),
    (["--cache_type", "deepcache", "--cache_method", "magcache"], "error: --cache_type: deepcache is --cache_method "
                                                                  "deepcache, but --cache_method magcache"),
])
def test_contradicting_or_unknown_official_flags_are_one_error_line(tmp_path, flags, message):
    r = hyv("stage2", "--input_dir", str(tmp_path / "nowhere"), *STEPS, *flags, check=False)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith(message), r.stderr


@pytest.fixture(scope="module")
def stage1_folder(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_path") / "s1"
    hyv("stage1", "--preset", "tiny", "--prompt", "a red ball", "--output_dir", str(out))
    return out


def test_stage2_records_the_kernel_and_takes_the_official_flags(stage1_folder, tmp_path):
    configs = {}
    for name, flags in (("auto", []), ("official", ["--attn_mode", "torch", "--disable_offloading"])):
        target = tmp_path / name
        shutil.copytree(stage1_folder, target)
        hyv("stage2", "--input_dir", str(target), *STEPS, *flags)
        configs[name] = json.loads((target / "generation_config.json").read_text())
    kernel = profiled_sdpa_kernel(torch.float32)  # the tiny preset runs in fp32 on the CPU
    assert configs["auto"]["attention"] == "auto"
    assert configs["auto"]["attention_kernel"] == {"backend": "sdpa", "sdpa_kernel": kernel}
    assert configs["official"]["attention"] == "sdpa"
    assert configs["official"]["attention_kernel"] == {"backend": "sdpa", "sdpa_kernel": kernel}


def test_the_in_memory_pipeline_records_the_kernel_too():
    import hyv_lib

    video = hyv_lib.load_pipeline("tiny", progress=False).generate("a red ball", num_inference_steps=1, seed=1,
                                                                    progress=False)
    assert video.config["attention_kernel"] == {"backend": "sdpa", "sdpa_kernel": profiled_sdpa_kernel(torch.float32)}
