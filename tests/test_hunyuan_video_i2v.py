"""HunyuanVideo-I2V (the 33-channel latent-concat checkpoint) at tiny widths against diffusers'
HunyuanVideoImageToVideoPipeline: stage 1 (LLaVA reads the first frame with the prompt; the frame's VAE latents), the
loop's latents from the same noise, a saved real-layout folder end to end through the CLI, its three stages and
load_pipeline, and bad input."""

import json
import os

import numpy as np
import pytest
import torch
from diffusers import HunyuanVideoImageToVideoPipeline
from PIL import Image, ImageDraw
from safetensors.torch import load_file

from hyv_lib.base.errors import HyvInputError
from hyv_lib.cli.commands import run
from hyv_lib.models.families import family_for
from hyv_lib.models.hunyuan_video import first_frame
from hyv_lib.models.hunyuan_video.components import I2V_COMPONENTS, build_tiny
from hyv_lib.models.hunyuan_video.presets import HUNYUANVIDEO_I2V_TINY, i2v_text_tokens

PRESET = HUNYUANVIDEO_I2V_TINY
FAMILY = family_for(PRESET)
PROMPT = "a red circle moving left on a gray background"
# fp32 on the CPU. Measured: stage 1 against encode_prompt 0 (the pipeline's own methods); cond_latents against the
# VAE by hand 0; the loop and generate's latents against the pipeline's 0 (the same ops in order), generate's frames
# against its decode 0 levels of 255.
TOL = 1e-5
STEPS = 2


