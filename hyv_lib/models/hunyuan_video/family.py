"""HunyuanVideo as a model family: Llama (LLaVA) + CLIP text, embedded guidance, one transformer call a step."""

from __future__ import annotations

from ..family import ModelFamily
from . import components as parts
from . import first_frame, presets, recipe, text, training
from .adapter import HUNYUAN_VIDEO


class HunyuanVideoFamily(ModelFamily):
    """HunyuanVideo (Tencent, Dec 2024): the modules of :mod:`hyv_lib.models.hunyuan_video` behind the family
    interface. Text-to-video, and the latent-concat image-to-video checkpoint, whose LLaVA reads the first frame with
    the prompt (:attr:`texts_read_image`) and whose loop takes the frame's VAE latents (``cond_latents``), as
    HunyuanVideoImageToVideoPipeline does. Training: both, the image-to-video checkpoint on its 33 input channels
    (:func:`hyv_lib.models.hunyuan_video.training.batch_inputs`)."""

    title = "HunyuanVideo"
    takes_image = True
    texts_read_image = True
    image_components = (*parts.FIRST_FRAME_COMPONENTS, "vae")
    components = parts.COMPONENTS
    text_components = parts.TEXT_COMPONENTS
    first_frame_components = parts.FIRST_FRAME_COMPONENTS
    text_names = recipe.TEXT_NAMES
    image_names = recipe.IMAGE_NAMES
    text_widths = {"prompt_embeds": "text_embed_dim", "pooled_prompt_embeds": "pooled_projection_dim"}

    def build_tiny(self, preset, seed=0, names=None):
        return parts.build_tiny(preset, seed, names)

    def component_class(self, name, model_path):
        return parts.component_class(name, model_path)

    def save_tiny_pipeline(self, path, preset, seed=0):
        parts.save_tiny(path, preset, seed)

    def encode_texts(self, components, preset, prompts, device=None, release=False, images=None):
        if "i2v" in preset.tasks:  # LLaVA reads each prompt with its first frame
            return first_frame.encode_prompts(components, preset, prompts, images, device=device, release=release)
        return text.encode_prompts(components, preset, prompts, device=device, release=release)

    def tokens_cut(self, components, preset, prompts):
        if "i2v" in preset.tasks:
            return first_frame.prompt_cuts(components, preset, prompts)
        return text.prompt_cuts(components, preset, prompts)

    def check_stage1(self, tensors, preset, path):
        recipe.check_stage1(tensors, preset, path)

    def training_inputs(self, preset, model_config, x0, noise, sigma, texts, images=None):
        return training.batch_inputs(preset, model_config, x0, noise, sigma, texts, images)

    def crop_image(self, preset, image):
        if "i2v" not in preset.tasks:
            return super().crop_image(preset, image)
        return self.crop_frame(preset, image)  # to its bucket; the pipeline then resizes to that size: a no-op

    def encode_image(self, components, preset, image, device=None, release=False, dtype=None):
        if "i2v" not in preset.tasks:
            return super().encode_image(components, preset, image, device=device, release=release, dtype=dtype)
        return first_frame.encode_image(components, preset, image, device=device, release=release)

    def video_frames(self, preset, frames):
        return recipe.video_frames(preset, frames)

    def sample(self, step, transformer, scheduler_config, preset, embeds, settings, *, warmup=None, progress=True,
               device=None):
        return recipe.sample(step, transformer, scheduler_config, preset, embeds, settings, warmup=warmup,
                             progress=progress, device=device)


#: The registered instance (:data:`hyv_lib.models.families.FAMILIES`).
HUNYUAN_VIDEO_FAMILY = HunyuanVideoFamily(HUNYUAN_VIDEO, presets.PRESETS)
