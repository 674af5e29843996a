"""Build the tiny components in code, or load real ones from a diffusers-format folder; save a pipeline folder; cut
a copy of a transformer to its first blocks."""

from __future__ import annotations

import contextlib
import copy
import logging
import json
import os
import re
from typing import Any, Iterable

import torch
from safetensors import SafetensorError, safe_open

from ..base.errors import HyvInputError
from ..base.presets import Preset, tiny_tokenizer_captions
from .cogvideox.presets import MODEL as COGVIDEOX_MODEL
from .dtypes import torch_dtype
from .families import get_preset
from .folder import LAYOUT_NOTE
from .hunyuan_video15.image import IMAGE_COMPONENTS, i2v_pipeline_class
from .hunyuan_video15.presets import real_layout_tiny, siglip_image_size
from .quiet import errors_only
from .cogvideox.components import (
    COGVIDEOX_COMPONENTS,
    COGVIDEOX_TEXT_COMPONENTS,
    build_tiny_cogvideox,
    cogvideox_loader,
    save_cogvideox_pipeline,
)

logger = logging.getLogger(__name__)

#: Component names of a diffusers ``HunyuanVideo15Pipeline`` folder (model_index.json).
COMPONENTS = ("text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2", "transformer", "vae", "scheduler", "guider")

#: The two text encoders and their tokenizers (stage 1).
TEXT_COMPONENTS = ("tokenizer", "text_encoder", "tokenizer_2", "text_encoder_2")
#: What stages 1-3 load (the text encoders, the DiT and its scheduler, the VAE).
PIPELINE_COMPONENTS = (*TEXT_COMPONENTS, "transformer", "scheduler", "vae")


def text_components(preset: Preset) -> tuple[str, ...]:
    """What stage 1 loads for ``preset``: HunyuanVideo-1.5's two text encoders and tokenizers, CogVideoX's T5."""
    return COGVIDEOX_TEXT_COMPONENTS if preset.model == COGVIDEOX_MODEL else TEXT_COMPONENTS


def pipeline_components(preset: Preset) -> tuple[str, ...]:
    """What stages 1-3 load for ``preset`` (text encoders, the DiT and its scheduler, the VAE; image-to-video's SigLIP
    for a preset that takes only an image)."""
    if preset.model == COGVIDEOX_MODEL:
        return COGVIDEOX_COMPONENTS
    return PIPELINE_COMPONENTS + (IMAGE_COMPONENTS if "i2v" in preset.tasks else ())


# The tiny MLLM tokenizer uses the ChatML layout of Qwen2.5-VL's chat template (system, user, then the
# assistant generation prompt), so diffusers' template + crop recipe runs on it unchanged.
TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@contextlib.contextmanager
def quiet_loading():
    """Silence diffusers' and transformers' weight-loading progress bars, and restore both settings after."""
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    modules = (diffusers_logging, transformers_logging)
    were_enabled = [module.is_progress_bar_enabled() for module in modules]
    for module in modules:
        module.disable_progress_bar()
    try:
        yield
    finally:
        for module, enabled in zip(modules, were_enabled):
            if enabled:
                module.enable_progress_bar()


