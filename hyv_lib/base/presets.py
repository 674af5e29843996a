"""What a preset is (the shapes and defaults of one checkpoint) and the size rules every preset follows."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from .errors import HyvInputError
from .sizes import (  # noqa: F401 (also importable from here)
    MAX_ASPECT_RATIO,
    beyond_buckets,
    bucket_for,
    bucket_size,
    default_size,
    parse_aspect_ratio,
    video_size,
)

#: What a preset's checkpoint generates from: text alone (t2v) or a text and a first frame (i2v).
TASKS = ("t2v", "i2v")


def samples_per_step(guidance_scale: float, embedded: bool = False) -> int:
    """Samples the DiT runs per denoising step: classifier-free guidance's pair (negative and positive prompt) as one
    batch of 2, or one sample when ``guidance_scale`` is 1 (CFG off, as diffusers' guider skips the negative pass: the
    CFG-distilled and step-distilled checkpoints) or the guidance is ``embedded`` (an input of a guidance-distilled
    DiT, :attr:`Preset.guidance_embedded`). The one rule the sampling loop, the planner and the TPU compile path
    share."""
    return 1 if embedded or guidance_scale == 1.0 else 2


def check_data_axis(mesh: Any, batch: int, argument: str = "mesh") -> None:
    """HyvInputError naming ``argument`` unless the ``data`` axis of ``mesh`` (a dict of data/tensor/sequence sizes)
    divides the ``batch`` of one step (:func:`samples_per_step`): a data axis splits whole samples. With CFG off
    (batch 1) any data axis has nothing to split, so the message says it is of no use and where to put its devices."""
    data = int(mesh.get("data", 1))
    if batch % data == 0:
        return
    if batch == 1:
        sequence = int(mesh.get("sequence", 1))
        layout = f"tensor={data * int(mesh.get('tensor', 1))}" + (f",sequence={sequence}" if sequence > 1 else "")
        raise HyvInputError(argument, f"data={data} is of no use with CFG off (guidance_scale 1, as the CFG-distilled "
                                      f"and step-distilled presets run): each step runs one sample, so a data axis has "
                                      f"nothing to split; put its devices on tensor instead ({layout})")
    raise HyvInputError(argument, f"data={data} does not divide the batch of {batch} "
                                  f"({'the CFG pair' if batch == 2 else 'samples per step'}: a data axis splits whole "
                                  f"samples)")


@dataclass(frozen=True)
class Preset:
    """Everything that fixes shapes and defaults for one model variant.

    Real presets describe checkpoints loaded with ``from_pretrained`` from a diffusers-format folder;
    the tiny preset builds the same diffusers/transformers classes with small configs in code.
    """

    name: str
    description: str
    is_tiny: bool
    hub_id: str | None
    text_len: int  # MLLM tokens after cropping the chat template
    text_dim: int
    byt5_len: int
    byt5_dim: int
    image_tokens: int  # SigLIP tokens (zeros for t2v)
    image_dim: int
    latent_channels: int
    spatial_compression: int
    temporal_compression: int
    target_size: int  # pixel "base size" of the aspect-ratio buckets
    default_video_length: int
    default_steps: int
    flow_shift: float
    guidance_scale: float
    fps: int
    default_dtype: str
    crop_start: int | None  # template tokens to drop; None = compute from the tokenizer
    transformer: dict[str, Any] = field(default_factory=dict)
    vae: dict[str, Any] = field(default_factory=dict)
    text_encoder: dict[str, Any] | None = None  # tiny only: Qwen2.5-VL text config kwargs
    text_encoder_2: dict[str, Any] | None = None  # tiny only: T5 (ByT5) encoder config kwargs
    bundled_weights: str | None = None  # a diffusers-format folder inside hyv_lib/weights used without --model_path
    bundled_subfolders: dict[str, str] = field(default_factory=dict)  # component -> its folder there, if not its name
    word_tokens: bool = False  # tiny only: the tokenizer has a token per caption word (models.hunyuan_video15.components.build_tiny_tokenizer)
    tasks: tuple[str, ...] = ("t2v",)  # what the checkpoint was trained for: ("t2v",), ("i2v",) or both
    image_encoder: dict[str, Any] | None = None  # tiny only: SigLIP vision config kwargs (image-to-video)
    model: str = ""  # the model family (hyv_lib.models.families) that runs it: its adapter's name
    attention: str = "auto"  # the default --attention: "ssta" for the sparse checkpoints (trained with SSTA)
    frames_first: bool = False  # the denoising latents are [1, T', C, h, w], T' padded to the temporal patch
    text_masks: bool = True  # stage 1 writes masks beside the embeddings (False: every text token is attended)
    guidance_embedded: bool = False  # guidance-distilled: the scale is an input of the DiT, one sample per step
    # train's settings measured for this checkpoint (learning_rate, batch_size, lr_schedule, lora_targets), used
    # where a run gives none; empty: the official trainer's (hyv_lib.training.run_settings.DEFAULTS)
    train_defaults: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Every field, JSON-ready: stage 1 records a custom preset this way so that stages 2 and 3 rebuild it."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, fields: dict[str, Any]) -> "Preset":
        """The preset of :meth:`to_dict` (after a JSON round trip: lists become the tuples they were)."""
        return cls(**{**fields, "tasks": tuple(fields.get("tasks", ("t2v",)))})

    @property
    def samples_per_step(self) -> int:
        """The DiT's batch per denoising step at the preset's own guidance (:func:`samples_per_step`): 2 with CFG, 1
        for the CFG-distilled and step-distilled checkpoints (guidance 1.0) and a guidance-distilled DiT."""
        return samples_per_step(self.guidance_scale, self.guidance_embedded)

    @property
    def use_meanflow(self) -> bool:
        """The step-distilled (MeanFlow) variant: each step also gets the next timestep (``timestep_r``)."""
        return bool(self.transformer.get("use_meanflow", False))

    @property
    def bundled_path(self) -> str | None:
        """Absolute path of the bundled weights folder, or None when the preset builds random weights."""
        if self.bundled_weights is None:
            return None
        import os

        return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "weights", self.bundled_weights)

    def bundled_subfolder(self, name: str) -> str:
        """The subfolder of :attr:`bundled_path` that holds component ``name``: its name, unless the preset maps it
        (``tiny_trained_720p`` shares hyv-tiny's text encoders and keeps its own transformer and VAE beside them)."""
        return self.bundled_subfolders.get(name, name)

    @property
    def default_height(self) -> int:
        return default_size(self)[0]

    @property
    def default_width(self) -> int:
        return default_size(self)[1]

    def image_bucket(self, width: int, height: int) -> tuple[int, int]:
        """(height, width) of the bucket a ``width`` x ``height`` first frame is resized and cropped to, as diffusers'
        image-to-video pipelines pick it: the nearest ratio among the buckets in whole latent patches
        (:attr:`pixel_stride`, :func:`hyv_lib.base.sizes.bucket_for`)."""
        return bucket_for(self.target_size, self.pixel_stride, width, height)

    def latent_shape(self, height: int, width: int, video_length: int) -> tuple[int, int, int, int, int]:
        """Shape of ``latents`` in stage2_latents.safetensors for a video of this size (HyvInputError naming the
        argument for a size the VAE cannot take: height and width positive multiples of the spatial compression,
        video_length = 4n+1)."""
        for name, value in (("height", height), ("width", width), ("video_length", video_length)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise HyvInputError(name, f"must be a positive integer, got {value!r}")
        for name, value in (("height", height), ("width", width)):
            if value % self.spatial_compression:
                raise HyvInputError(name, f"must be a multiple of {self.spatial_compression}, got {value}")
        if (video_length - 1) % self.temporal_compression:
            raise HyvInputError("video_length", f"must be {self.temporal_compression}n+1 (e.g. 9, 33, 121), "
                                                f"got {video_length}")
        return (
            1,
            self.latent_channels,
            (video_length - 1) // self.temporal_compression + 1,
            height // self.spatial_compression,
            width // self.spatial_compression,
        )

    @property
    def pixel_stride(self) -> int:
        """Height and width are multiples of this: the VAE's spatial compression times the transformer's patch (16
        for HunyuanVideo-1.5's 16x VAE and 1 x 1 patches, 16 for CogVideoX1.5's 8x VAE and 2 x 2 patches)."""
        return self.spatial_compression * int(self.transformer.get("patch_size", 1) or 1)

    def denoising_shape(self, height: int, width: int, video_length: int) -> tuple[int, ...]:
        """Shape of the latents the denoising loop runs on, which stage2_latents.safetensors holds: HunyuanVideo-1.5's
        :meth:`latent_shape` [1, C, T, h, w]; CogVideoX1.5's [1, T', C, h, w], frames before channels, with T' the
        latent frames padded up to a multiple of the temporal patch as CogVideoXPipeline pads them (81 frames: 21
        latent frames -> 22; the decode drops the first T' - T)."""
        shape = self.latent_shape(height, width, video_length)
        if not self.frames_first:
            return shape
        _, channels, frames, h, w = shape
        patch_t = int(self.transformer.get("patch_size_t") or 1)
        return (1, -(-frames // patch_t) * patch_t, channels, h, w)

    def stage1_shapes(self, image_size: tuple[int, int] | None = None) -> dict[str, tuple[int, ...]]:
        """Name -> shape of the tensors in stage1_embeddings.safetensors: the 8 text tensors, and with ``image_size``
        (the first frame's bucket as (height, width): image to video) also ``image_embeds`` [1, image_tokens,
        image_dim] (SigLIP's tokens) and ``cond_latents`` [1, latent_channels, 1, height / 16, width / 16] (the
        frame's VAE latents; 16 = the spatial compression). CogVideoX1.5: T5's ``prompt_embeds`` and
        ``negative_prompt_embeds`` [1, text_len, text_dim] only (no masks: every token is attended; no image)."""
        if not self.text_masks:
            if image_size is not None:
                raise HyvInputError("image_path", f"{self.name} is text-to-video: it takes no image")
            return {name: (1, self.text_len, self.text_dim) for name in ("prompt_embeds", "negative_prompt_embeds")}
        shapes = {
            "prompt_embeds": (1, self.text_len, self.text_dim),
            "prompt_embeds_mask": (1, self.text_len),
            "prompt_embeds_2": (1, self.byt5_len, self.byt5_dim),
            "prompt_embeds_mask_2": (1, self.byt5_len),
        }
        shapes = {**shapes, **{f"negative_{k}": v for k, v in shapes.items()}}
        if image_size is not None:
            height, width = image_size
            latent = self.latent_shape(height, width, 1)  # checks the size; one frame -> one latent frame
            shapes.update(image_embeds=(1, self.image_tokens, self.image_dim), cond_latents=latent)
        return shapes

    def to_json(self) -> dict[str, Any]:
        """The preset as plain JSON-able data (what ``python -m hyv_lib info --json`` prints)."""
        data = dataclasses.asdict(self)
        data["default_height"] = self.default_height
        data["default_width"] = self.default_width
        data["samples_per_step"] = self.samples_per_step  # 1 with CFG off: a data mesh axis has nothing to split
        data["pixel_stride"] = self.pixel_stride
        data["denoising_shape"] = list(self.denoising_shape(self.default_height, self.default_width,
                                                            self.default_video_length))  # stage 2's latents
        return data


#: The words of hyv-tiny's captions (frozen: its word tokenizer was trained on every caption of these lists, so a
#: new word would renumber the tokens the shipped DiT learned to read). Kept here, not derived from the training
#: data module: the tokenizer is part of the model. tests/test_data.py checks the dataset's words are these.
TINY_CAPTION_WORDS = {
    "color": ("red", "green", "blue", "yellow", "white", "cyan"),
    "shape": ("circle", "square", "triangle"),
    "direction": ("left", "right", "up", "down"),
    "background": ("black", "gray", "purple"),
}


def tiny_tokenizer_captions() -> list[str]:
    """Every caption hyv-tiny's word tokenizer was trained on, in the training order."""
    words = TINY_CAPTION_WORDS
    return [f"a {c} {s} moving {d} on a {b} background" for c in words["color"] for s in words["shape"]
            for d in words["direction"] for b in words["background"]]


def tiny_vocabulary() -> list[str]:
    """The words hyv-tiny knows, each one token. Any other word (e.g. "dark") is split into sub-word tokens it
    never saw in training: the prompt still runs, but the video follows it less or not at all."""
    return sorted({word for caption in tiny_tokenizer_captions() for word in caption.split()})


#: The seed of the initial noise when none is given, everywhere (the staged scripts' default).
DEFAULT_SEED = 42
