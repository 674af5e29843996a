"""The torchax/JAX runtime: equal to diffusers' forward, compiled once, the stage-2 runtime, the compile cache."""

import copy
import json
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import load_file

pytest.importorskip("torchax")

from tiny_inputs import forward_kwargs as inputs  # noqa: E402

from hyv_lib.models.families import get_preset  # noqa: E402
from hyv_lib.models.components import build_tiny_components  # noqa: E402
from hyv_lib.models.hunyuan_video15.sampling import denoise, prepare_conditioning  # noqa: E402
from hyv_lib.models.family import initial_latents  # noqa: E402
from hyv_lib.pipeline.stage_io import load_stage1  # noqa: E402
from hyv_lib.pipeline.stages import stage2  # noqa: E402
from hyv_lib.runtimes.jax_step import JaxTransformer  # noqa: E402

TINY = get_preset("tiny")


@pytest.fixture(scope="module")
def models():
    oracle = build_tiny_components(TINY, names=["transformer"])["transformer"]
    return oracle, JaxTransformer(copy.deepcopy(oracle))


def test_fp32_equals_the_oracle_for_t2v_and_i2v_and_compiles_once(models):
    oracle, tpu = models
    for kwargs in (inputs(0), inputs(1, image=True), inputs(2, text_lengths=(128, 1), byt5_lengths=(32, 0))):
        with torch.no_grad():
            expected = oracle(**kwargs).sample
        out = tpu(**kwargs)
        assert out.device.type == "cpu" and out.shape == expected.shape
        assert (out - expected).abs().max() <= 1e-5
    assert tpu.compilations == 1  # new masks, t2v/i2v and timesteps are data, not new programs


def test_host_sdpa_attention_inside_the_jitted_step_equals_the_oracle(models):
    """torch's CPU kernel called back from the jitted step (the CPU benchmark's fast path), with real padding."""
    oracle, _ = models
    tpu = JaxTransformer(copy.deepcopy(oracle), attention="host_sdpa")
    for kwargs in (inputs(0), inputs(2, text_lengths=(128, 1), byt5_lengths=(32, 0))):
        with torch.no_grad():
            expected = oracle(**kwargs).sample
        assert (tpu(**kwargs) - expected).abs().max() <= 1e-5
    assert tpu.compilations == 1


def test_ten_step_loop_compiles_once(models, tiny_run):
    oracle, _ = models
    tpu = JaxTransformer(copy.deepcopy(oracle))
    embeds = load_stage1(str(tiny_run))
    scheduler = build_tiny_components(TINY, names=["scheduler"])["scheduler"]
    latents = denoise(tpu, initial_latents(TINY.latent_shape(64, 96, 9), 0),
                               prepare_conditioning(embeds, TINY, torch.float32), scheduler,
                               num_inference_steps=10, guidance_scale=6.0, progress=False)
    assert torch.isfinite(latents).all()
    assert tpu.compilations == 1


@pytest.mark.parametrize("seed", [3, 7])
def test_bf16_error_is_no_worse_than_diffusers_own_bf16(models, seed):
    """bf16 on the jitted runtime errs against the fp32 oracle about as much as diffusers' own bf16 forward does
    (measured: 0.93-1.18x of it, relative max errors 6.5e-3 to 7.9e-3); a bf16 softmax or a wrong cast would not."""
    oracle, _ = models
    model16 = copy.deepcopy(oracle).to(torch.bfloat16)
    kwargs = inputs(seed)
    with torch.no_grad():
        expected = oracle(**kwargs).sample
        bf16_kwargs = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in kwargs.items()}
        diffusers_bf16 = copy.deepcopy(model16)(**bf16_kwargs).sample.float()
    out = JaxTransformer(model16)(**kwargs).float()
    scale = expected.abs().max()
    err = ((out - expected).abs().max() / scale).item()
    reference_err = ((diffusers_bf16 - expected).abs().max() / scale).item()
    print(f"bf16 relative max error vs the fp32 oracle: {err:.2e} (diffusers' bf16: {reference_err:.2e})")
    assert err <= 1.5 * reference_err


def test_works_inside_a_torchax_environment(models):
    import torchax

    oracle, tpu = models
    kwargs = inputs(4)
    with torch.no_grad():
        expected = oracle(**kwargs).sample
    with torchax.default_env():
        jax_kwargs = {k: v.to("jax") for k, v in kwargs.items()}
        out = tpu(**jax_kwargs)
    assert (out - expected).abs().max() <= 1e-5


