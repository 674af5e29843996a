"""Stage 1 on the accelerator: the --text_device choice, today's embeddings on the CPU, the encoders visiting the
device one at a time and leaving it before stage 2 (a fake GPU that records moves), and the recorded fields."""

import json
from types import SimpleNamespace

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from hyv_lib.base.errors import HyvInputError
from hyv_lib.models.cogvideox.presets import COGVIDEOX_TINY
from hyv_lib.models.hunyuan_video15.presets import TINY
from hyv_lib.cli.commands import run
from hyv_lib.models.components import build_tiny_components
from hyv_lib.models.hunyuan_video15.components import COMPONENTS, IMAGE_COMPONENTS
from hyv_lib.models.hunyuan_video15.image import i2v_pipeline_class
from hyv_lib.models import devices
from hyv_lib.pipeline import denoiser, inference, stages
from hyv_lib.pipeline.encoder_device import ENCODERS, resolve_text_device
from hyv_lib.pipeline.image import crop_to_bucket
from hyv_lib.pipeline.inference import VideoPipeline
from hyv_lib.pipeline.text import encode_pair
from hyv_lib.models.hunyuan_video15.text import template_crop_start

PROMPT, NEGATIVE = 'a red circle moving left, a sign saying "GO"', "blurry"
GPU = torch.device("cuda", 0)
QWEN, BYT5, SIGLIP, VAE = "Qwen2_5_VLTextModel", "T5EncoderModel", "SiglipVisionModel", "AutoencoderKLHunyuanVideo15"


@pytest.fixture(scope="module")
def components():
    return build_tiny_components(TINY, names=COMPONENTS + IMAGE_COMPONENTS)


@pytest.fixture(scope="module")
def frame():
    image = Image.new("RGB", (160, 90), (128, 128, 128))
    image.paste((220, 30, 30), (40, 30, 70, 60))
    return crop_to_bucket(TINY, image)


def todays_tensors(components, image=None):
    """What stage 1 computed before --text_device: diffusers' static encoder functions called directly, on the CPU."""
    from diffusers import HunyuanVideo15Pipeline

    cpu = torch.device("cpu")
    embeds, mask = HunyuanVideo15Pipeline._get_mllm_prompt_embeds(
        text_encoder=components["text_encoder"], tokenizer=components["tokenizer"], prompt=[NEGATIVE, PROMPT],
        device=cpu, tokenizer_max_length=TINY.text_len, crop_start=template_crop_start(components["tokenizer"]))
    embeds_2, mask_2 = HunyuanVideo15Pipeline._get_byt5_prompt_embeds(
        tokenizer=components["tokenizer_2"], text_encoder=components["text_encoder_2"], prompt=[NEGATIVE, PROMPT],
        device=cpu, tokenizer_max_length=TINY.byt5_len)
    out = {}
    for index, prefix in ((0, "negative_"), (1, "")):
        out.update({prefix + "prompt_embeds": embeds[index : index + 1],
                    prefix + "prompt_embeds_mask": mask[index : index + 1].long(),
                    prefix + "prompt_embeds_2": embeds_2[index : index + 1],
                    prefix + "prompt_embeds_mask_2": mask_2[index : index + 1].long()})
    if image is not None:
        I2V = i2v_pipeline_class()
        out["image_embeds"] = I2V._get_image_embeds(components["image_encoder"], components["feature_extractor"],
                                                    image, cpu)
        from diffusers.pipelines.hunyuan_video1_5.image_processor import HunyuanVideo15ImageProcessor

        processor = HunyuanVideo15ImageProcessor(vae_scale_factor=TINY.spatial_compression, do_resize=False,
                                                 do_convert_rgb=True)  # the I2V pipeline's, the frame already cropped
        out["cond_latents"] = I2V._get_image_latents(components["vae"], processor, image, image.size[1],
                                                     image.size[0], cpu).float()
    return out


def assert_bit_equal(ours, truth):
    assert set(ours) == set(truth)
    for name, value in truth.items():
        assert ours[name].device.type == "cpu" and ours[name].dtype == value.dtype, name
        assert torch.equal(ours[name], value), (name, float((ours[name].float() - value.float()).abs().max()))