def picture(width=80, height=48):
    """A gray frame with a red disc left of centre."""
    image = Image.new("RGB", (width, height), (128, 128, 128))
    ImageDraw.Draw(image).ellipse((width // 4, height // 3, width // 4 + height // 3, 2 * height // 3),
                                  fill=(220, 30, 30))
    return image


@pytest.fixture(scope="module")
def tiny():
    return build_tiny(PRESET, seed=0)


@pytest.fixture(scope="module")
def frame():
    """The first frame cropped to its bucket, as stage 1 crops it."""
    return FAMILY.crop_image(PRESET, picture())


def pipeline_of(tiny) -> HunyuanVideoImageToVideoPipeline:
    pipe = HunyuanVideoImageToVideoPipeline(**{name: tiny[name] for name in I2V_COMPONENTS})
    pipe.set_progress_bar_config(disable=True)
    return pipe


def pipeline_text(tiny) -> dict:
    """The keywords that give the pipeline the tiny tokenizer's template (its crop and the image's place in it)."""
    return dict(prompt_template=first_frame.prompt_template(PRESET, tiny["tokenizer"]),
                max_sequence_length=i2v_text_tokens(PRESET))


# ---------------------------------------------------------------------------------------------- the preset
def test_the_tiny_preset_is_the_real_layout(tiny):
    """The tiny I2V twin has the real checkpoint's layout (33 channels, latent concat, no guidance embedding) and a
    LLaVA whose 16 image tokens (32 px in 8 px patches), halved by the interleave, and 32 text tokens make text_len."""
    real = family_for(PRESET).presets[1]
    assert real.name == "hunyuanvideo_i2v"
    for key in ("in_channels", "guidance_embeds", "image_condition_type"):
        assert PRESET.transformer[key] == real.transformer[key]
    llava = tiny["text_encoder"]
    assert type(llava).__name__ == "LlavaForConditionalGeneration"
    assert llava.config.image_token_index == tiny["tokenizer"].convert_tokens_to_ids("<image>")
    assert PRESET.text_len == 16 // 2 + 36 - 4 and i2v_text_tokens(PRESET) == 36
    assert i2v_text_tokens(real) == 256  # diffusers' max_sequence_length default for the real 540 tokens
    assert tiny["tokenizer"].tokenize("assistant") == ["assistant"]  # one token, as in Llama-3's vocabulary


# ---------------------------------------------------------------------------------------------- stage 1
def test_stage1_text_is_the_pipelines_encode_prompt(tiny, frame):
    """The family's text for a prompt with its first frame, and the negative prompt with none (a black frame), equals
    HunyuanVideoImageToVideoPipeline.encode_prompt on the same image; the mask is the image's 8 tokens then the
    prompt's bytes and the 2 newlines left after the assistant header is cut, padding after."""
    prompts = [PROMPT, "a cat"]
    ours = FAMILY.encode_texts(tiny, PRESET, prompts, images=[frame, None])
    assert ours["prompt_embeds"].shape == (2, PRESET.text_len, PRESET.text_dim)
    assert ours["prompt_embeds_mask"].dtype == torch.int64 and ours["pooled_prompt_embeds"].shape == (2, 16)
    pipe = pipeline_of(tiny)
    black = Image.new("RGB", frame.size, 0)
    for index, (prompt, image) in enumerate(zip(prompts, (frame, black))):
        with torch.no_grad():
            embeds, pooled, mask = pipe.encode_prompt(image=image, prompt=prompt, device=torch.device("cpu"),
                                                      **pipeline_text(tiny))
        assert torch.equal(ours["prompt_embeds"][index : index + 1], embeds)
        assert torch.equal(ours["prompt_embeds_mask"][index : index + 1], mask.long())
        assert torch.equal(ours["pooled_prompt_embeds"][index : index + 1], pooled)
    # counted by hand: 8 image tokens, "a cat" is 5 bytes, then "\n\n" of the assistant header
    assert ours["prompt_embeds_mask"][1].tolist() == [1] * (8 + 5 + 2) + [0] * (PRESET.text_len - 15)
    assert ours["prompt_embeds_mask"][0].sum().item() == 8 + min(len(PROMPT) + 2, 32)
    # the first frame is read: the same prompt with the black frame gives other states, on the text tokens too
    other = FAMILY.encode_texts(tiny, PRESET, [PROMPT, PROMPT], images=[frame, None])
    assert (other["prompt_embeds"][0, 8:] - other["prompt_embeds"][1, 8:]).abs().max() > 1e-3


def test_the_cut_counts_say_what_reaches_the_embeddings(tiny, frame):
    """The window holds 36 tokens of the prompt and the template after it; a prompt that pushes the assistant header
    out loses the window's last 4 too (the pipeline cuts them as the header). Byte tokens, counted by hand: 32 of a
    prompt's tokens reach the embeddings, and a 33-byte prompt's embeddings are those of its first 32 bytes."""
    texts = {"a": "x" * 20, "b": "x" * 32, "c": "x" * 32 + "y", "d": PROMPT}
    cuts = FAMILY.tokens_cut(tiny, PRESET, texts)
    for key, text in texts.items():
        assert cuts[f"{key}_tokens_dropped"] == (max(0, len(text) - 32), len(text), 32, "the text encoder"), key
    ours = FAMILY.encode_texts(tiny, PRESET, [texts["b"], texts["c"]], images=[frame, frame])
    assert torch.equal(ours["prompt_embeds"][0], ours["prompt_embeds"][1])
    assert ours["prompt_embeds_mask"].sum(1).tolist() == [PRESET.text_len] * 2


def test_the_first_frames_latents_are_the_vaes_mode(tiny, frame):
    """cond_latents: the cropped frame in [-1, 1] through the VAE, its latent mode times the scaling factor, computed
    here from the pixels by hand."""
    ours = FAMILY.encode_image(tiny, PRESET, frame)
    assert set(ours) == {"cond_latents"}
    pixels = torch.from_numpy(np.asarray(frame, dtype=np.float32)).permute(2, 0, 1) / 127.5 - 1
    with torch.no_grad():
        mode = tiny["vae"].encode(pixels[None, :, None]).latent_dist.mode()
    expected = mode * tiny["vae"].config.scaling_factor
    assert ours["cond_latents"].shape == (1, 16, 1, frame.size[1] // 8, frame.size[0] // 8)
    assert (ours["cond_latents"] - expected).abs().max() <= TOL


# ---------------------------------------------------------------------------------------------- stage 2
def test_the_loop_is_the_pipelines_latents(tiny, frame):
    """Stage 1 (generic encode_pair) then family.sample from a seed equal HunyuanVideoImageToVideoPipeline
    (output_type="latent") on the same image, prompt and noise: noise x 0.999 + image latents x 0.001, the
    33-channel input (latents, first-frame latents, mask), no guidance embedding; the pipeline returns the frames
    after the first."""
    from hyv_lib.pipeline.settings import Stage2Settings
    from hyv_lib.pipeline.text import encode_pair
    from hyv_lib.runtimes.step import torch_step

    embeds = encode_pair(tiny, PRESET, PROMPT, "blurry", image=frame)
    FAMILY.check_stage1(embeds, PRESET, "stage1_embeddings.safetensors")
    height, width = frame.size[1], frame.size[0]
    settings = Stage2Settings(height=height, width=width, video_length=9, num_inference_steps=3,
                              guidance_scale=PRESET.guidance_scale, flow_shift=PRESET.flow_shift, seed=7)
    ours = FAMILY.sample(torch_step(tiny["transformer"]), tiny["transformer"], tiny["scheduler"].config, PRESET,
                         embeds, settings, progress=False)
    noise = torch.randn(ours.shape, generator=torch.Generator().manual_seed(7))
    theirs = pipeline_of(tiny)(image=frame, prompt=PROMPT, height=height, width=width, num_frames=9,
                               num_inference_steps=3, guidance_scale=PRESET.guidance_scale, latents=noise.clone(),
                               output_type="latent", **pipeline_text(tiny)).frames
    assert ours.shape == (1, 16, 3, height // 8, width // 8) and theirs.shape == (1, 16, 2, height // 8, width // 8)
    assert (ours[:, :, 1:] - theirs).abs().max() <= TOL and not torch.equal(ours, noise)
    # the first frame conditions the loop: a black one ends elsewhere
    black = dict(embeds, cond_latents=FAMILY.encode_image(tiny, PRESET, Image.new("RGB", frame.size, 0))[
        "cond_latents"])
    again = FAMILY.sample(torch_step(tiny["transformer"]), tiny["transformer"], tiny["scheduler"].config, PRESET,
                          black, settings, progress=False)
    assert (again - ours).abs().max() > 1e-3


# ---------------------------------------------------------------------------------------------- a folder, end to end
@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """save_tiny_pipeline's folder of the tiny I2V preset: HunyuanVideoImageToVideoPipeline's layout."""
    from hyv_lib.models.components import save_tiny_pipeline

    path = str(tmp_path_factory.mktemp("hunyuanvideo_i2v") / "model")
    save_tiny_pipeline(path, preset=PRESET.name)
    return path


@pytest.fixture(scope="module")
def image_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("image") / "first_frame.png"
    picture().save(path)
    return str(path)


@pytest.fixture(scope="module")
def generated(folder, image_path, tmp_path_factory):
    """``generate --image_path`` from the saved folder, 9 frames, the decoded frames saved too."""
    out = str(tmp_path_factory.mktemp("i2v_run") / "run")
    assert run(["generate", "--preset", PRESET.name, "--model_path", folder, "--image_path", image_path,
                "--prompt", PROMPT, "--output_dir", out, "--num_inference_steps", str(STEPS), "--seed", "3",
                "--save_frames", "--quiet"]) == 0
    return out


def test_the_folder_is_the_pipelines_layout(folder, tiny):
    """diffusers loads the folder as HunyuanVideoImageToVideoPipeline (LLaVA, CLIP's image processor); hyv_lib loads
    the same weights by the family's classes, and the folder's configs say it is the tiny I2V preset."""
    from hyv_lib.models.components import load_components
    from hyv_lib.models.folder import detect_preset

    pipe = HunyuanVideoImageToVideoPipeline.from_pretrained(folder)
    assert type(pipe.text_encoder).__name__ == "LlavaForConditionalGeneration"
    assert pipe.transformer.config.in_channels == 33
    assert detect_preset(folder)[0].name == PRESET.name
    loaded = load_components(PRESET, folder, FAMILY.pipeline_components(PRESET))
    assert set(loaded) == set(I2V_COMPONENTS)
    for name in ("text_encoder", "transformer"):
        assert all(torch.equal(a, b) for a, b in zip(loaded[name].state_dict().values(),
                                                     tiny[name].state_dict().values()))
    assert loaded["tokenizer"]("<image> assistant").input_ids == tiny["tokenizer"]("<image> assistant").input_ids


def test_generate_writes_the_pipelines_video(generated, folder, image_path):
    """``generate --image_path``: stage 1 holds LLaVA's text and the first frame's latents at the bucket's size; the
    latents are HunyuanVideoImageToVideoPipeline's from the same seed (read at its last step), and the video is its
    decode: 9 frames less the first 4 it drops, 5 frames."""
    from hyv_lib.models.family import initial_latents
    from hyv_lib.pipeline.video_io import read_mp4

    stage1 = load_file(os.path.join(generated, "stage1_embeddings.safetensors"))
    config = json.load(open(os.path.join(generated, "generation_config.json")))
    height, width = config["image_height"], config["image_width"]
    assert config["task"] == "i2v" and (height, width) == (config["height"], config["width"]) == (96, 160)
    assert stage1["cond_latents"].shape == (1, 16, 1, height // 8, width // 8)
    assert stage1["prompt_embeds"].shape == (1, PRESET.text_len, PRESET.text_dim)
    latents = load_file(os.path.join(generated, "stage2_latents.safetensors"))["latents"]
    assert latents.shape == (1, 16, 3, height // 8, width // 8)
    pipe = HunyuanVideoImageToVideoPipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    last = {}

    def keep(pipeline, step, t, tensors):
        last["latents"] = tensors["latents"]
        return {}

    frame = FAMILY.crop_image(PRESET, Image.open(image_path).convert("RGB"))
    theirs = pipe(image=frame, prompt=PROMPT, height=height, width=width, num_frames=9, num_inference_steps=STEPS,
                  guidance_scale=PRESET.guidance_scale, latents=initial_latents(tuple(latents.shape), 3),
                  output_type="np", callback_on_step_end=keep, **pipeline_text(pipe.components)).frames[0]
    assert (latents - last["latents"]).abs().max() <= TOL
    saved = load_file(os.path.join(generated, "stage3_frames.safetensors"))["frames"][0].permute(1, 2, 3, 0)
    assert saved.shape == theirs.shape == (5, height, width, 3)
    assert (saved.int() - torch.from_numpy(theirs * 255).round().int()).abs().max() <= 1
    frames, meta = read_mp4(os.path.join(generated, "output_video.mp4"))
    assert frames.shape == (5, height, width, 3) and meta["fps"] == PRESET.fps


def test_the_three_stages_and_load_pipeline_equal_generate(generated, folder, image_path, tmp_path):
    """stage1, stage2 and stage3 run one by one, and load_pipeline(...).generate(image=...), give generate's
    latents."""
    import hyv_lib
    from hyv_lib.pipeline.video_io import read_mp4

    staged = str(tmp_path / "staged")
    assert run(["stage1", "--preset", PRESET.name, "--model_path", folder, "--image_path", image_path,
                "--prompt", PROMPT, "--output_dir", staged, "--quiet"]) == 0
    assert run(["stage2", "--input_dir", staged, "--num_inference_steps", str(STEPS), "--seed", "3",
                "--quiet"]) == 0
    assert run(["stage3", "--input_dir", staged, "--quiet"]) == 0
    first = load_file(os.path.join(generated, "stage2_latents.safetensors"))["latents"]
    assert torch.equal(load_file(os.path.join(staged, "stage2_latents.safetensors"))["latents"], first)
    assert read_mp4(os.path.join(staged, "output_video.mp4"))[0].shape[0] == 5
    video = hyv_lib.load_pipeline(PRESET.name, model_path=folder, progress=False).generate(
        PROMPT, image=image_path, num_inference_steps=STEPS, seed=3, progress=False)
    assert (video.latents - first).abs().max() <= TOL and video.frames.shape[0] == 5


# ---------------------------------------------------------------------------------------------- bad input
def test_bad_input_names_the_argument(tiny, frame, image_path, tmp_path, capsys):
    """No image for the image-to-video preset, an image for a text-to-video one, or text without its frame: one
    HyvInputError naming the argument, before any model loads."""
    from hyv_lib.pipeline.stages import generate

    with pytest.raises(HyvInputError, match="image-to-video checkpoint: give the first frame") as err:
        generate(preset=PRESET.name, prompt=PROMPT, output_dir=str(tmp_path / "a"))
    assert err.value.argument == "image_path"
    with pytest.raises(HyvInputError, match="text-to-video checkpoint") as err:
        generate(preset="hunyuanvideo_tiny", prompt=PROMPT, output_dir=str(tmp_path / "b"), image_path=image_path)
    assert err.value.argument == "image_path" and "hunyuanvideo_i2v" in err.value.message
    assert run(["generate", "--preset", PRESET.name, "--prompt", PROMPT, "--output_dir", str(tmp_path / "c"),
                "--quiet"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --image_path:")
    with pytest.raises(HyvInputError, match="reads each prompt with its first frame") as err:
        FAMILY.encode_texts(tiny, PRESET, [PROMPT])
    assert err.value.argument == "images"
    from hyv_lib.pipeline.settings import Stage2Settings
    from hyv_lib.runtimes.step import torch_step

    embeds = {"prompt_embeds": torch.zeros(1, PRESET.text_len, 32), "pooled_prompt_embeds": torch.zeros(1, 16),
              "prompt_embeds_mask": torch.ones(1, PRESET.text_len), "cond_latents": torch.zeros(1, 16, 1, 6, 10)}
    short = Stage2Settings(height=48, width=80, video_length=1, num_inference_steps=1, guidance_scale=1.0,
                           flow_shift=7.0, seed=0)
    with pytest.raises(HyvInputError, match="keeps the frames after the first 4") as err:  # it would keep none
        FAMILY.sample(torch_step(tiny["transformer"]), tiny["transformer"], tiny["scheduler"].config, PRESET, embeds,
                      short, progress=False)
    assert err.value.argument == "video_length"
    t2v = build_tiny(family_for(PRESET).presets[2], names=["text_encoder"])  # hunyuanvideo_tiny's LlamaModel
    with pytest.raises(HyvInputError, match="text_encoder is a LlamaModel") as err:
        FAMILY.encode_texts({**tiny, **t2v}, PRESET, [PROMPT], images=[frame])
    assert err.value.argument == "model_path"