def test_stage2_jax_runtime_matches_torch_and_warmup_is_neutral(tiny_run, tmp_path, monkeypatch):
    monkeypatch.setenv("HYV_COMPILE_CACHE_DIR", str(tmp_path / "cache"))
    common = dict(num_inference_steps=4, video_length=5, quiet=True)
    runs = {(rt, w): stage2(str(tiny_run), output_dir=str(tmp_path / f"{rt}{w}"), runtime=rt,
                                     warmup_steps=w, **common)
            for rt, w in (("torch", 0), ("torch", 2), ("jax", 0), ("jax", 2), ("tpu", 2))}
    assert torch.equal(runs["torch", 0], runs["torch", 2])
    assert torch.equal(runs["jax", 0], runs["jax", 2])
    assert (runs["jax", 0] - runs["torch", 0]).abs().max() <= 1e-4
    assert json.loads((tmp_path / "jax0" / "generation_config.json").read_text())["runtime"] == "jax"
    # "tpu", the runtime's old name, is the same runtime, recorded under its name
    assert torch.equal(runs["tpu", 2], runs["jax", 2])
    assert json.loads((tmp_path / "tpu2" / "generation_config.json").read_text())["runtime"] == "jax"
    meshed = stage2(str(tiny_run), output_dir=str(tmp_path / "mesh"), runtime="jax", mesh="tensor=1",
                    sharding="tp", **common)  # the sharded code path on this one-device mesh
    assert (meshed - runs["torch", 0]).abs().max() <= 1e-4
    cfg = json.loads((tmp_path / "mesh" / "generation_config.json").read_text())
    assert (cfg["mesh"], cfg["sharding"]) == ("tensor=1", "tp")


CACHE_PROBE = textwrap.dedent("""
    import sys, jax, torch
    from jax import monitoring
    hits = []
    monitoring.register_event_listener(lambda e, **kw: hits.append(e) if e.endswith("cache_hits") else None)
    from hyv_lib.parallel.jax_env import enable_compile_cache
    from hyv_lib.runtimes.jax_step import JaxTransformer
    from hyv_lib.models.components import build_tiny_components
    from hyv_lib.models.families import get_preset
    enable_compile_cache(sys.argv[1])
    tiny = get_preset("tiny")
    model = build_tiny_components(tiny, names=["transformer"])["transformer"]
    c = tiny.latent_channels
    JaxTransformer(model)(hidden_states=torch.zeros(2, 2 * c + 1, 1, 2, 2), timestep=torch.tensor([10.0, 10.0]),
        encoder_hidden_states=torch.zeros(2, tiny.text_len, tiny.text_dim),
        encoder_attention_mask=torch.ones(2, tiny.text_len, dtype=torch.long),
        encoder_hidden_states_2=torch.zeros(2, tiny.byt5_len, tiny.byt5_dim),
        encoder_attention_mask_2=torch.zeros(2, tiny.byt5_len, dtype=torch.long),
        image_embeds=torch.zeros(2, tiny.image_tokens, tiny.image_dim))
    print(len(hits))
""")


@pytest.mark.slow  # its own processes
def test_second_process_hits_the_compile_cache(tmp_path):
    def run():
        out = subprocess.run([sys.executable, "-c", CACHE_PROBE, str(tmp_path)], capture_output=True, text=True,
                             timeout=300, check=True)
        return int(out.stdout.strip().splitlines()[-1])

    assert run() == 0  # cold: everything compiles and is written to the cache
    assert any(tmp_path.iterdir())
    assert run() > 0  # warm: the step (and small helpers) load from the cache


@pytest.mark.slow  # its own processes
def test_cli_with_the_tpu_runtime_exits_cleanly(tmp_path):
    env_cache = {"HYV_COMPILE_CACHE_DIR": str(tmp_path / "cache")}
    import os

    r = subprocess.run([sys.executable, "-m", "hyv_lib", "generate", "--preset", "tiny", "--runtime", "jax",
                        "--video_length", "5", "--num_inference_steps", "2", "--output_dir", str(tmp_path / "out"),
                        "--quiet"],
                       capture_output=True, text=True, timeout=300, env={**os.environ, **env_cache})
    assert r.returncode == 0, r.stderr
    assert load_file(tmp_path / "out" / "stage2_latents.safetensors")["latents"].shape == TINY.latent_shape(96, 160, 5)


def test_prompt_cache_notices_in_place_edits(models):
    oracle, tpu = models
    kwargs = inputs(5)
    tpu(**kwargs)
    kwargs["encoder_attention_mask"][:, 3:] = 0  # same tensor object, new contents
    with torch.no_grad():
        expected = oracle(**kwargs).sample
    assert (tpu(**kwargs) - expected).abs().max() <= 1e-5


def test_construction_checks_options_and_takes_a_mesh_string_and_return_dict(models):
    """A misspelt attention option fails when the runtime is built (not at the first traced call); the mesh may be
    given as the CLI's string; return_dict=True returns diffusers' output object, as the model's forward does."""
    oracle, tpu = models
    with pytest.raises(TypeError, match="block_kv"):
        JaxTransformer(copy.deepcopy(oracle), attention="xla", attention_options={"blok_kv": 64})
    string_mesh = JaxTransformer(copy.deepcopy(oracle), mesh="tensor=1")
    assert dict(string_mesh.mesh.shape) == {"data": 1, "tensor": 1, "sequence": 1}
    kwargs = inputs(0)
    out = tpu(**kwargs, return_dict=True)
    assert torch.equal(out.sample, tpu(**kwargs))
