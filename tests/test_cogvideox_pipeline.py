"""CogVideoX1.5 on hyv_lib's pipeline (cogvideox_tiny, fp32, CPU) against diffusers' CogVideoXPipeline: T5 embeddings,
the sampling loop from the same latents (DDIM and DPM), the stage files and their round trip, the decode on torch and
JAX, load_pipeline, a saved folder through --model_path, and the flags this model does not take."""

import json
import os
import shutil

import pytest
import torch
from diffusers import CogVideoXDDIMScheduler, CogVideoXDPMScheduler, CogVideoXPipeline
from safetensors.torch import load_file

from hyv_lib.models.cogvideox.presets import COGVIDEOX_SCHEDULER, COGVIDEOX_TINY
from hyv_lib.models.hunyuan_video15.presets import TINY_TRAINED
from hyv_lib.cli.commands import run
from hyv_lib.models.components import build_tiny_components, load_components
from hyv_lib.models.cogvideox.recipe import denoise_cogvideox, make_scheduler, rotary_tables
from hyv_lib.pipeline.inference import load_pipeline
from hyv_lib.pipeline.text import encode_pair
from hyv_lib.pipeline.video_io import read_mp4
from hyv_lib.runtimes.step import make_step
from hyv_lib.runtimes.jax_vae import decode_on_jax
from hyv_lib.runtimes.vae import to_uint8_frames

# Measured (fp32, CPU): T5 embeddings 0; the loop vs CogVideoXPipeline from the same latents 0 (DDIM and DPM, diffusers'
# processor or hyv_lib's attention); stage-2 latents vs the pipeline run from the seed 0; JAX decode vs diffusers'
# decode 7e-6 (values up to ~1); the uint8 frames differ by at most 1 (x / 0.7 here, x * (1 / 0.7) in diffusers);
# stage 2 on the jax runtime (JAX) vs torch 7.4e-6 (latents up to ~4).
TOL = 1e-5
STEPS = 2


@pytest.fixture(scope="module")
def components():
    return build_tiny_components(COGVIDEOX_TINY)


@pytest.fixture(scope="module")
def pipe(components):
    return CogVideoXPipeline(**components)


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """``generate --preset cogvideox_tiny`` into a folder (default size 96x160, 9 frames), frames saved too."""
    out = str(tmp_path_factory.mktemp("cogvideox") / "run")
    assert run(["generate", "--preset", "cogvideox_tiny", "--prompt", "a cat", "--negative_prompt", "blurry",
                "--output_dir", out, "--num_inference_steps", str(STEPS), "--save_frames", "--quiet"]) == 0
    return out


@pytest.mark.parametrize("scheduler", ["ddim", "dpm"])
def test_loop_equals_cogvideox_pipeline(components, pipe, scheduler):
    """From the same latents and embeddings, hyv_lib's loop (its torch step with hyv_lib's attention, the adapter's
    RoPE tables) ends where CogVideoXPipeline(..., output_type="latent") does; DPM's noise from the same generator."""
    embeds = encode_pair(components, COGVIDEOX_TINY, "a cat", "blurry")
    positive, negative = pipe.encode_prompt("a cat", "blurry", device="cpu")
    assert embeds["prompt_embeds"].shape == (1, 226, 32)
    assert torch.equal(embeds["prompt_embeds"], positive) and torch.equal(embeds["negative_prompt_embeds"], negative)
    shape = COGVIDEOX_TINY.denoising_shape(64, 64, 9)
    assert shape == (1, 4, 16, 8, 8)  # 3 latent frames padded to the temporal patch 2
    latents = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    pipe.scheduler = (CogVideoXDPMScheduler if scheduler == "dpm" else CogVideoXDDIMScheduler)(**COGVIDEOX_SCHEDULER)
    expected = pipe(prompt_embeds=embeds["prompt_embeds"], negative_prompt_embeds=embeds["negative_prompt_embeds"],
                    latents=latents.clone(), height=64, width=64, num_frames=9, num_inference_steps=STEPS,
                    output_type="latent", generator=torch.Generator().manual_seed(5)).frames
    config = {**pipe.scheduler.config, "_class_name": type(pipe.scheduler).__name__}
    got = denoise_cogvideox(make_step(components["transformer"]), latents.clone(), embeds["prompt_embeds"],
                            embeds["negative_prompt_embeds"], make_scheduler(config), num_inference_steps=STEPS,
                            guidance_scale=6.0, image_rotary_emb=rotary_tables(components["transformer"], shape),
                            generator=torch.Generator().manual_seed(5), progress=False)
    assert got.shape == expected.shape == shape
    assert (got - expected).abs().max() <= TOL * max(1.0, float(expected.abs().max()))


