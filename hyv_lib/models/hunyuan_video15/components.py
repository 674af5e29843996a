"""HunyuanVideo-1.5's components: their names, the tiny ones built in code, the class that loads each real one, a
pipeline folder, and example forward arguments with real padding."""

from __future__ import annotations

from typing import Any, Iterable

import torch

from ...base.errors import HyvInputError
from ...base.presets import Preset, tiny_tokenizer_captions
from ..quiet import errors_only
from ..tiny_weights import save_pipeline_folder, seeded
from .image import IMAGE_COMPONENTS, i2v_pipeline_class
from .presets import real_layout_tiny, siglip_image_size

#: Component names of a diffusers ``HunyuanVideo15Pipeline`` folder (model_index.json).
COMPONENTS = ("text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2", "transformer", "vae", "scheduler", "guider")

#: The two text encoders and their tokenizers (stage 1).
TEXT_COMPONENTS = ("tokenizer", "text_encoder", "tokenizer_2", "text_encoder_2")
#: What stages 1-3 load (the text encoders, the DiT and its scheduler, the VAE).
PIPELINE_COMPONENTS = (*TEXT_COMPONENTS, "transformer", "scheduler", "vae")


# The tiny MLLM tokenizer uses the ChatML layout of Qwen2.5-VL's chat template (system, user, then the
# assistant generation prompt), so diffusers' template + crop recipe runs on it unchanged.
TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


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


def build_tiny(preset: Preset, seed: int = 0, names: Iterable[str] | None = None) -> dict[str, Any]:
    """The requested tiny HunyuanVideo-1.5 components (None: every one of a pipeline folder) with seeded random
    weights (fp32, eval mode): each network's weights depend on ``seed`` only, the caller's global RNG is left as
    found."""
    from diffusers import AutoencoderKLHunyuanVideo15, FlowMatchEulerDiscreteScheduler, HunyuanVideo15Transformer3DModel
    from diffusers.guiders import ClassifierFreeGuidance
    from transformers import ByT5Tokenizer, Qwen2_5_VLTextModel, T5Config, T5EncoderModel
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLTextConfig

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
        out["text_encoder"] = seeded(seed + 1, lambda: Qwen2_5_VLTextModel(config))
    if "tokenizer_2" in names:
        out["tokenizer_2"] = ByT5Tokenizer()
    if "text_encoder_2" in names:
        out["text_encoder_2"] = seeded(seed + 2, lambda: T5EncoderModel(T5Config(**preset.text_encoder_2)))
    if "transformer" in names:
        out["transformer"] = seeded(seed + 3, lambda: HunyuanVideo15Transformer3DModel(**preset.transformer))
    if "vae" in names:
        out["vae"] = seeded(seed + 4, lambda: AutoencoderKLHunyuanVideo15(**preset.vae))
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
            out["image_encoder"] = seeded(seed + 5, lambda: SiglipVisionModel(config))
        if "feature_extractor" in names:
            out["feature_extractor"] = image_processor(size)
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


def component_class(name: str):
    """The class whose ``from_pretrained(model_path, subfolder=name)`` loads component ``name`` of a HunyuanVideo-1.5
    folder (HyvInputError naming ``preset`` for a name the model has none of)."""
    from diffusers import AutoencoderKLHunyuanVideo15, FlowMatchEulerDiscreteScheduler, HunyuanVideo15Transformer3DModel
    from diffusers.guiders import ClassifierFreeGuidance
    from transformers import ByT5Tokenizer, Qwen2_5_VLTextModel, Qwen2Tokenizer, SiglipVisionModel, T5EncoderModel

    classes = {
        "text_encoder": Qwen2_5_VLTextModel, "tokenizer": Qwen2Tokenizer, "text_encoder_2": T5EncoderModel,
        "tokenizer_2": ByT5Tokenizer, "transformer": HunyuanVideo15Transformer3DModel,
        "vae": AutoencoderKLHunyuanVideo15, "scheduler": FlowMatchEulerDiscreteScheduler,
        "guider": ClassifierFreeGuidance, "image_encoder": SiglipVisionModel,
        "feature_extractor": image_processor(),
    }
    if name not in classes:
        raise HyvInputError("preset", f"HunyuanVideo-1.5 has no component {name!r}; its components are "
                                      f"{', '.join(classes)}")
    return classes[name]


def save_pipeline(components: dict[str, Any], path: str) -> None:
    """Write a diffusers-format folder (model_index.json + one subfolder each): a HunyuanVideo15Pipeline, or a
    HunyuanVideo15ImageToVideoPipeline when the components include SigLIP (``image_encoder``,
    ``feature_extractor``)."""
    from diffusers import HunyuanVideo15Pipeline

    image = any(n in components for n in IMAGE_COMPONENTS)
    names = COMPONENTS + IMAGE_COMPONENTS if image else COMPONENTS
    save_pipeline_folder(i2v_pipeline_class() if image else HunyuanVideo15Pipeline, components, names, path)


def save_tiny(path: str, preset: Preset, seed: int = 0) -> None:
    """Save tiny components as a diffusers-format folder: for a tiny preset its own; for a real preset (``720p_t2v``,
    ``480p_i2v``, ...) the real layout with tiny widths (:func:`hyv_lib.models.hunyuan_video15.presets.real_layout_tiny`),
    loadable with ``--preset 720p_t2v --model_path`` like real weights. Presets that take an image get SigLIP too (an
    image-to-video pipeline folder)."""
    preset = preset if preset.is_tiny else real_layout_tiny(preset)
    names = COMPONENTS + IMAGE_COMPONENTS if "i2v" in preset.tasks else COMPONENTS
    save_pipeline(build_tiny(preset, seed=seed, names=names), path)


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
