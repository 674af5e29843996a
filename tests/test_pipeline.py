"""The three stages: file formats, determinism, warmup, the oracle loop, and the real-weights load path."""

import json

import pytest
import torch
from safetensors.torch import load_file

from hyv_lib.models.families import get_preset
from hyv_lib.models.components import build_tiny_components, load_components
from hyv_lib.models.hunyuan_video15.sampling import denoise, prepare_conditioning
from hyv_lib.models.family import initial_latents
from hyv_lib.models.hunyuan_video15.stage1 import STAGE1_NAMES
from hyv_lib.pipeline.stage_io import load_stage1
from hyv_lib.pipeline.stages import generate, stage1, stage2
from hyv_lib.pipeline.video_io import read_mp4
from hyv_lib.runtimes.step import torch_step

TINY = get_preset("tiny")


def test_stage_files_have_the_documented_names_shapes_dtypes(tiny_run):
    s1 = load_file(tiny_run / "stage1_embeddings.safetensors")
    assert set(s1) == set(STAGE1_NAMES)
    for name, shape in TINY.stage1_shapes().items():
        assert tuple(s1[name].shape) == shape, name
        assert s1[name].dtype == (torch.int64 if "mask" in name else torch.float32), name
    s2 = load_file(tiny_run / "stage2_latents.safetensors")
    h, w = TINY.default_height, TINY.default_width
    assert set(s2) == {"latents"} and tuple(s2["latents"].shape) == TINY.latent_shape(h, w, 9)
    assert torch.isfinite(s2["latents"]).all()
    frames = load_file(tiny_run / "stage3_frames.safetensors")["frames"]
    assert frames.shape == (1, 3, 9, h, w) and frames.dtype == torch.uint8
    video, meta = read_mp4(str(tiny_run / "output_video.mp4"))
    assert video.shape == (9, h, w, 3) and meta["fps"] == TINY.fps


def test_generation_config_records_every_stage(tiny_run):
    cfg = json.loads((tiny_run / "generation_config.json").read_text())
    for key in ("prompt", "negative_prompt", "preset", "model_path", "height", "width", "video_length",
                "num_inference_steps", "guidance_scale", "flow_shift", "seed", "dtype", "hyv_lib_version",
                "stage1_time_s", "stage2_time_s", "stage3_time_s", "stage1_peak_rss_mib", "stage2_peak_rss_mib",
                "stage3_peak_rss_mib", "stage1_rss_growth_mib", "stage2_rss_growth_mib", "stage3_rss_growth_mib"):
        assert key in cfg, key
    assert cfg["preset"] == "tiny" and cfg["video_length"] == 9 and cfg["model_path"] is None
    assert cfg["runtime"] == "torch" and cfg["attention"] == "auto"  # exact masked attention by default
    for stage in (1, 2, 3):  # a Python process with torch loaded holds well over 100 MiB
        assert cfg[f"stage{stage}_peak_rss_mib"] > 100
        assert 0 <= cfg[f"stage{stage}_rss_growth_mib"] <= cfg[f"stage{stage}_peak_rss_mib"]


_PEAK_MEMORY_SCRIPT = """
import json, sys, time
import torch
from hyv_lib.base.memory import PeakMemory

def wait_for_samples(meter, count=2, timeout_s=10.0):
    # a fixed sleep was too short on a loaded CI machine: the thread did not run once while the buffer lived
    target, deadline = meter.samples + count, time.monotonic() + timeout_s
    while meter.samples < target:
        if time.monotonic() > deadline:
            sys.exit("the PeakMemory thread took no sample in 10 s")
        time.sleep(0.005)

meter, reused = PeakMemory(), []
for _ in range(2):  # one object, two blocks
    with meter:
        buffer = torch.ones(64 * 2**20, dtype=torch.uint8)
        wait_for_samples(meter)
        del buffer
    reused.append(meter.growth_bytes / 2**20)
with PeakMemory() as fresh:
    block = torch.ones(64 * 2**20 // 4)  # 64 MiB of float32, touched
    wait_for_samples(fresh)
    del block
print(json.dumps({"reused": reused, "short_lived": fresh.growth_bytes / 2**20}))
"""


