"""Stage 3 on JAX: the VAE decoder jitted through torchax equals diffusers' eager decode, tiled and whole."""

import contextlib
import json

import pytest
import torch
from safetensors.torch import load_file

pytest.importorskip("torchax")

from hyv_lib.models.families import get_preset  # noqa: E402
from hyv_lib.cli.commands import run  # noqa: E402
from hyv_lib.models.components import build_tiny_components  # noqa: E402
from hyv_lib.runtimes.jax_vae import decode_on_jax  # noqa: E402

TINY = get_preset("tiny")


@pytest.fixture(scope="module")
def vae():
    return build_tiny_components(TINY, names=["vae"])["vae"]


@pytest.mark.parametrize("tiling", [False, True])
def test_jitted_decoder_equals_eager_decode(vae, tiling):
    """fp32: within 1e-5 of the eager decode (a different summation order, no other change); with tiling on a
    20 x 20 latent (a 2 x 2 grid of tiles, edges smaller) a few programs serve all tiles."""
    z = torch.randn(1, TINY.latent_channels, 2, 20, 20, generator=torch.Generator().manual_seed(0))
    vae.enable_tiling() if tiling else vae.disable_tiling()
    with torch.no_grad():
        expected = vae.decode(z).sample
        out, programs = decode_on_jax(vae, z)
    assert out.dtype == expected.dtype and out.shape == expected.shape
    err = (out - expected).abs().max().item()
    print(f"tiling={tiling}: max |jax - eager| = {err:.1e}, {programs} compiled program(s)")
    assert err <= 1e-5
    # tiled: 16-latent tiles every 12 (overlap 0.25) start at 0 and 12 in each dim of 20: sizes 16 and 8, so the
    # 2 x 2 grid has 4 tile shapes, one program each
    assert programs == (4 if tiling else 1)
    assert vae.decoder.__class__.__name__ != "JaxDecoder"  # the caller's VAE keeps its decoder


def test_bf16_decoder_is_close(vae):
    z = torch.randn(1, TINY.latent_channels, 2, 6, 10, generator=torch.Generator().manual_seed(1))
    vae.disable_tiling()
    with torch.no_grad():
        expected = vae.decode(z).sample
        out, _ = decode_on_jax(vae, z, torch.bfloat16)
    rel = ((out - expected).abs().max() / expected.abs().max()).item()
    print(f"bf16 decoder: max error {rel:.2e} of the output's range")
    assert out.dtype == torch.float32 and rel <= 3e-2  # measured 1.9e-2: bf16 weights and activations, compounded


def test_stage3_tpu_runtime_writes_the_same_video(tiny_run, tmp_path):
    """`stage3 --runtime jax` against `--runtime torch` on the session's tiny run: the uint8 frames agree to
    one level, and the config records the runtime."""
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(tiny_run, run_dir)
    assert run(["stage3", "--input_dir", str(run_dir), "--output_video", str(tmp_path / "torch.mp4"),
                "--save_frames", "--quiet"]) == 0
    torch_frames = load_file(tmp_path / "stage3_frames.safetensors")["frames"]
    assert run(["stage3", "--input_dir", str(run_dir), "--output_video", str(tmp_path / "tpu.mp4"),
                "--save_frames", "--runtime", "jax", "--quiet"]) == 0
    tpu_frames = load_file(tmp_path / "stage3_frames.safetensors")["frames"]
    assert (tpu_frames.int() - torch_frames.int()).abs().max() <= 1
    config = json.loads((run_dir / "generation_config.json").read_text())
    assert config["stage3_runtime"] == "jax" and config["vae_dtype"] == "fp32"


@pytest.mark.parametrize("flags,argument", [(["--runtime", "ulysses"], "--runtime"),
                                            (["--vae_dtype", "fp16"], "--vae_dtype")])
def test_stage3_bad_runtime_or_dtype(tiny_run, capsys, tmp_path, flags, argument):
    assert run(["stage3", "--input_dir", str(tiny_run), "--output_video", str(tmp_path / "v.mp4"), *flags]) == 2
    assert capsys.readouterr().err.startswith(f"error: {argument}:")
    assert not (tmp_path / "v.mp4").exists()


def test_loop_free_causal_mask_equals_diffusers_and_traces_without_a_per_token_loop(vae):
    """The VAE attention mask built by one comparison equals diffusers' loop-built one, and the decoder traced with
    it holds no per-token slice updates (the loop put one per token into the program: 7,936 for a 720p tile)."""
    import jax
    from diffusers.models.autoencoders.autoencoder_kl_hunyuanvideo15 import HunyuanVideo15AttnBlock
    from torchax.interop import JittableModule, jax_view
    from torchax.ops.mappings import t2j_dtype

    from hyv_lib.models.patches import block_causal_mask, loop_free_causal_masks

    for frames, hw, batch in ((1, 4, None), (3, 4, 2), (5, 6, 1)):
        expected = HunyuanVideo15AttnBlock.prepare_causal_attention_mask(frames, hw, torch.float32, "cpu", batch)
        assert torch.equal(block_causal_mask(frames, hw, torch.float32, "cpu", batch), expected)

    import torchax

    z = torch.randn(1, TINY.latent_channels, 3, 4, 6)

    def slice_updates(loop_free: bool) -> int:
        with torchax.default_env():
            jitted = JittableModule(vae.decoder)
            weights = {k: jax.ShapeDtypeStruct(tuple(v.shape), t2j_dtype(v.dtype))
                       for k, v in {**jitted.params, **jitted.buffers}.items()}
            context = loop_free_causal_masks(vae.decoder) if loop_free else contextlib.nullcontext()
            with context:
                text = jax.jit(jax_view(lambda w, x: jitted.functional_call("forward", w, {}, x))).lower(
                    weights, jax.ShapeDtypeStruct(tuple(z.shape), t2j_dtype(z.dtype))).as_text()
        return text.count("dynamic_update_slice") + text.count("scatter")

    tokens = 3 * 4 * 6
    assert slice_updates(False) >= tokens  # diffusers' loop: one update per token of the mid-block attention
    assert slice_updates(True) == 0
    assert not any("prepare_causal_attention_mask" in vars(m) for m in vae.decoder.modules())  # left as found