class FakeGpu:
    """A test double for a CUDA card on a CPU-only machine: ``Module.to(cuda)`` is recorded and the module marked as
    living there, but its weights stay on the host (so it still runs); moves to cpu/meta are real, and recorded too.
    ``hyv_lib.models.devices.module_device`` reports the recorded place, so placement decisions see the
    fake card; ``torch.cuda.empty_cache`` is recorded."""

    def __init__(self, monkeypatch):
        self.where, self.events = {}, []
        real_to = torch.nn.Module.to

        def to(module, *args, **kwargs):
            device, dtype, *_ = torch._C._nn._parse_to(*args, **kwargs)
            if device is None:
                return real_to(module, *args, **kwargs)
            self.events.append((type(module).__name__, device.type))
            self.where[module] = device
            if device.type == "cuda":
                return module if dtype is None else real_to(module, dtype=dtype)
            return real_to(module, *args, **kwargs)

        monkeypatch.setattr(torch.nn.Module, "to", to)
        monkeypatch.setattr(devices, "module_device",
                            lambda module: self.where.get(module, next(module.parameters()).device))
        monkeypatch.setattr(torch.cuda, "empty_cache", lambda: self.events.append(("empty_cache", "")))

    def on_gpu(self):
        return sorted(type(m).__name__ for m, d in self.where.items() if d.type == "cuda")

    def moves(self, names=(QWEN, BYT5, SIGLIP, VAE)):
        return [event for event in self.events if event[0] in names or event[0] == "empty_cache"]


def test_cpu_text_device_gives_todays_embeddings_bit_equal(components, frame, tmp_path):
    """text_device="cpu" (and None: where the encoders are) is today's stage 1, bit for bit, image included; the stage
    file too; and CogVideoX's T5."""
    truth = todays_tensors(components, frame)
    for device in (None, torch.device("cpu")):
        assert_bit_equal(encode_pair(components, TINY, PROMPT, NEGATIVE, "fp32", frame, device=device), truth)
    written = stages.stage1(preset="tiny", prompt=PROMPT, negative_prompt=NEGATIVE, output_dir=str(tmp_path),
                            text_device="cpu")
    assert_bit_equal(load_file(tmp_path / "stage1_embeddings.safetensors"),
                     {k: v for k, v in truth.items() if "image" not in k and "cond" not in k})
    assert_bit_equal(written, load_file(tmp_path / "stage1_embeddings.safetensors"))

    from diffusers import CogVideoXPipeline

    t5 = build_tiny_components(COGVIDEOX_TINY, names=["tokenizer", "text_encoder"])
    host = SimpleNamespace(tokenizer=t5["tokenizer"], text_encoder=t5["text_encoder"],
                           _execution_device=torch.device("cpu"))
    embeds = CogVideoXPipeline._get_t5_prompt_embeds(host, prompt=[NEGATIVE, PROMPT],
                                                     max_sequence_length=COGVIDEOX_TINY.text_len)
    ours = encode_pair(t5, COGVIDEOX_TINY, PROMPT, NEGATIVE, "fp32", device=torch.device("cpu"))
    assert_bit_equal(ours, {"prompt_embeds": embeds[1:2], "negative_prompt_embeds": embeds[0:1]})


def test_auto_is_the_cpu_here_and_the_rank_gpu_with_cuda(monkeypatch):
    assert not torch.cuda.is_available()  # this machine: auto is the host
    for value in ("auto", None, "AUTO", " cpu", torch.device("cpu")):
        assert resolve_text_device(value) == torch.device("cpu"), value
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a node of 4 GPUs, torchrun's rank 3
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert resolve_text_device("auto") == resolve_text_device("cuda") == torch.device("cuda", 3)
    assert resolve_text_device("cuda:1") == resolve_text_device(torch.device("cuda", 1)) == torch.device("cuda", 1)
    assert resolve_text_device("auto", runtime="jax") == torch.device("cpu")  # JAX holds the accelerator
    with pytest.raises(HyvInputError, match=r"has 4 CUDA device\(s\): cuda:0 to cuda:3") as err:
        resolve_text_device("cuda:4")
    assert err.value.argument == "text_device"