def test_peak_memory_sees_short_lived_buffers_and_measures_again_when_reused():
    """Each block that holds a 64 MiB buffer for a moment reports about 64 MiB of growth, also the second block of a
    reused PeakMemory (the first block's stop flag once made it stop sampling at once). It runs in a fresh
    interpreter: in the test process other threads and earlier tests' garbage freed memory inside the block and hid
    the buffer (CI saw 0.004 MiB once)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _PEAK_MEMORY_SCRIPT], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    growth = json.loads(done.stdout.strip().splitlines()[-1])
    assert all(60 <= g <= 80 for g in growth["reused"]), growth
    assert 60 <= growth["short_lived"] <= 80, growth


def test_block_offload_streams_the_blocks_and_changes_nothing(tiny_run, tmp_path, monkeypatch):
    """--offload block: diffusers' group-offload hooks on every block (weights kept on the host, each block moved to
    the device when it runs; on the CPU the moves are no-ops), bit-identical latents to the resident model, recorded
    in generation_config.json; a kept model is hooked once. Refused where it cannot apply. (Without a GPU --offload
    does nothing, tests/test_said_what_was_cut.py; here the CPU counts as one, so the hooks run.)"""
    from hyv_lib.base.errors import HyvInputError
    from hyv_lib.runtimes import placement
    from hyv_lib.runtimes.placement import OFFLOADED

    monkeypatch.setattr(placement, "OFFLOAD_DEVICE_TYPES", ("cuda", "cpu"))

    components = load_components(TINY, None, ["transformer", "scheduler"])
    plain = stage2(str(tiny_run), str(tmp_path / "plain"), quiet=True)
    streamed = stage2(str(tiny_run), str(tmp_path / "offload"), quiet=True, offload="block", components=components)
    again = stage2(str(tiny_run), str(tmp_path / "again"), quiet=True, offload="block", components=components)
    assert torch.equal(plain, streamed) and torch.equal(plain, again)
    transformer = components["transformer"]
    assert OFFLOADED[transformer] == torch.device("cpu")
    hooked = [name for name, m in transformer.named_modules() if getattr(m, "_diffusers_hook", None) is not None]
    assert any(name.startswith("transformer_blocks.") for name in hooked)
    assert json.loads((tmp_path / "offload" / "generation_config.json").read_text())["offload"] == "block"
    assert "offload" not in json.loads((tmp_path / "plain" / "generation_config.json").read_text())
    for kwargs, message in ((dict(offload="leaf"), "must be one of block, model"),
                            (dict(offload="block", runtime="jax"), "on `runtime` torch, not 'jax'"),
                            (dict(offload="block", enable_cache=True), "not combined with `enable_cache`")):
        with pytest.raises(HyvInputError, match=message):
            stage2(str(tiny_run), str(tmp_path / "bad"), quiet=True, **kwargs)


def test_model_offload_holds_the_gpu_only_while_denoising(tiny_run, tmp_path, monkeypatch):
    """--offload model: the transformer waits on the host, is moved to the device for the denoising loop and back
    after it (the GPU's freed blocks released), so the VAE decode that follows has the card. On the CPU the latents
    are the resident model's, bit for bit, and the mode is recorded (the CPU counted as a GPU: without one --offload
    does nothing); the moves are checked with a stand-in GPU (a spy on torch.nn.Module.to that records the target and
    stays on the host)."""
    from hyv_lib.runtimes import placement
    from hyv_lib.runtimes.placement import place_transformer, while_denoising

    monkeypatch.setattr(placement, "OFFLOAD_DEVICE_TYPES", ("cuda", "cpu"))

    plain = stage2(str(tiny_run), str(tmp_path / "plain"), quiet=True)
    cache = dict(enable_cache=True, cache_start_step=2, cache_end_step=6, cache_step_interval=2)
    moved = stage2(str(tiny_run), str(tmp_path / "model"), quiet=True, offload="model", **cache)
    cached = stage2(str(tiny_run), str(tmp_path / "cached"), quiet=True, **cache)
    assert torch.equal(moved, cached) and not torch.equal(moved, plain)  # the cache is on in both
    assert json.loads((tmp_path / "model" / "generation_config.json").read_text())["offload"] == "model"

    model = load_components(TINY, None, ["transformer"])["transformer"]
    moves, emptied = [], []
    original_to = torch.nn.Module.to

    def spy(module, *args, device=None, dtype=None, **kwargs):
        if module is model:
            moves.append(str(device if device is not None else args[0]))
        return original_to(module, "cpu")

    monkeypatch.setattr(torch.nn.Module, "to", spy)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(True))
    gpu = torch.device("cuda")
    place_transformer(model, gpu, "model")
    assert moves == []  # waits on the host
    with while_denoising(model, gpu, "model"):
        assert moves == ["cuda"]
    assert moves == ["cuda", "cpu"] and emptied == [True]
    moves.clear()
    place_transformer(model, gpu, None)  # no offload: resident on the GPU
    with while_denoising(model, gpu, None):
        pass
    assert moves == ["cuda"]


def test_a_gpu_stage_records_the_allocator_peaks_next_to_the_rss(monkeypatch):
    """On a GPU, generation_config.json gets torch's allocated and reserved peaks of the stage's work (reset when it
    starts), not only the host RSS; without CUDA the fields are absent. CUDA is faked: a stand-in allocator."""
    from hyv_lib.base.memory import PeakMemory
    from hyv_lib.pipeline.stages import memory_fields

    with PeakMemory() as cpu_only:
        pass
    assert "stage2_gpu_peak_allocated_mib" not in memory_fields("stage2", cpu_only)
    peaks = {"allocated": 5 * 2**30, "reserved": 6 * 2**30, "resets": 0}
    fake = dict(is_available=lambda: True, is_initialized=lambda: True, synchronize=lambda: None,
                reset_peak_memory_stats=lambda: peaks.update(resets=peaks["resets"] + 1),
                max_memory_allocated=lambda: peaks["allocated"], max_memory_reserved=lambda: peaks["reserved"])
    for name, fn in fake.items():
        monkeypatch.setattr(torch.cuda, name, fn)
    with PeakMemory() as memory:
        pass
    fields = memory_fields("stage2", memory)
    assert peaks["resets"] == 1
    assert fields["stage2_gpu_peak_allocated_mib"] == 5120.0 and fields["stage2_gpu_peak_reserved_mib"] == 6144.0
    assert fields["stage2_peak_rss_mib"] > 0


def test_same_seed_gives_bitwise_identical_latents_and_warmup_changes_nothing(tiny_run, tmp_path):
    reference = load_file(tiny_run / "stage2_latents.safetensors")["latents"]
    again = stage2(str(tiny_run), output_dir=str(tmp_path / "a"), quiet=True)
    warm = stage2(str(tiny_run), output_dir=str(tmp_path / "b"), warmup_steps=2, quiet=True)
    other = stage2(str(tiny_run), output_dir=str(tmp_path / "c"), seed=7, quiet=True)
    assert torch.equal(again, reference)
    assert torch.equal(warm, reference)
    assert not torch.allclose(other, reference)


def test_output_dir_gets_the_config_of_the_input_dir(tiny_run, tmp_path):
    stage2(str(tiny_run), output_dir=str(tmp_path), quiet=True, num_inference_steps=2)
    cfg = json.loads((tmp_path / "generation_config.json").read_text())
    assert cfg["prompt"] == 'a red ball and the word "HI"' and cfg["num_inference_steps"] == 2


def test_denoise_matches_the_diffusers_pipeline(tiny_run):
    """Our loop (CFG as one batch of 2) equals HunyuanVideo15Pipeline's own loop on the same inputs."""
    from diffusers import HunyuanVideo15Pipeline

    components = build_tiny_components(TINY)
    pipe = HunyuanVideo15Pipeline(**components)
    pipe.set_progress_bar_config(disable=True)
    embeds = load_stage1(str(tiny_run))
    start = initial_latents(TINY.latent_shape(64, 96, 9), seed=3)
    ours = denoise(
        torch_step(components["transformer"]), start,
        prepare_conditioning(embeds, TINY, torch.float32), components["scheduler"],
        num_inference_steps=4, guidance_scale=6.0, progress=False)
    pipe.vision_num_semantic_tokens = TINY.image_tokens
    theirs = pipe(
        **{k: v.float() if v.is_floating_point() else v for k, v in embeds.items()},
        height=64, width=96, num_frames=9, num_inference_steps=4, latents=start.clone(), output_type="latent",
    ).frames
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)