def test_generate_files_equal_diffusers(generated, pipe):
    """The stage files: T5's two tensors, latents [1, T', 16, h, w] equal to CogVideoXPipeline run from the same
    seed and embeddings; the mp4 has 9 frames of 96x160 and its frames are diffusers' decode of the unpadded latents."""
    stage1 = load_file(os.path.join(generated, "stage1_embeddings.safetensors"))
    assert {k: tuple(v.shape) for k, v in stage1.items()} == COGVIDEOX_TINY.stage1_shapes()
    latents = load_file(os.path.join(generated, "stage2_latents.safetensors"))["latents"]
    assert latents.shape == (1, 4, 16, 12, 20)
    pipe.scheduler = CogVideoXDDIMScheduler(**COGVIDEOX_SCHEDULER)  # what the preset's tiny scheduler is
    expected = pipe(prompt_embeds=stage1["prompt_embeds"], negative_prompt_embeds=stage1["negative_prompt_embeds"],
                    height=96, width=160, num_frames=9, num_inference_steps=STEPS, output_type="latent",
                    generator=torch.Generator().manual_seed(42)).frames
    assert (latents - expected).abs().max() <= TOL * max(1.0, float(expected.abs().max()))
    frames, meta = read_mp4(os.path.join(generated, "output_video.mp4"))
    assert frames.shape == (9, 96, 160, 3) and meta["fps"] == COGVIDEOX_TINY.fps
    saved = load_file(os.path.join(generated, "stage3_frames.safetensors"))["frames"][0].permute(1, 2, 3, 0)
    reference = to_uint8_frames(pipe.decode_latents(expected[:, 1:])[0])  # the pipeline drops the padded front frame
    assert (saved.int() - reference.int()).abs().max() <= 1
    config = json.load(open(os.path.join(generated, "generation_config.json")))
    assert config["preset"] == "cogvideox_tiny" and config["video_length"] == 9


def test_stage_commands_round_trip(generated, tmp_path):
    """stage2 and stage3 rerun from the generate folder's files give the same latents and frames; stage 2 on the
    jax runtime within TOL (7e-6 measured)."""
    folder = str(tmp_path / "again")
    shutil.copytree(generated, folder)
    os.remove(os.path.join(folder, "stage2_latents.safetensors"))
    assert run(["stage2", "--input_dir", folder, "--num_inference_steps", str(STEPS), "--quiet"]) == 0
    first = load_file(os.path.join(generated, "stage2_latents.safetensors"))["latents"]
    assert torch.equal(load_file(os.path.join(folder, "stage2_latents.safetensors"))["latents"], first)
    jitted = str(tmp_path / "jax")  # the same loop through the JAX runtime (JaxTransformer via the adapter)
    assert run(["stage2", "--input_dir", folder, "--output_dir", jitted, "--runtime", "jax",
                "--num_inference_steps", str(STEPS), "--quiet"]) == 0
    on_jax = load_file(os.path.join(jitted, "stage2_latents.safetensors"))["latents"]
    assert (on_jax - first).abs().max() <= TOL * max(1.0, float(first.abs().max()))
    frames = load_file(os.path.join(generated, "stage3_frames.safetensors"))["frames"]
    assert run(["stage3", "--input_dir", folder, "--save_frames", "--quiet"]) == 0
    assert torch.equal(load_file(os.path.join(folder, "stage3_frames.safetensors"))["frames"], frames)


