"""The interface of a model family: what the pipeline, training and planner call for one model beyond its transformer.

A family lives in its own folder under ``hyv_lib/models/`` (``hunyuan_video15/``, ``cogvideox/``) and holds all that
is that model's: the :class:`~hyv_lib.models.adapter.ModelAdapter` that runs its transformer piece by piece, its
attention processors, its text and image conditioning (stage 1), its denoising recipe (stage 2) and the layout its
VAE decodes (stage 3). :func:`hyv_lib.models.families.family_for` finds a preset's family by the preset's ``model``;
the layers above call these methods and never name a model. Its presets come with it. Adding a model is a new folder
and one registry line.

The stage functions hand the family what lives in the layers above it: the denoising ``step`` (a runtime's callable)
and how many untimed ``warmup`` calls it wants for a program (the compiled runtime's count).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from ..base.errors import HyvInputError
from ..base.presets import Preset
from .adapter import ModelAdapter

#: The pipeline's ``warmup`` argument: the number of untimed calls before the first step for a program keyed by
#: (latent shape, batch, dtype, device).
Warmup = Callable[[tuple], int]


class ModelFamily:
    """One model's recipe around its transformer (subclass it; one instance per family, in the registry)."""

    #: The preset's ``model`` value this family runs (the adapter's name).
    name: str = ""
    #: Whether the checkpoint can take a first frame (image-to-video): :meth:`crop_image` and :meth:`encode_image`.
    takes_image: bool = False
    #: The components :meth:`encode_image` needs.
    image_components: tuple[str, ...] = ()
    #: Whether the prompt's text encoder reads the first frame too (an image-text model's image tokens in the
    #: prompt): :meth:`encode_texts` is then handed ``images``, one per prompt, for an image-to-video run.
    texts_read_image: bool = False
    #: The model's name in messages ("HunyuanVideo-1.5").
    title: str = ""
    #: The component names of the model's diffusers pipeline folder (model_index.json), image-to-video's aside.
    components: tuple[str, ...] = ()
    #: Stage 1's text encoders and tokenizers.
    text_components: tuple[str, ...] = ()
    #: What image-to-video adds to a folder (a first frame's encoder and processor): loaded only for presets that
    #: take an image; a tiny folder without them gets them built in code.
    first_frame_components: tuple[str, ...] = ()
    #: The stage-1 text tensors a feature folder keeps for each clip and for the empty prompt (training's text).
    text_names: tuple[str, ...] = ()
    #: What image-to-video adds to a clip's features (its first frame's conditions).
    image_names: tuple[str, ...] = ()
    #: Text tensors whose last axis must equal a transformer config value: name -> config key (training's check).
    text_widths: dict[str, str] = {}

    def __init__(self, adapter: ModelAdapter, presets: tuple[Preset, ...] = ()):
        self.adapter = adapter
        self.name = adapter.name
        #: The family's presets (``model`` is its name): :data:`hyv_lib.models.families.PRESETS` lists them.
        self.presets = tuple(presets)

    # ------------------------------------------------------------------------------------------ components
    def pipeline_components(self, preset: Preset) -> tuple[str, ...]:
        """What stages 1-3 load for ``preset``: the text encoders, the DiT and its scheduler, the VAE, and the first
        frame's encoders when the preset takes an image."""
        return (*self.text_components, "transformer", "scheduler", "vae",
                *(self.first_frame_components if "i2v" in preset.tasks else ()))

    def build_tiny(self, preset: Preset, seed: int = 0, names: list[str] | None = None) -> dict[str, Any]:
        """The requested components (None: every one of :attr:`components`) of the tiny ``preset``, built in code
        with weights that depend on ``seed`` only, networks in eval mode without gradients
        (:func:`hyv_lib.models.components.build_tiny_components` checks the preset is tiny first)."""
        raise NotImplementedError

    def component_class(self, name: str, model_path: str):
        """The class whose ``from_pretrained(model_path, subfolder=name)`` loads component ``name``; HyvInputError
        naming ``preset`` for a name the model has none of."""
        raise NotImplementedError

    def save_tiny_pipeline(self, path: str, preset: Preset, seed: int = 0) -> None:
        """Write a diffusers-format folder of tiny components: the tiny ``preset``'s, or for a real one its layout at
        tiny widths (what ``--preset NAME --model_path`` loads like real weights)."""
        raise NotImplementedError

    # ------------------------------------------------------------------------------------------ stage 1
    def encode_texts(self, components: dict[str, Any], preset: Preset, prompts: list[str],
                     device: torch.device | None = None, release: bool = False) -> dict[str, torch.Tensor]:
        """The stage-1 text tensors of a batch of ``prompts`` (batch first; no ``negative_`` names), by the model's
        own pipeline recipe. ``device`` (None: each encoder where it is, the tensors too): each encoder runs there for
        its own call and leaves it after (:func:`hyv_lib.models.devices.on_device`; ``release`` drops the weights of
        encoders loaded for this call); the tensors come back on the host CPU. A family whose :attr:`texts_read_image`
        also takes ``images=`` in an image-to-video run: each prompt's first frame, already :meth:`crop_image`-ed,
        None for a prompt read without one (the negative prompt)."""
        raise NotImplementedError

    def tokens_cut(self, components: dict[str, Any], preset: Preset,
                   prompts: dict[str, str]) -> dict[str, tuple[int, int, int, str]]:
        """For each ``prompts`` key (``prompt``, ``negative_prompt``) and each encoder that reads it:
        ``{key}_..._tokens_dropped`` -> (tokens dropped, the text's own tokens, what the encoder reads, its name)."""
        raise NotImplementedError

    def crop_frame(self, preset: Preset, image):
        """A training clip's frame (a PIL image) resized to cover its bucket (:meth:`Preset.image_bucket`) and
        centre-cropped to it, for every family (text-to-video ones too): diffusers' ``VideoProcessor.resize`` with
        ``resize_mode="crop"``, as the image-to-video pipelines crop a first frame."""
        from diffusers.video_processor import VideoProcessor

        height, width = preset.image_bucket(*image.size)
        processor = VideoProcessor(vae_scale_factor=preset.spatial_compression, do_resize=False)
        return processor.resize(image.convert("RGB"), height=height, width=width, resize_mode="crop")

    def crop_image(self, preset: Preset, image):
        """A first frame resized and centre-cropped to its bucket, as the model's image-to-video pipeline does."""
        raise HyvInputError("image", f"{preset.name} is text-to-video: it takes no image")

    def encode_image(self, components: dict[str, Any], preset: Preset, image, device: torch.device | None = None,
                     release: bool = False, dtype: str | None = None) -> dict[str, torch.Tensor]:
        """The stage-1 tensors of a first frame already :meth:`crop_image`-ed, on the host CPU; ``dtype`` (None: the
        encoder's) is the embeddings', the latents stay fp32. ``device`` and ``release`` as in :meth:`encode_texts`."""
        raise HyvInputError("image", f"{preset.name} is text-to-video: it takes no image")

    def check_stage1(self, tensors: dict[str, torch.Tensor], preset: Preset, path: str) -> None:
        """HyvInputError naming ``input_dir`` unless ``tensors`` (read from ``path``) are a stage-1 file of this
        model: the names, ranks, dtypes and shapes its stage 1 writes, every value finite."""
        raise NotImplementedError

    # ------------------------------------------------------------------------------------------ stage 2
    def sample(self, step: Callable[..., torch.Tensor], transformer, scheduler_config, preset: Preset,
               embeds: dict[str, torch.Tensor], settings, *, warmup: Warmup | None = None, progress: bool = True,
               device: torch.device | None = None) -> torch.Tensor:
        """Stage 2's work without files: seeded noise denoised by ``step`` with guidance, conditioned on the stage-1
        tensors ``embeds``, with resolved ``settings`` (:class:`hyv_lib.pipeline.settings.Stage2Settings`); fp32
        latents on the CPU, in :meth:`hyv_lib.base.presets.Preset.denoising_shape`'s layout. ``warmup`` (None: the
        settings' ``warmup_steps``) says how many untimed calls go first."""
        raise NotImplementedError

    # ------------------------------------------------------------------------------------------ training
    def training_inputs(self, preset: Preset, model_config, x0: torch.Tensor, noise: torch.Tensor,
                        sigma: torch.Tensor, texts: dict[str, torch.Tensor],
                        images: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """A train step's batch: the transformer's keyword arguments (``hidden_states``, ``timestep`` and the
        conditioning) and ``target``, the flow-matching velocity ``noise - x0``, for clean latents ``x0``
        [B, C, T, h, w], ``noise`` and the noise levels ``sigma`` [B], with the stacked :attr:`text_names` tensors
        ``texts`` and, for image-to-video, the :attr:`image_names` ones ``images``. ``model_config``: the
        transformer's config. HyvInputError naming ``preset`` for a model hyv_lib does not fine-tune."""
        raise HyvInputError("preset", f"{preset.name}: hyv_lib does not fine-tune {self.title or self.name} (no "
                                      "training recipe in its model family)")

    # ------------------------------------------------------------------------------------------ stage 3
    def vae_latents(self, preset: Preset, latents: torch.Tensor, video_length: Any) -> torch.Tensor:
        """The stage-2 latents as the VAE decodes them, [1, C, T, h, w]: unchanged by default. HyvInputError naming
        ``--input_dir`` when the latents do not fit ``video_length``."""
        return latents

    def video_frames(self, preset: Preset, frames: torch.Tensor) -> torch.Tensor:
        """The decoded uint8 frames [F, H, W, 3] the video keeps, as the model's pipeline returns them: all of them
        by default."""
        return frames


def warmup_count(warmup: Warmup | None, settings, key: tuple) -> int:
    """The number of untimed warmup calls for the program keyed by ``key``: ``warmup(key)``, or the settings' own
    ``warmup_steps`` (0 when unset) without a ``warmup``."""
    if warmup is not None:
        return warmup(key)
    return int(getattr(settings, "warmup_steps", None) or 0)


def initial_latents(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Gaussian starting latents from a CPU generator: the same seed gives the same bits anywhere."""
    return torch.randn(shape, generator=torch.Generator("cpu").manual_seed(seed), dtype=torch.float32)