def test_saved_tiny_folder_loads_through_the_real_weights_path(tiny_folder, tiny_run, tmp_path):
    """Saving the tiny pipeline and loading it with from_pretrained gives bit-identical results."""
    assert (tiny_folder / "model_index.json").is_file()
    built = build_tiny_components(TINY)
    loaded = load_components(TINY, str(tiny_folder), ["transformer", "vae", "text_encoder", "text_encoder_2"])
    for name, module in loaded.items():
        ref = built[name].state_dict()
        assert all(torch.equal(v, ref[k]) for k, v in module.state_dict().items()), name
    generate(preset="tiny", model_path=str(tiny_folder), prompt='a red ball and the word "HI"',
             output_dir=str(tmp_path), quiet=True)
    for f in ("stage1_embeddings.safetensors", "stage2_latents.safetensors"):
        a, b = load_file(tmp_path / f), load_file(tiny_run / f)
        assert all(torch.equal(a[k], b[k]) for k in a), f
    assert json.loads((tmp_path / "generation_config.json").read_text())["model_path"] == str(tiny_folder)


def test_real_preset_runs_a_diffusers_folder_through_the_model_path(tiny_folder, tmp_path):
    """`--preset 720p_t2v --model_path DIR`: the real preset's recipe (1000 text tokens after a 108-token crop,
    256 ByT5 tokens, 729 image tokens) with the weights of a folder of its layout (save_tiny's: tiny widths, which
    come from the models); a folder of another layout (the tiny preset's) is refused before any work."""
    from hyv_lib.cli.commands import run
    from hyv_lib.models.components import save_tiny_pipeline

    args = ["--prompt", "a red ball", "--height", "64", "--width", "64", "--video_length", "5",
            "--num_inference_steps", "2", "--quiet"]
    refused = tmp_path / "refused"
    assert run(["generate", "--preset", "720p_t2v", "--model_path", str(tiny_folder), "--output_dir", str(refused),
                *args]) == 2 and not refused.exists()
    tiny_folder = tmp_path / "720p_layout"
    save_tiny_pipeline(str(tiny_folder), preset="720p_t2v")
    out = tmp_path / "real_layout"
    code = run(["generate", "--preset", "720p_t2v", "--model_path", str(tiny_folder), "--output_dir", str(out), *args])
    assert code == 0
    embeds = load_file(out / "stage1_embeddings.safetensors")
    assert embeds["prompt_embeds"].shape == (1, 1000, TINY.text_dim)
    assert embeds["prompt_embeds_2"].shape == (1, 256, TINY.byt5_dim)
    assert embeds["prompt_embeds"].dtype == torch.bfloat16  # the real preset's default dtype
    video, _ = read_mp4(str(out / "output_video.mp4"))
    assert video.shape == (5, 64, 64, 3)
    cfg = json.loads((out / "generation_config.json").read_text())
    assert cfg["preset"] == "720p_t2v" and cfg["model_path"] == str(tiny_folder) and cfg["dtype"] == "bf16"


