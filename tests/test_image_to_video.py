"""Image-to-video: the first frame through stage 1 (SigLIP + VAE), stage 2's conditioning, the step-distilled
(MeanFlow) loop, and bad images, against diffusers' HunyuanVideo15ImageToVideoPipeline."""

import dataclasses
import json

import pytest
import torch
from PIL import Image, ImageDraw
from safetensors.torch import load_file

from hyv_lib.base.errors import HyvInputError
from hyv_lib.models.families import PRESETS, get_preset
from hyv_lib.models.hunyuan_video15.presets import TINY
from hyv_lib.cli.commands import run
from hyv_lib.models.components import build_tiny_components
from hyv_lib.models.hunyuan_video15.components import COMPONENTS, IMAGE_COMPONENTS
from hyv_lib.models.flow_matching import condition_channels
from hyv_lib.models.family import initial_latents
from hyv_lib.models.hunyuan_video15.sampling import sampling_schedule
from hyv_lib.pipeline.stages import generate, stage1, stage2

PROMPT = "a red circle moving left on a gray background"


def first_frame(width=160, height=90, mode="RGB"):
    """A gray frame with a red disc left of centre: what an image-to-video run starts from."""
    image = Image.new("RGB", (width, height), (128, 128, 128))
    ImageDraw.Draw(image).ellipse((width // 4, height // 3, width // 4 + height // 3, 2 * height // 3), fill=(220, 30, 30))
    return image.convert(mode)


@pytest.fixture(scope="module")
def image_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("image") / "first_frame.png"
    first_frame().save(path)
    return path


def diffusers_i2v(components):
    from diffusers import HunyuanVideo15ImageToVideoPipeline

    pipe = HunyuanVideo15ImageToVideoPipeline(**{n: components[n] for n in COMPONENTS + IMAGE_COMPONENTS})
    pipe.set_progress_bar_config(disable=True)
    return pipe


def test_stage1_and_stage2_equal_the_diffusers_i2v_pipeline(tiny_folder, image_path, tmp_path):
    """Files in between, CFG 6 on the tiny preset: the latents equal diffusers' I2V pipeline on the same image,
    prompts and starting noise (it buckets, crops and encodes the image itself)."""
    stage1(preset="tiny", prompt=PROMPT, negative_prompt="blurry", output_dir=str(tmp_path),
           model_path=str(tiny_folder), image_path=str(image_path))
    embeds = load_file(tmp_path / "stage1_embeddings.safetensors")
    assert list(embeds["image_embeds"].shape) == [1, TINY.image_tokens, TINY.image_dim]
    assert list(embeds["cond_latents"].shape) == [1, TINY.latent_channels, 1, 96 // 16, 160 // 16]  # bucket 96x160
    assert {k: tuple(v.shape) for k, v in embeds.items()} == TINY.stage1_shapes(image_size=(96, 160))
    config = json.loads((tmp_path / "generation_config.json").read_text())
    assert (config["task"], config["image_height"], config["image_width"]) == ("i2v", 96, 160)
    ours = stage2(str(tmp_path), num_inference_steps=3, seed=5, quiet=True)
    assert list(ours.shape) == [1, TINY.latent_channels, 3, 6, 10]

    components = build_tiny_components(TINY, names=COMPONENTS + IMAGE_COMPONENTS)
    start = initial_latents(tuple(ours.shape), seed=5)
    # The text embeddings are stage 1's (the tiny tokenizer's template crop is computed, not diffusers' 108; chapter
    # 2's tests cover the text path); the image goes in as a file and diffusers buckets, crops and encodes it.
    text = {k: v for k, v in embeds.items() if k not in ("image_embeds", "cond_latents")}
    theirs = diffusers_i2v(components)(image=Image.open(image_path), **text, num_frames=9, num_inference_steps=3,
                                       latents=start.clone(), output_type="latent").frames
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)  # measured 2.0e-6 (the issue asks for 1e-5)
    # The image matters: the same run from zero image conditioning (t2v) lands elsewhere.
    t2v = generate(preset="tiny", prompt=PROMPT, negative_prompt="blurry", output_dir=str(tmp_path / "t2v"),
                   model_path=str(tiny_folder), height=96, width=160, num_inference_steps=3, seed=5,
                   quiet=True)
    assert (load_file(tmp_path / "t2v" / "stage2_latents.safetensors")["latents"] - ours).abs().max() > 1e-2
    assert t2v.shape[1:3] == (96, 160)


def test_meanflow_step_distilled_loop_equals_diffusers():
    """The step-distilled recipe (MeanFlow timestep_r, CFG 1 as one forward per step, shift 7) on a tiny MeanFlow
    transformer, in memory: equal to diffusers' I2V pipeline with its guider at 1.0."""
    from diffusers.guiders import ClassifierFreeGuidance

    from hyv_lib.pipeline.inference import VideoPipeline

    preset = dataclasses.replace(TINY, name="tiny_meanflow", guidance_scale=1.0, flow_shift=7.0, default_steps=4,
                                 transformer=dict(TINY.transformer, use_meanflow=True))
    components = build_tiny_components(preset, names=COMPONENTS + IMAGE_COMPONENTS)
    calls = []
    components["transformer"].register_forward_pre_hook(lambda m, a, kw: calls.append(kw.get("timestep_r")),
                                                        with_kwargs=True)
    video = VideoPipeline(preset, components).generate(PROMPT, image=first_frame(), seed=2, progress=False)
    ours_calls, calls[:] = list(calls), []
    assert len(ours_calls) == 4 and all(r is not None and r.shape == (1,) for r in ours_calls)  # one sample per step
    assert [round(float(r[0]), 2) for r in ours_calls] == [954.55, 875.0, 700.0, 0.0]

    components["guider"] = ClassifierFreeGuidance(guidance_scale=1.0)
    text = {k: v for k, v in VideoPipeline(preset, components).encode(PROMPT).items()}
    theirs = diffusers_i2v(components)(image=first_frame(), **text, num_frames=9, num_inference_steps=4,
                                       latents=initial_latents(tuple(video.latents.shape), seed=2),
                                       output_type="latent").frames
    assert len(calls) == 4
    torch.testing.assert_close(video.latents, theirs, rtol=0, atol=1e-6)  # measured 0 (the same ops in order)
    assert video.config["task"] == "i2v"


def test_i2v_presets_follow_the_published_settings():
    """Shift, CFG, steps and MeanFlow per variant as the official README's table gives them (hand-copied here, an
    independent source: 480p I2V shift 5 CFG 6 50 steps; 720p I2V shift 7 CFG 6; step-distilled shift 7 CFG 1,
    8 or 12 steps, MeanFlow)."""
    table = {"480p_i2v": (5.0, 6.0, 50, False, 640), "720p_i2v": (7.0, 6.0, 50, False, 960),
             "480p_i2v_step_distilled": (7.0, 1.0, 8, True, 640)}
    for name, (shift, cfg, steps, meanflow, target) in table.items():
        p = get_preset(name)
        assert (p.flow_shift, p.guidance_scale, p.default_steps, p.use_meanflow, p.target_size) == \
            (shift, cfg, steps, meanflow, target), name
        assert p.tasks == ("i2v",) and p.transformer["task_type"] == "i2v" and p.transformer["in_channels"] == 65
        assert p.hub_id == f"hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-{name}"
    assert all(p.tasks == ("t2v",) for n, p in PRESETS.items() if n.endswith("_t2v"))


def test_info_json_lists_the_i2v_presets(capsys):
    assert run(["info", "--preset", "480p_i2v_step_distilled", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["tasks"] == ["i2v"] and data["transformer"]["use_meanflow"] is True and data["default_steps"] == 8


@pytest.mark.parametrize("make, message", [
    (lambda d: d / "missing.png", "does not exist"),
    (lambda d: (d / "text.png").write_text("not an image") and d / "text.png", "not a readable image"),
    (lambda d: first_frame(mode="CMYK").save(d / "cmyk.jpg") or d / "cmyk.jpg", "mode 'CMYK'"),
    (lambda d: first_frame(200, 40).save(d / "wide.png") or d / "wide.png", "ratio beyond 4"),
    (lambda d: first_frame(12, 12).save(d / "small.png") or d / "small.png", "at least 16 pixels"),
])
def test_bad_images_exit_2_naming_the_flag_and_write_nothing(tmp_path, make, message, capsys):
    path = make(tmp_path)
    out = tmp_path / "out"
    code = run(["stage1", "--preset", "tiny", "--prompt", PROMPT, "--image_path", str(path), "--output_dir", str(out),
                "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "--image_path" in err and message in err, err
    assert not out.exists()


def test_task_and_preset_must_agree(image_path, tmp_path, capsys):
    """An image for a text-to-video checkpoint, or none for an image-to-video one: rc 2 before anything loads."""
    assert run(["stage1", "--preset", "720p_t2v", "--image_path", str(image_path), "--output_dir",
                str(tmp_path / "a")]) == 2
    assert "text-to-video checkpoint" in capsys.readouterr().err
    assert run(["generate", "--preset", "480p_i2v", "--prompt", PROMPT, "--output_dir", str(tmp_path / "b")]) == 2
    assert "--image_path" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_the_image_decides_the_size(image_path, tmp_path):
    with pytest.raises(HyvInputError) as err:
        generate(preset="tiny", prompt=PROMPT, output_dir=str(tmp_path), image_path=str(image_path),
                 height=64, width=64, quiet=True)
    assert err.value.argument == "height" and "96x160" in err.value.message
    assert not list(tmp_path.iterdir())


def test_stage1_shapes_of_an_image_to_video_file():
    """The real 720p I2V file from the preset: SigLIP's 729 tokens of width 1152 and one latent frame of the bucket."""
    shapes = get_preset("720p_i2v").stage1_shapes(image_size=(720, 1280))
    assert shapes["image_embeds"] == (1, 729, 1152) and shapes["cond_latents"] == (1, 32, 1, 45, 80)
    assert {k: v for k, v in shapes.items() if k not in ("image_embeds", "cond_latents")} == \
        get_preset("720p_t2v").stage1_shapes()
    with pytest.raises(HyvInputError, match="multiple of 16"):
        get_preset("720p_i2v").stage1_shapes(image_size=(720, 1270))


def test_the_step_distilled_schedule():
    """Shift 7, 8 steps: the timesteps of the official step-distilled recipe, and timestep_r = the next one (0 last);
    the loop's timestep_r values are checked against diffusers in test_meanflow_step_distilled_loop_equals_diffusers."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    preset = get_preset("480p_i2v_step_distilled")
    timesteps, timestep_r = sampling_schedule(FlowMatchEulerDiscreteScheduler(shift=preset.flow_shift),
                                              preset.default_steps)
    assert [round(float(t), 2) for t in timesteps] == [1000.0, 980.0, 954.55, 921.05, 875.0, 807.69, 700.0, 500.0]
    assert timestep_r.tolist() == timesteps[1:].tolist() + [0.0]


def test_condition_channels_hold_the_first_frame_and_its_mask():
    latents = torch.randn(1, 4, 3, 2, 5)
    cond = torch.randn(1, 4, 1, 2, 5)
    condition = condition_channels(latents, cond)
    assert condition.shape == (1, 5, 3, 2, 5)
    assert torch.equal(condition[:, :4, :1], cond) and not condition[:, :4, 1:].any()
    assert condition[:, 4, 0].eq(1).all() and not condition[:, 4, 1:].any()
    assert not condition_channels(latents).any()  # text to video: zeros