def test_jax_decode_carries_the_causal_conv_cache(components):
    """17 frames (5 latent frames) decode in chunks of 2 latent frames plus the remainder, each chunk's causal
    convolutions fed the previous chunk's last frames (conv_cache): on JAX that cache stays on JAX's device between
    the two programs (first chunk, later chunks) and the video equals diffusers' eager decode."""
    vae = components["vae"]
    z = torch.randn(1, 16, 5, 4, 4, generator=torch.Generator().manual_seed(3))
    expected = vae.decode(z).sample
    got, programs = decode_on_jax(vae, z)
    assert programs == 2 and got.shape == expected.shape == (1, 3, 17, 32, 32)
    assert (got - expected).abs().max() <= TOL * max(1.0, float(expected.abs().max()))


def test_load_pipeline_generates_a_video(generated):
    """load_pipeline("cogvideox_tiny").generate gives the same latents and frames as the CLI's generate."""
    video = load_pipeline("cogvideox_tiny", progress=False).generate("a cat", "blurry", num_inference_steps=STEPS,
                                                                     progress=False)
    assert video.frames.shape == (9, 96, 160, 3)
    assert torch.equal(video.latents, load_file(os.path.join(generated, "stage2_latents.safetensors"))["latents"])


def test_saved_folder_loads_with_model_path(tmp_path, components, capsys):
    """save_tiny --preset cogvideox_tiny writes a CogVideoXPipeline folder that loads back (ByT5 through
    AutoTokenizer, the scheduler by its class name) with the same weights; a missing subfolder is named."""
    folder = str(tmp_path / "cogvideox_tiny")
    assert run(["save_tiny", "--preset", "cogvideox_tiny", "--output_dir", folder, "--quiet"]) == 0
    loaded = load_components(COGVIDEOX_TINY, folder, ["tokenizer", "text_encoder", "transformer", "scheduler"])
    assert type(loaded["scheduler"]).__name__ == "CogVideoXDDIMScheduler"
    assert loaded["tokenizer"]("a cat").input_ids == components["tokenizer"]("a cat").input_ids
    for name in ("text_encoder", "transformer"):
        mine, theirs = loaded[name].state_dict(), components[name].state_dict()
        assert all(torch.equal(mine[k], theirs[k]) for k in theirs)
    shutil.rmtree(os.path.join(folder, "vae"))
    capsys.readouterr()
    assert run(["stage1", "--preset", "cogvideox_tiny", "--model_path", folder, "--output_dir",
                str(tmp_path / "out"), "--quiet"]) == 0  # stage 1 needs T5 only
    assert run(["stage3", "--input_dir", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "error: --input_dir" in err  # no stage-2 file yet: named before the VAE is looked for
    with pytest.raises(Exception, match="missing vae"):
        load_components(COGVIDEOX_TINY, folder, ["vae"])


@pytest.mark.parametrize("flags, flag", [
    (["--flow_shift", "3"], "--flow_shift"),
    (["--image_path", "first.png"], "--image_path"),
    (["--enable_cache", "--cache_method", "magcache", "--cache_calibration",  # made for hyv-tiny
      os.path.join(TINY_TRAINED.bundled_path, "magcache_calibration.json")], "--cache_calibration"),
    (["--lora", "lora.safetensors"], "--lora"),
    (["--vae_memory_gb", "4"], "--vae_memory_gb"),
    (["--height", "88", "--width", "160"], "--height"),  # 8 x 11: not whole 2 x 2 latent patches
])
def test_flags_cogvideox_does_not_take(tmp_path, capsys, flags, flag):
    """One `error:` line naming the flag, exit code 2, nothing written."""
    out = tmp_path / "bad"
    assert run(["generate", "--preset", "cogvideox_tiny", "--prompt", "a cat", "--output_dir", str(out),
                "--quiet", *flags]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {flag}:"), lines
    assert not out.exists() or not os.listdir(out)
