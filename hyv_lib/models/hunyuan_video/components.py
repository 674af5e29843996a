"""HunyuanVideo's components: their names, the tiny ones built in code, the class loading each real one, a folder."""

from __future__ import annotations

import json
import os
from typing import Any, Iterable

from ...base.errors import HyvInputError
from ...base.presets import Preset
from ..quiet import errors_only
from ..tiny_weights import save_pipeline_folder, seeded
from .presets import CLIP_TOKENS, llava_image_tokens, real_layout_tiny

#: Component names of a diffusers ``HunyuanVideoPipeline`` folder (model_index.json).
COMPONENTS = ("text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2", "transformer", "vae", "scheduler")
#: Stage 1's components: the Llama (LLaVA) text encoder, CLIP's text model and their tokenizers.
TEXT_COMPONENTS = ("tokenizer", "text_encoder", "tokenizer_2", "text_encoder_2")
#: What the image-to-video checkpoint's folder adds (HunyuanVideoImageToVideoPipeline): the image processor of
#: LLaVA's CLIP vision tower (its ``text_encoder`` is then a LlavaForConditionalGeneration).
FIRST_FRAME_COMPONENTS = ("image_processor",)
#: Component names of a diffusers ``HunyuanVideoImageToVideoPipeline`` folder.
I2V_COMPONENTS = (*COMPONENTS, *FIRST_FRAME_COMPONENTS)

#: The special tokens of Llama-3's chat layout that HunyuanVideo's prompt template uses (the tiny tokenizer has each
#: as one token, as the real one does): begin of text first (the BOS), then the header and end-of-turn markers.
LLAMA_SPECIALS = ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                  "<pad>")
#: CLIP's begin and end of text (the end doubles as padding, as in openai/clip-vit-large-patch14).
CLIP_SPECIALS = ("<|startoftext|>", "<|endoftext|>")
#: LLaVA's image placeholder, one token in the tokenizer (the pipeline expands it to the image's tokens).
IMAGE_TOKEN = "<image>"
#: Words of the image-to-video template that the tiny LLaVA tokenizer keeps whole, as Llama-3's does: the pipeline
#: cuts the 4 tokens ``<|eot_id|><|start_header_id|>assistant<|end_header_id|>`` from the text.
I2V_WORDS = ("assistant",)


