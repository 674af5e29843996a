"""HunyuanVideo as a model family: Llama + CLIP text, embedded guidance, one transformer call per flow-matching step."""

from __future__ import annotations

from ...base.errors import HyvInputError
from ..family import ModelFamily
from . import components as parts
from . import presets, recipe, text, training
from .adapter import HUNYUAN_VIDEO


class HunyuanVideoFamily(ModelFamily):
    """HunyuanVideo (Tencent, Dec 2024): the modules of :mod:`hyv_lib.models.hunyuan_video` behind the family
    interface. Text-to-video end to end; the latent-concat image-to-video checkpoint's preset, folder layout and
    denoising loop (given ``cond_latents``) are here, its first-frame stage 1 (LLaVA's image tokens) is not yet."""

    title = "HunyuanVideo"
    components = parts.COMPONENTS
    text_components = parts.TEXT_COMPONENTS
    text_names = recipe.TEXT_NAMES
    text_widths = {"prompt_embeds": "text_embed_dim", "pooled_prompt_embeds": "pooled_projection_dim"}

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

    def check_stage1(self, tensors, preset, path):
        recipe.check_stage1(tensors, preset, path)

    def training_inputs(self, preset, model_config, x0, noise, sigma, texts, images=None):
        return training.batch_inputs(preset, model_config, x0, noise, sigma, texts, images)

    def crop_image(self, preset, image):
        if "i2v" in preset.tasks:  # the latent-concat checkpoint: its loop is here, its first-frame encoders not yet
            raise HyvInputError("image_path", f"{preset.name}'s first-frame stage 1 (LLaVA's image tokens and the "
                                              "first frame's latents) is not built in hyv_lib yet")
        return super().crop_image(preset, image)

    def sample(self, step, transformer, scheduler_config, preset, embeds, settings, *, warmup=None, progress=True,
               device=None):
        return recipe.sample(step, transformer, scheduler_config, preset, embeds, settings, warmup=warmup,
                             progress=progress, device=device)


#: The registered instance (:data:`hyv_lib.models.families.FAMILIES`).
HUNYUAN_VIDEO_FAMILY = HunyuanVideoFamily(HUNYUAN_VIDEO, presets.PRESETS)
