"""HunyuanVideo's components: their names, the tiny ones built in code, the class loading each real one, a folder."""

from __future__ import annotations

from typing import Any, Iterable

from ...base.errors import HyvInputError
from ...base.presets import Preset
from ..tiny_weights import save_pipeline_folder, seeded
from .presets import CLIP_TOKENS, real_layout_tiny

#: Component names of a diffusers ``HunyuanVideoPipeline`` folder (model_index.json).
COMPONENTS = ("text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2", "transformer", "vae", "scheduler")
#: Stage 1's components: the Llama (LLaVA) text encoder, CLIP's text model and their tokenizers.
TEXT_COMPONENTS = ("tokenizer", "text_encoder", "tokenizer_2", "text_encoder_2")

#: The special tokens of Llama-3's chat layout that HunyuanVideo's prompt template uses (the tiny tokenizer has each
#: as one token, as the real one does): begin of text first (the BOS), then the header and end-of-turn markers.
LLAMA_SPECIALS = ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                  "<pad>")
#: CLIP's begin and end of text (the end doubles as padding, as in openai/clip-vit-large-patch14).
CLIP_SPECIALS = ("<|startoftext|>", "<|endoftext|>")


def _byte_level(specials: tuple[str, ...], template: str):
    """A merge-free byte-level BPE (``tokenizers``): 256 byte tokens then ``specials``, with ``template`` (a
    TemplateProcessing ``single`` string) adding the special tokens around a text. Covers any text offline."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(list(specials))
    used = [tok for tok in specials if tok in template]
    backend.post_processor = processors.TemplateProcessing(
        single=template, special_tokens=[(tok, backend.token_to_id(tok)) for tok in used])
    return backend


def build_tiny_tokenizers():
    """(Llama-like, CLIP-like) offline tokenizers: byte-level, the first adding ``<|begin_of_text|>`` as Llama-3's
    does and padding with ``<pad>`` on the right, the second wrapping a text in CLIP's start and end tokens, padding
    with the end token, 77 tokens at most."""
    from transformers import PreTrainedTokenizerFast

    llama = PreTrainedTokenizerFast(
        tokenizer_object=_byte_level(LLAMA_SPECIALS, "<|begin_of_text|> $A"), bos_token="<|begin_of_text|>",
        eos_token="<|end_of_text|>", pad_token="<pad>", padding_side="right")
    clip = PreTrainedTokenizerFast(
        tokenizer_object=_byte_level(CLIP_SPECIALS, "<|startoftext|> $A <|endoftext|>"), bos_token="<|startoftext|>",
        eos_token="<|endoftext|>", pad_token="<|endoftext|>", model_max_length=CLIP_TOKENS, padding_side="right")
    return llama, clip


def build_tiny(preset: Preset, seed: int = 0, names: Iterable[str] | None = None) -> dict[str, Any]:
    """The requested tiny HunyuanVideo components (None: every one of :data:`COMPONENTS`) with seeded random weights
    (fp32, eval mode, no gradients): a LlamaModel of ``preset.text_encoder`` 's widths as wide as the transformer's
    ``text_embed_dim``, a CLIPTextModel as wide as its ``pooled_projection_dim``, the transformer and VAE of the
    preset's configs and the flow-matching scheduler of its shift. Each network's weights depend on ``seed`` only."""
    from diffusers import AutoencoderKLHunyuanVideo, FlowMatchEulerDiscreteScheduler, HunyuanVideoTransformer3DModel
    from transformers import CLIPTextConfig, CLIPTextModel, LlamaConfig, LlamaModel

    names = set(COMPONENTS if names is None else names)
    unknown = names - set(COMPONENTS)
    if unknown:
        raise HyvInputError("preset", f"HunyuanVideo has no component {', '.join(sorted(unknown))}; its components "
                                      f"are {', '.join(COMPONENTS)}")
    llama, clip = build_tiny_tokenizers()
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
        out["text_encoder"] = seeded(seed + 1, lambda: LlamaModel(config))
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
    return out


def component_class(name: str):
    """The class whose ``from_pretrained(model_path, subfolder=name)`` loads component ``name`` of a HunyuanVideo
    folder (the tokenizers through AutoTokenizer: a real folder holds Llama-3's and CLIP's, a saved tiny one the
    byte-level ones); HyvInputError naming ``preset`` for a name the model has none of."""
    from diffusers import AutoencoderKLHunyuanVideo, FlowMatchEulerDiscreteScheduler, HunyuanVideoTransformer3DModel
    from transformers import AutoTokenizer, CLIPTextModel, LlamaModel

    classes = {"text_encoder": LlamaModel, "tokenizer": AutoTokenizer, "text_encoder_2": CLIPTextModel,
               "tokenizer_2": AutoTokenizer, "transformer": HunyuanVideoTransformer3DModel,
               "vae": AutoencoderKLHunyuanVideo, "scheduler": FlowMatchEulerDiscreteScheduler}
    if name not in classes:
        raise HyvInputError("preset", f"HunyuanVideo has no component {name!r}; its components are "
                                      f"{', '.join(COMPONENTS)}")
    return classes[name]


def save_pipeline(components: dict[str, Any], path: str) -> None:
    """Write a diffusers-format ``HunyuanVideoPipeline`` folder (model_index.json + one subfolder per component)."""
    from diffusers import HunyuanVideoPipeline

    save_pipeline_folder(HunyuanVideoPipeline, components, COMPONENTS, path)


def save_tiny(path: str, preset: Preset, seed: int = 0) -> None:
    """Save tiny components as a ``HunyuanVideoPipeline`` folder: a tiny preset's own; for a real preset its layout
    (channels, task, guidance embedding) at tiny widths (:func:`hyv_lib.models.hunyuan_video.presets.real_layout_tiny`).
    An image-to-video preset's folder holds its transformer layout with the text-to-video pipeline's text encoders
    (a LLaVA encoder and its image processor are not built here yet)."""
    save_pipeline(build_tiny(real_layout_tiny(preset), seed=seed), path)