@pytest.mark.parametrize("value", ["gpu", "cuda:x", "tpu", "", 0])
def test_a_bad_value_is_one_error_naming_the_flag_and_the_values(value, tmp_path, capsys):
    with pytest.raises(HyvInputError) as err:
        stages.stage1(preset="tiny", prompt="x", output_dir=str(tmp_path / "out"), text_device=value)
    assert err.value.argument == "text_device" and "auto, cpu, cuda, cuda:N" in err.value.message
    assert repr(value) in err.value.message
    assert not (tmp_path / "out").exists()  # refused before any work
    if value:
        assert run(["stage1", "--preset", "tiny", "--output_dir", str(tmp_path / "cli"), "--text_device",
                    str(value)]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: --text_device: must be one of auto, cpu, cuda, cuda:N")
        assert not (tmp_path / "cli").exists()


def test_cuda_without_cuda_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for value in ("cuda", "cuda:0", torch.device("cuda", 1)):
        with pytest.raises(HyvInputError, match="CUDA is not available here .*: use auto or cpu") as err:
            resolve_text_device(value)
        assert err.value.argument == "text_device"
    with pytest.raises(HyvInputError, match="^.*CUDA is not available") as err:
        stages.generate(preset="tiny", prompt="x", output_dir=str(tmp_path / "g"), text_device="cuda")
    assert err.value.argument == "text_device" and not (tmp_path / "g").exists()


def test_stage1_records_its_device_and_seconds(tmp_path):
    stages.stage1(preset="tiny", prompt=PROMPT, output_dir=str(tmp_path))
    config = json.loads((tmp_path / "generation_config.json").read_text())
    assert config["stage1_device"] == "cpu"
    assert 0 < config["stage1_encode_time_s"] <= config["stage1_time_s"]


def test_stage1_on_a_gpu_moves_each_encoder_there_alone_and_drops_it(monkeypatch, tmp_path, components, frame):
    """stage1 with a (fake) GPU: Qwen, ByT5, SigLIP and the VAE each go to the card for their own call, one at a time,
    and the ones stage 1 loaded are dropped right after (meta: no copy back), the cache emptied after each; the file
    holds today's tensors, from the host; the device is recorded."""
    gpu = FakeGpu(monkeypatch)
    monkeypatch.setattr(stages, "resolve_text_device", lambda value, runtime=None: GPU)
    image_path = tmp_path / "frame.png"
    Image.new("RGB", (160, 90), (128, 128, 128)).save(image_path)
    stages.stage1(preset="tiny", prompt=PROMPT, negative_prompt=NEGATIVE, output_dir=str(tmp_path / "out"),
                  image_path=str(image_path), text_device="cuda:0")
    expected = []
    for name in (QWEN, BYT5, SIGLIP, VAE):
        expected += [(name, "cuda"), (name, "meta"), ("empty_cache", "")]
    assert gpu.moves() == expected
    assert gpu.on_gpu() == []
    config = json.loads((tmp_path / "out" / "generation_config.json").read_text())
    assert config["stage1_device"] == "cuda:0" and config["stage1_encode_time_s"] > 0

    # given components (the prompts file's): each goes back to the host instead, still one at a time
    gpu.events.clear()
    tensors = encode_pair(components, TINY, PROMPT, NEGATIVE, "fp32", frame, device=GPU)
    expected = []
    for name in (QWEN, BYT5, SIGLIP, VAE):
        expected += [(name, "cuda"), (name, "cpu"), ("empty_cache", "")]
    assert gpu.moves() == expected and gpu.on_gpu() == []
    assert all(next(components[n].parameters()).device.type == "cpu" for n in (*ENCODERS, "vae"))
    assert_bit_equal(tensors, todays_tensors(components, frame))


@pytest.mark.parametrize("offload", [None, "model"])
def test_the_pipeline_keeps_encoders_resident_only_without_offload(monkeypatch, offload):
    """VideoPipeline on a (fake) GPU: without offload the encoders move there once and stay (no move per video);
    with --offload model each visits the card for its call and is back on the host before the transformer denoises."""
    gpu = FakeGpu(monkeypatch)
    monkeypatch.setattr(denoiser, "local_device", lambda: torch.device("cpu"))  # the transformer and VAE: host
    monkeypatch.setattr(inference, "resolve_text_device", lambda value, runtime=None: GPU)
    on_gpu_while_denoising = []
    sample = denoiser.sample_latents

    def sample_latents(*args, **kwargs):
        on_gpu_while_denoising.append(gpu.on_gpu())
        return sample(*args, **kwargs)

    monkeypatch.setattr(denoiser, "sample_latents", sample_latents)
    components = build_tiny_components(TINY, names=COMPONENTS)
    pipe = VideoPipeline(TINY, components, offload=offload, text_device="cuda:0")
    resident = [(QWEN, "cuda"), (BYT5, "cuda")] if offload is None else []
    assert pipe.encoders_resident == (offload is None) and gpu.moves() == resident
    gpu.events.clear()
    videos = [pipe.generate(PROMPT, seed=1, video_length=1, num_inference_steps=1, progress=False) for _ in range(2)]
    if offload is None:
        assert gpu.moves() == [] and on_gpu_while_denoising == [sorted([QWEN, BYT5])] * 2
    else:
        per_video = [(QWEN, "cuda"), (QWEN, "cpu"), ("empty_cache", ""), (BYT5, "cuda"), (BYT5, "cpu"),
                     ("empty_cache", "")]
        assert gpu.moves() == per_video * 2 and on_gpu_while_denoising == [[]] * 2
    for video in videos:
        assert video.config["stage1_device"] == "cuda:0" and 0 < video.config["stage1_encode_time_s"]
    assert torch.equal(videos[0].latents, videos[1].latents)
