"""HunyuanVideo-1.5 as a model family: Qwen2.5-VL + ByT5 text, a SigLIP + VAE first frame, the flow-matching CFG loop."""

from __future__ import annotations

from ..family import ModelFamily
from . import components as parts
from . import image as first_frame
from . import presets, sampling, stage1, text, training
from .adapter import HUNYUAN_VIDEO_15


class HunyuanVideo15Family(ModelFamily):
    """HunyuanVideo-1.5 (text- and image-to-video): the modules of :mod:`hyv_lib.models.hunyuan_video15` behind the
    family interface."""

    takes_image = True
    image_components = (*first_frame.IMAGE_COMPONENTS, "vae")
    title = "HunyuanVideo-1.5"
    components = parts.COMPONENTS
    text_components = parts.TEXT_COMPONENTS
    first_frame_components = first_frame.IMAGE_COMPONENTS
    text_names = training.TEXT_NAMES
    image_names = training.IMAGE_NAMES
    text_widths = {"prompt_embeds": "text_embed_dim", "prompt_embeds_2": "text_embed_2_dim"}

    def build_tiny(self, preset, seed=0, names=None):
        return parts.build_tiny(preset, seed, names)

    def component_class(self, name, model_path):
        return parts.component_class(name)

    def save_tiny_pipeline(self, path, preset, seed=0):
        parts.save_tiny(path, preset, seed)

    def encode_texts(self, components, preset, prompts, device=None, release=False):
        return text.encode_prompts(components, preset, prompts, device=device, release=release)

    def tokens_cut(self, components, preset, prompts):
        return text.prompt_cuts(components, preset, prompts)

    def training_inputs(self, preset, model_config, x0, noise, sigma, texts, images=None):
        return training.batch_inputs(preset, model_config, x0, noise, sigma, texts, images)

    def crop_image(self, preset, image):
        return first_frame.crop_to_bucket(preset, image)

    def crop_frame(self, preset, image):
        return first_frame.crop_to_bucket(preset, image)

    def encode_image(self, components, preset, image, device=None, release=False, dtype=None):
        return first_frame.encode_image(components, preset, image, device=device, release=release, dtype=dtype)

    def check_stage1(self, tensors, preset, path):
        stage1.check_stage1(tensors, path)

    def sample(self, step, transformer, scheduler_config, preset, embeds, settings, *, warmup=None, progress=True,
               device=None):
        return sampling.sample(step, transformer, scheduler_config, preset, embeds, settings, warmup=warmup,
                               progress=progress, device=device)


#: The registered instance (:data:`hyv_lib.models.families.FAMILIES`).
HUNYUAN_VIDEO_15_FAMILY = HunyuanVideo15Family(HUNYUAN_VIDEO_15, presets.PRESETS)