def build_tiny_tokenizer(word_tokens: bool = False):
    """An offline byte-level Qwen2 tokenizer: 256 byte tokens + the ChatML special tokens, no merges.

    The real Qwen2.5-VL tokenizer needs a download; a merge-free byte-level BPE (built with the
    ``tokenizers`` library) covers any text, never emits an unknown token and round-trips through
    ``save_pretrained``/``from_pretrained`` as a Qwen2Tokenizer.

    ``word_tokens`` (hyv-tiny): BPE merges trained with ``tokenizers``' BpeTrainer on the procedural captions
    (``hyv_lib.tiny.data``), split at word boundaries as GPT-2/Qwen do, so every caption word is one token, as in
    the real tokenizer. Byte by byte, a caption was ~60 tokens and a colour word of another length shifted every
    later token; the DiT trained on that never learned colour or direction from the text (found while training
    hyv-tiny).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import Qwen2TokenizerFast

    if word_tokens:
        backend = Tokenizer(models.BPE())
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        # Frozen: the vocabulary hyv-tiny was trained with. A new word would renumber the tokens, and with them
        # the rows of the random text-encoder embedding that the shipped DiT learned to read.
        captions = tiny_tokenizer_captions()
        # A vocabulary larger than the merges can fill: training stops when every word is one token.
        trainer = trainers.BpeTrainer(vocab_size=4096, min_frequency=1, show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        backend.train_from_iterator(captions, trainer=trainer)
    else:
        vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
        backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = Qwen2TokenizerFast(
        tokenizer_object=backend, unk_token=None, bos_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    tokenizer.chat_template = TINY_CHAT_TEMPLATE
    return tokenizer


def _seeded(seed: int, build):
    # fork_rng keeps the caller's global RNG untouched while making the weights depend on `seed` only.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def build_tiny_components(preset: Preset, seed: int = 0, names: Iterable[str] | None = None) -> dict[str, Any]:
    """Build the requested tiny components (None: every one of the preset's model) with seeded random weights (fp32,
    eval mode); CogVideoX's are :func:`hyv_lib.models.cogvideox.components.build_tiny_cogvideox`'s."""
    from diffusers import AutoencoderKLHunyuanVideo15, FlowMatchEulerDiscreteScheduler, HunyuanVideo15Transformer3DModel
    from diffusers.guiders import ClassifierFreeGuidance
    from transformers import ByT5Tokenizer, Qwen2_5_VLTextModel, T5Config, T5EncoderModel
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLTextConfig

    if not preset.is_tiny:
        raise HyvInputError("--preset", f"{preset.name} is a real preset: its weights load from --model_path")
    if preset.model == COGVIDEOX_MODEL:
        return build_tiny_cogvideox(preset, seed, COGVIDEOX_COMPONENTS if names is None else names)
    names = set(COMPONENTS if names is None else names)
    out: dict[str, Any] = {}
    tokenizer = build_tiny_tokenizer(preset.word_tokens)
    if "tokenizer" in names:
        out["tokenizer"] = tokenizer
    if "text_encoder" in names:
        config = Qwen2_5_VLTextConfig(
            vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
            eos_token_id=tokenizer.eos_token_id, **preset.text_encoder,
        )
        out["text_encoder"] = _seeded(seed + 1, lambda: Qwen2_5_VLTextModel(config))
    if "tokenizer_2" in names:
        out["tokenizer_2"] = ByT5Tokenizer()
    if "text_encoder_2" in names:
        out["text_encoder_2"] = _seeded(seed + 2, lambda: T5EncoderModel(T5Config(**preset.text_encoder_2)))
    if "transformer" in names:
        out["transformer"] = _seeded(seed + 3, lambda: HunyuanVideo15Transformer3DModel(**preset.transformer))
    if "vae" in names:
        out["vae"] = _seeded(seed + 4, lambda: AutoencoderKLHunyuanVideo15(**preset.vae))
    if "scheduler" in names:
        out["scheduler"] = FlowMatchEulerDiscreteScheduler(shift=preset.flow_shift)
    if "guider" in names:  # saved so that diffusers' pipeline classes load the folder; hyv_lib runs CFG itself
        # its "experimental feature" notice says nothing to our users
        with errors_only("diffusers.guiders.guider_utils"):
            out["guider"] = ClassifierFreeGuidance(guidance_scale=preset.guidance_scale)
    if names & set(IMAGE_COMPONENTS):
        from transformers import SiglipVisionConfig, SiglipVisionModel

        size = siglip_image_size(preset)
        if "image_encoder" in names:
            config = SiglipVisionConfig(**preset.image_encoder, image_size=size)
            if config.hidden_size != preset.transformer["image_embed_dim"]:
                raise ValueError(f"{preset.name}: SigLIP width {config.hidden_size} != the transformer's "
                                 f"image_embed_dim {preset.transformer['image_embed_dim']}")
            out["image_encoder"] = _seeded(seed + 5, lambda: SiglipVisionModel(config))
        if "feature_extractor" in names:
            out["feature_extractor"] = image_processor(size)
    for module in out.values():
        if isinstance(module, torch.nn.Module):
            module.eval().requires_grad_(False)
    return out


def image_processor(size: int | None = None):
    """SigLIP's image processor (resize to ``size`` x ``size``, bicubic, to [-1, 1]), or its class when ``size`` is
    None. transformers picks the torchvision-backed class when torchvision is installed; without it (as here) it
    picks the PIL-backed ``SiglipImageProcessorPil`` and warns each time: we ask for that one directly, with the
    same settings and the same pixels."""
    import importlib.util

    import transformers

    name = "SiglipImageProcessor" if importlib.util.find_spec("torchvision") else "SiglipImageProcessorPil"
    cls = getattr(transformers, name)
    return cls if size is None else cls(size={"height": size, "width": size})


def _loader(name: str):
    from diffusers import AutoencoderKLHunyuanVideo15, FlowMatchEulerDiscreteScheduler, HunyuanVideo15Transformer3DModel
    from diffusers.guiders import ClassifierFreeGuidance
    from transformers import ByT5Tokenizer, Qwen2_5_VLTextModel, Qwen2Tokenizer, SiglipVisionModel, T5EncoderModel

    return {
        "text_encoder": Qwen2_5_VLTextModel, "tokenizer": Qwen2Tokenizer, "text_encoder_2": T5EncoderModel,
        "tokenizer_2": ByT5Tokenizer, "transformer": HunyuanVideo15Transformer3DModel,
        "vae": AutoencoderKLHunyuanVideo15, "scheduler": FlowMatchEulerDiscreteScheduler,
        "guider": ClassifierFreeGuidance, "image_encoder": SiglipVisionModel,
        "feature_extractor": image_processor(),
    }[name]


def check_weight_files(model_path: str) -> None:
    """HyvInputError naming --model_path and the file when a safetensors file of a component subfolder is truncated
    or corrupt (its header unreadable, or its tensors not covering the file exactly): safetensors' own check, reading
    each header only. Every component hyv_lib loads is checked, not only the ones loaded now, so a cut-off transformer
    is found before stage 1 writes its files, not after."""
    for name in (*COMPONENTS, *IMAGE_COMPONENTS):
        folder = os.path.join(model_path, name)
        if not os.path.isdir(folder):
            continue
        for file in sorted(f for f in os.listdir(folder) if f.endswith(".safetensors")):
            path = os.path.join(folder, file)
            try:
                with safe_open(path, "pt"):
                    pass
            except Exception as err:  # SafetensorError (a truncated or garbled file) or an OSError reading it
                raise HyvInputError("--model_path", f"{path!r} is not a complete safetensors file ({err}); "
                                                    "copy or download it again") from None


def check_model_path(model_path: str, names: Iterable[str], model: str = "HunyuanVideo-1.5") -> None:
    """Fail early, naming --model_path, when a local folder lacks a needed component subfolder or holds a truncated
    or corrupt weight file (:func:`check_weight_files`).

    A string that is not an existing path is treated as a hub id and left to ``from_pretrained``.
    """
    if not os.path.exists(model_path):
        if re.fullmatch(r"[\w.-]+/[\w.-]+", model_path):
            return  # a hub id (owner/name): from_pretrained resolves it
        raise HyvInputError("--model_path", f"{model_path!r} does not exist and is not a hub id (owner/name)")
    if not os.path.isdir(model_path):
        raise HyvInputError("--model_path", f"{model_path!r} is not a folder")
    missing = [n for n in names if not os.path.isdir(os.path.join(model_path, n))]
    if missing:
        raise HyvInputError(
            "--model_path",
            f"{model_path!r} is not a diffusers-format {model} folder: missing {', '.join(missing)} "
            "(expected model_index.json plus one subfolder per component)",
        )
    check_weight_files(model_path)


def load_components(
    preset: Preset, model_path: str | None, names: Iterable[str], dtype: str = "fp32", seed: int = 0
) -> dict[str, Any]:
    """Load components by name: ``from_pretrained(model_path, subfolder=name)`` when a path is given
    (real weights, or a saved tiny folder), else the preset's bundled weights (each component from
    ``preset.bundled_subfolder(name)``), else build the tiny ones in code.

    Neural networks are cast to ``dtype``, except the VAE, which stays fp32 on CPU for exact decoding.
    """
    names = list(names)
    if isinstance(model_path, str):
        model_path = os.path.expanduser(model_path)  # "~/weights" from Python, as a shell would expand it
    subfolders = {name: name for name in names}
    if model_path is None and preset.bundled_weights is not None:
        model_path = preset.bundled_path
        subfolders = {name: preset.bundled_subfolder(name) for name in names}
        missing = [n for n in names if n not in IMAGE_COMPONENTS
                   and not os.path.isdir(os.path.join(model_path, subfolders[n]))]
        if not os.path.isdir(model_path) or missing:
            raise HyvInputError("--preset", f"{preset.name}'s bundled weights are missing at {model_path!r}"
                                            + (f" ({', '.join(subfolders[n] for n in missing)})" if missing else "")
                                            + "; reinstall hyv_lib or run tools/train_hyv_tiny.py")
    if model_path is None:
        if not preset.is_tiny:
            raise HyvInputError(
                "--model_path",
                f"preset {preset.name} needs real weights: pass a diffusers-format folder or hub id "
                f"(e.g. {preset.hub_id})",
            )
        components = build_tiny_components(preset, seed=seed, names=names)
    else:
        components = {}
        if preset.is_tiny and os.path.isdir(model_path):
            # A tiny folder saved before image-to-video existed (hyv-tiny's) has no SigLIP: build it in code, seeded,
            # as the tiny presets always do when there are no weights to load.
            built = [n for n in names
                     if n in IMAGE_COMPONENTS and not os.path.isdir(os.path.join(model_path, subfolders[n]))]
            components.update(build_tiny_components(preset, seed=seed, names=built))
            names = [n for n in names if n not in built]
        cogvideox = preset.model == COGVIDEOX_MODEL
        check_model_path(model_path, [subfolders[n] for n in names], "CogVideoX" if cogvideox else "HunyuanVideo-1.5")
        for name in names:
            cls = cogvideox_loader(name, model_path) if cogvideox else _loader(name)
            kwargs = {"subfolder": subfolders[name]}
            if name in ("text_encoder", "text_encoder_2", "transformer", "image_encoder"):
                kwargs["torch_dtype"] = torch_dtype(dtype)
            logger.info("loading %s from %s", name, model_path)
            try:
                components[name] = cls.from_pretrained(model_path, **kwargs)
            except (OSError, ValueError, SafetensorError) as err:  # missing files, no network, corrupt weights
                first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
                raise HyvInputError("--model_path", f"cannot load {name} from {model_path!r}: {first_line}") from err
    for name, module in components.items():
        if isinstance(module, torch.nn.Module):
            module.eval().requires_grad_(False)
            wanted = torch.float32 if name == "vae" else torch_dtype(dtype)  # the VAE decodes in fp32
            if module.dtype != wanted:
                module.to(wanted)
    return components


def save_pipeline(components: dict[str, Any], path: str) -> None:
    """Write a diffusers-format folder (model_index.json + one subfolder each): a HunyuanVideo15Pipeline, or a
    HunyuanVideo15ImageToVideoPipeline when the components include SigLIP (``image_encoder``,
    ``feature_extractor``)."""
    from diffusers import HunyuanVideo15Pipeline

    image = any(n in components for n in IMAGE_COMPONENTS)
    names = COMPONENTS + IMAGE_COMPONENTS if image else COMPONENTS
    missing = [n for n in names if n not in components]
    if missing:
        raise ValueError(f"save_pipeline needs every component; missing {missing}")
    cls = i2v_pipeline_class() if image else HunyuanVideo15Pipeline
    cls(**{n: components[n] for n in names}).save_pretrained(path, safe_serialization=True)


def save_tiny_pipeline(path: str, seed: int = 0, preset: Preset | str = "tiny") -> None:
    """Save tiny components as a diffusers-format folder: for ``preset="tiny"`` loadable with ``--preset tiny
    --model_path``; for a real preset (``720p_t2v``, ``480p_i2v``, ...) the real layout with tiny widths
    (:func:`hyv_lib.models.hunyuan_video15.presets.real_layout_tiny`), loadable with ``--preset 720p_t2v --model_path`` like real weights.
    Presets that take an image get SigLIP too (an image-to-video pipeline folder)."""
    asked = spec = get_preset(preset)
    if spec.model == COGVIDEOX_MODEL:  # the tiny twin has the real layout already
        spec = spec if spec.is_tiny else get_preset("cogvideox_tiny")
        save_cogvideox_pipeline(build_tiny_cogvideox(spec, seed=seed), path)
    else:
        spec = spec if spec.is_tiny else real_layout_tiny(spec)
        names = COMPONENTS + IMAGE_COMPONENTS if "i2v" in spec.tasks else COMPONENTS
        save_pipeline(build_tiny_components(spec, seed=seed, names=names), path)
    note_layout(path, asked.name)


def note_layout(path: str, preset_name: str) -> None:
    """Write into the folder's model_index.json which preset's layout it holds (:data:`hyv_lib.models.folder.LAYOUT_NOTE`;
    diffusers ignores the key): where the configs fit two presets (a sparse checkpoint and its dense twin, a tiny twin
    and its real model), the folder then still runs as the one it was saved as."""
    index = os.path.join(path, "model_index.json")
    with open(index) as f:
        data = json.load(f)
    data[LAYOUT_NOTE] = preset_name
    with open(index, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")


def first_blocks_copy(transformer, blocks: int | None = None, dtype: torch.dtype = torch.float32):
    """A copy of a HunyuanVideo-1.5 transformer in ``dtype`` with only its first ``blocks`` dual-stream blocks (None:
    all): embedders, token refiner, those blocks and the output head. An fp32 oracle of the real model at the cost
    of a few blocks (two real blocks and the rest: 1.8 GiB, against 31 GiB for a whole fp32 copy). The given model
    is not changed and its other blocks are never copied."""
    every_block = transformer.transformer_blocks
    transformer.transformer_blocks = torch.nn.ModuleList(list(every_block)[:blocks])
    try:
        return copy.deepcopy(transformer).to(dtype)
    finally:
        transformer.transformer_blocks = every_block


def example_forward_kwargs(preset: Preset, *, seed: int = 0, latent: tuple[int, int, int] = (2, 6, 10),
                           text_lengths: tuple[int, ...] = (14, 40), byt5_lengths: tuple[int, ...] = (0, 9),
                           image: bool = False, timestep: float = 700.0) -> dict[str, torch.Tensor]:
    """Keyword arguments for the transformer's forward with real padding: one sample per entry of
    ``text_lengths`` (a CFG-style batch), valid text/ByT5 tokens first, t2v (zero image embeddings) unless
    ``image``; ``latent`` is (frames, height, width). Tests, benchmarks and chapters share it."""
    g = torch.Generator().manual_seed(seed)
    b, c = len(text_lengths), preset.latent_channels

    def mask(length: int, valid: tuple[int, ...]) -> torch.Tensor:
        return (torch.arange(length)[None] < torch.tensor(valid)[:, None]).long()

    image_embeds = (torch.randn(b, preset.image_tokens, preset.image_dim, generator=g) if image
                    else torch.zeros(b, preset.image_tokens, preset.image_dim))
    return dict(hidden_states=torch.randn(b, 2 * c + 1, *latent, generator=g), timestep=torch.tensor([timestep] * b),
                encoder_hidden_states=torch.randn(b, preset.text_len, preset.text_dim, generator=g),
                encoder_attention_mask=mask(preset.text_len, text_lengths),
                encoder_hidden_states_2=torch.randn(b, preset.byt5_len, preset.byt5_dim, generator=g),
                encoder_attention_mask_2=mask(preset.byt5_len, byt5_lengths), image_embeds=image_embeds)