def test_empty_prompt_gives_finite_latents(tmp_path):
    stage1(preset="tiny", prompt="", output_dir=str(tmp_path))
    latents = stage2(str(tmp_path), num_inference_steps=2, quiet=True)
    assert torch.isfinite(latents).all()


def test_bf16_run_is_finite_and_saved_in_bf16(tmp_path):
    stage1(preset="tiny", prompt="a cat", output_dir=str(tmp_path), dtype="bf16")
    assert load_file(tmp_path / "stage1_embeddings.safetensors")["prompt_embeds"].dtype == torch.bfloat16
    latents = stage2(str(tmp_path), num_inference_steps=2, quiet=True)
    assert latents.dtype == torch.float32 and torch.isfinite(latents).all()


@pytest.mark.parametrize("size", [(64, 96), (48, 48)])
def test_explicit_size_overrides_the_bucket(tiny_run, tmp_path, size):
    latents = stage2(str(tiny_run), output_dir=str(tmp_path), height=size[0], width=size[1],
                     video_length=5, num_inference_steps=1, quiet=True)
    assert latents.shape == TINY.latent_shape(*size, 5)


def test_largest_tensor_counts_new_tensors_not_views():
    from hyv_lib.base.memory import LargestTensor

    base = torch.zeros(1000, dtype=torch.bool)  # made before the block
    with LargestTensor() as probe:
        base.view(10, 100)  # a view of 1,000 elements: skipped
        torch.ones(300, dtype=torch.bool)  # most elements: 300 (300 bytes)
        torch.ones(10, 20)  # most bytes: 200 float32 elements = 800 bytes
    assert (probe.elements, probe.bytes) == (300, 800) and "ones" in probe.op
