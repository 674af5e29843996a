"""HunyuanVideo-1.5's first frame (image-to-video): cropped to its bucket and encoded as its I2V pipeline does it."""

from __future__ import annotations

from typing import Any

import torch

from ...base.presets import Preset
from ..devices import module_device, on_device
from ..dtypes import torch_dtype
from ..quiet import errors_only

#: What image-to-video adds (``HunyuanVideo15ImageToVideoPipeline``): SigLIP and its image processor.
IMAGE_COMPONENTS = ("image_encoder", "feature_extractor")


def crop_to_bucket(preset: Preset, image):
    """The image resized to cover its bucket (Lanczos) and centre-cropped to it, as diffusers' I2V pipeline does
    (its video processor's ``resize(..., resize_mode="crop")``)."""
    height, width = preset.image_bucket(*image.size)
    return _video_processor(preset).resize(image, height=height, width=width, resize_mode="crop")


def _video_processor(preset: Preset):
    from diffusers.pipelines.hunyuan_video1_5.image_processor import HunyuanVideo15ImageProcessor

    # The I2V pipeline's own settings (no second resize: the image is already at the bucket).
    return HunyuanVideo15ImageProcessor(vae_scale_factor=preset.spatial_compression, do_resize=False,
                                        do_convert_rgb=True)


@torch.no_grad()
def encode_image(components: dict[str, Any], preset: Preset, image, device: torch.device | None = None,
                 release: bool = False, dtype: str | None = None) -> dict[str, torch.Tensor]:
    """The stage-1 tensors of a first frame (already :func:`crop_to_bucket`-ed), on the host CPU: ``image_embeds``
    [1, N, D] (SigLIP's last hidden state, in ``dtype``; None: SigLIP's) and ``cond_latents`` [1, C, 1, h, w] (the
    VAE's latent mode times its scaling factor, fp32).

    Calls diffusers' I2V pipeline's own two encoders (static methods, diffusers 0.42 pinned) rather than a copy, so
    the conditioning is the pipeline's by construction; tests compare the whole stage 1 + 2 with the pipeline.
    ``device`` (None: each where it is): SigLIP, then the VAE, each moved there for its call and off it after
    (:func:`hyv_lib.models.devices.on_device`; ``release``: dropped instead of moved back).
    """
    I2V = i2v_pipeline_class()
    encoder, vae = components["image_encoder"], components["vae"]
    with on_device(encoder, device, release):
        image_embeds = I2V._get_image_embeds(encoder, components["feature_extractor"], image,
                                             module_device(encoder)).cpu()
    height, width = image.size[1], image.size[0]
    with on_device(vae, device, release):
        cond_latents = I2V._get_image_latents(vae, _video_processor(preset), image, height, width,
                                              module_device(vae)).float().cpu()
    if dtype is not None:
        image_embeds = image_embeds.to(torch_dtype(dtype))
    return {"image_embeds": image_embeds, "cond_latents": cond_latents}


def i2v_pipeline_class():
    """diffusers' ``HunyuanVideo15ImageToVideoPipeline``, imported without transformers' one-time notice that
    ``SiglipImageProcessor`` falls back to the PIL class when torchvision is missing (we use that class on purpose:
    :func:`hyv_lib.models.hunyuan_video15.components.image_processor`)."""
    with errors_only("transformers.utils.import_utils"):
        from diffusers import HunyuanVideo15ImageToVideoPipeline
    return HunyuanVideo15ImageToVideoPipeline