def _byte_level(specials: tuple[str, ...], template: str, words: tuple[str, ...] = ()):
    """A merge-free byte-level BPE (``tokenizers``): 256 byte tokens then ``specials`` then ``words`` (whole-word
    tokens), with ``template`` (a TemplateProcessing ``single`` string) adding the special tokens around a text.
    Covers any text offline."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(list(specials))
    backend.add_tokens(list(words))
    used = [tok for tok in specials if tok in template]
    backend.post_processor = processors.TemplateProcessing(
        single=template, special_tokens=[(tok, backend.token_to_id(tok)) for tok in used])
    return backend


def build_tiny_tokenizers(image: bool = False):
    """(Llama-like, CLIP-like) offline tokenizers: byte-level, the first adding ``<|begin_of_text|>`` as Llama-3's
    does and padding with ``<pad>`` on the right, the second wrapping a text in CLIP's start and end tokens, padding
    with the end token, 77 tokens at most. ``image``: the first also has LLaVA's :data:`IMAGE_TOKEN` and the
    :data:`I2V_WORDS` (the image-to-video checkpoint's tokenizer)."""
    from transformers import PreTrainedTokenizerFast

    specials = (*LLAMA_SPECIALS, IMAGE_TOKEN) if image else LLAMA_SPECIALS
    llama = PreTrainedTokenizerFast(
        tokenizer_object=_byte_level(specials, "<|begin_of_text|> $A", I2V_WORDS if image else ()),
        bos_token="<|begin_of_text|>",
        eos_token="<|end_of_text|>", pad_token="<pad>", padding_side="right")
    clip = PreTrainedTokenizerFast(
        tokenizer_object=_byte_level(CLIP_SPECIALS, "<|startoftext|> $A <|endoftext|>"), bos_token="<|startoftext|>",
        eos_token="<|endoftext|>", pad_token="<|endoftext|>", model_max_length=CLIP_TOKENS, padding_side="right")
    return llama, clip


def i2v_pipeline_class():
    """diffusers' ``HunyuanVideoImageToVideoPipeline``, imported without transformers' one-time notice that
    ``CLIPImageProcessor`` falls back to the PIL class when torchvision is missing (:func:`image_processor_class`)."""
    with errors_only("transformers.utils.import_utils"):
        from diffusers import HunyuanVideoImageToVideoPipeline
    return HunyuanVideoImageToVideoPipeline


def image_processor_class():
    """CLIP's image processor class: ``CLIPImageProcessor``, or without torchvision (as here) the PIL-backed
    ``CLIPImageProcessorPil`` that transformers would fall back to with a warning each time (the same pixels)."""
    import importlib.util

    import transformers

    return getattr(transformers, "CLIPImageProcessor" if importlib.util.find_spec("torchvision")
                   else "CLIPImageProcessorPil")


def build_tiny(preset: Preset, seed: int = 0, names: Iterable[str] | None = None) -> dict[str, Any]:
    """The requested tiny HunyuanVideo components (None: every one of the preset's pipeline folder) with seeded random
    weights (fp32, eval mode, no gradients): a LlamaModel of ``preset.text_encoder`` 's widths as wide as the
    transformer's ``text_embed_dim`` (for an image-to-video preset a LlavaForConditionalGeneration: a CLIP vision
    tower of ``preset.image_encoder`` 's widths before that Llama, with CLIP's image processor at its size), a
    CLIPTextModel as wide as its ``pooled_projection_dim``, the transformer and VAE of the preset's configs and the
    flow-matching scheduler of its shift. Each network's weights depend on ``seed`` only."""
    from diffusers import AutoencoderKLHunyuanVideo, FlowMatchEulerDiscreteScheduler, HunyuanVideoTransformer3DModel
    from transformers import CLIPTextConfig, CLIPTextModel, LlamaConfig, LlamaModel

    image = "i2v" in preset.tasks
    every = I2V_COMPONENTS if image else COMPONENTS
    names = set(every if names is None else names)
    unknown = names - set(every)
    if unknown:
        raise HyvInputError("preset", f"{preset.name} has no component {', '.join(sorted(unknown))}; its components "
                                      f"are {', '.join(every)}")
    llama, clip = build_tiny_tokenizers(image)
    out: dict[str, Any] = {}
    if "tokenizer" in names:
        out["tokenizer"] = llama
    if "tokenizer_2" in names:
        out["tokenizer_2"] = clip
    if "text_encoder" in names:
        config = LlamaConfig(vocab_size=len(llama), bos_token_id=llama.bos_token_id, eos_token_id=llama.eos_token_id,
                             pad_token_id=llama.pad_token_id, **preset.text_encoder)
        if config.hidden_size != preset.transformer["text_embed_dim"]:
            raise ValueError(f"{preset.name}: the Llama width {config.hidden_size} is not the transformer's "
                             f"text_embed_dim {preset.transformer['text_embed_dim']}")
        out["text_encoder"] = seeded(seed + 1, (lambda: _tiny_llava(preset, llama, config)) if image
                                     else (lambda: LlamaModel(config)))
    if "text_encoder_2" in names:
        config = CLIPTextConfig(vocab_size=len(clip), bos_token_id=clip.bos_token_id, eos_token_id=clip.eos_token_id,
                                pad_token_id=clip.pad_token_id, **preset.text_encoder_2)
        if config.hidden_size != preset.transformer["pooled_projection_dim"]:
            raise ValueError(f"{preset.name}: the CLIP width {config.hidden_size} is not the transformer's "
                             f"pooled_projection_dim {preset.transformer['pooled_projection_dim']}")
        out["text_encoder_2"] = seeded(seed + 2, lambda: CLIPTextModel(config))
    if "transformer" in names:
        out["transformer"] = seeded(seed + 3, lambda: HunyuanVideoTransformer3DModel(**preset.transformer))
    if "vae" in names:
        out["vae"] = seeded(seed + 4, lambda: AutoencoderKLHunyuanVideo(**preset.vae))
    if "scheduler" in names:
        out["scheduler"] = FlowMatchEulerDiscreteScheduler(shift=preset.flow_shift)
    if "image_processor" in names:
        size = preset.image_encoder["image_size"]
        out["image_processor"] = image_processor_class()(size={"shortest_edge": size},
                                                         crop_size={"height": size, "width": size})
    return out


def _tiny_llava(preset: Preset, tokenizer, text_config):
    """A LlavaForConditionalGeneration: a CLIP vision tower of ``preset.image_encoder`` 's widths, LLaVA's defaults
    (the second-last layer's patch tokens, CLS dropped, a GELU projector) and ``text_config`` 's Llama, the image
    token and the padding token the tokenizer's."""
    from transformers import CLIPVisionConfig, LlavaConfig, LlavaForConditionalGeneration

    config = LlavaConfig(vision_config=CLIPVisionConfig(**preset.image_encoder), text_config=text_config,
                         image_token_index=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
                         image_seq_length=llava_image_tokens(preset), pad_token_id=tokenizer.pad_token_id)
    return LlavaForConditionalGeneration(config)


def _is_llava(model_path: str) -> bool:
    """Whether the folder's ``text_encoder`` is a LLaVA (the image-to-video checkpoint's) rather than a Llama: its
    config.json's ``model_type`` (a hub id's config is fetched by transformers)."""
    local = os.path.join(os.path.expanduser(str(model_path)), "text_encoder", "config.json")
    if os.path.isfile(local):
        with open(local) as f:
            return json.load(f).get("model_type") == "llava"
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(model_path, subfolder="text_encoder").model_type == "llava"
    except (OSError, ValueError):  # no config to read: LlamaModel's from_pretrained says what is missing
        return False


def component_class(name: str, model_path: str | None = None):
    """The class whose ``from_pretrained(model_path, subfolder=name)`` loads component ``name`` of a HunyuanVideo
    folder (the tokenizers through AutoTokenizer: a real folder holds Llama-3's (LLaVA's) and CLIP's, a saved tiny one
    the byte-level ones; ``text_encoder``: LlavaForConditionalGeneration where the folder's config says LLaVA, the
    image-to-video checkpoint's, else LlamaModel); HyvInputError naming ``preset`` for a name the model has none of."""
    from diffusers import AutoencoderKLHunyuanVideo, FlowMatchEulerDiscreteScheduler, HunyuanVideoTransformer3DModel
    from transformers import AutoTokenizer, CLIPTextModel, LlamaModel, LlavaForConditionalGeneration

    classes = {"text_encoder": LlamaModel, "tokenizer": AutoTokenizer, "text_encoder_2": CLIPTextModel,
               "tokenizer_2": AutoTokenizer, "transformer": HunyuanVideoTransformer3DModel,
               "vae": AutoencoderKLHunyuanVideo, "scheduler": FlowMatchEulerDiscreteScheduler,
               "image_processor": image_processor_class()}
    if name not in classes:
        raise HyvInputError("preset", f"HunyuanVideo has no component {name!r}; its components are "
                                      f"{', '.join(I2V_COMPONENTS)}")
    if name == "text_encoder" and model_path is not None and _is_llava(model_path):
        return LlavaForConditionalGeneration
    return classes[name]


def save_pipeline(components: dict[str, Any], path: str) -> None:
    """Write a diffusers-format folder (model_index.json + one subfolder per component): a
    ``HunyuanVideoImageToVideoPipeline`` when ``components`` hold an ``image_processor``, else a
    ``HunyuanVideoPipeline``."""
    from diffusers import HunyuanVideoPipeline

    if "image_processor" in components:
        save_pipeline_folder(i2v_pipeline_class(), components, I2V_COMPONENTS, path)
    else:
        save_pipeline_folder(HunyuanVideoPipeline, components, COMPONENTS, path)


def save_tiny(path: str, preset: Preset, seed: int = 0) -> None:
    """Save tiny components as a diffusers folder of the preset's pipeline (``HunyuanVideoPipeline``, or
    ``HunyuanVideoImageToVideoPipeline`` with its LLaVA and image processor for an image-to-video preset): a tiny
    preset's own; for a real preset its layout (channels, task, guidance embedding) at tiny widths
    (:func:`hyv_lib.models.hunyuan_video.presets.real_layout_tiny`)."""
    save_pipeline(build_tiny(real_layout_tiny(preset), seed=seed), path)
