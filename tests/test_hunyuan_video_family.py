"""HunyuanVideo (13B, Dec 2024) as hyv_lib's third family, at tiny widths against diffusers' own classes: the adapter's
pieces (dual- then single-stream blocks, a padded text mask) against HunyuanVideoTransformer3DModel.forward, the torch
runtime with hyv_lib's attention, stage 1 against HunyuanVideoPipeline.encode_prompt, stage 2 against the pipeline's
latents, and a saved folder that diffusers loads."""

import copy
import dataclasses
import types

import pytest
import torch
from diffusers import HunyuanVideoPipeline
from diffusers.models.transformers.transformer_hunyuan_video import HunyuanVideoAttnProcessor2_0

from hyv_lib.base.errors import HyvInputError
from hyv_lib.models import families, registry
from hyv_lib.models.hunyuan_video import recipe, text
from hyv_lib.models.hunyuan_video.adapter import HUNYUAN_VIDEO, patches
from hyv_lib.models.hunyuan_video.components import COMPONENTS, build_tiny
from hyv_lib.models.hunyuan_video.presets import HUNYUANVIDEO_I2V, HUNYUANVIDEO_T2V, HUNYUANVIDEO_TINY
from hyv_lib.models.hunyuan_video.processors import HunyuanVideoJointProcessor
from hyv_lib.models.hunyuan_video15.processors import SelfAttnProcessor

# fp32 on the CPU. Measured: the pieces with diffusers' processors 0 (the same ops in order); hyv_lib's attention
# (SDPA on each sample's valid keys) 4.8e-7 against outputs up to ~2.6; stage 1 0; the sample loop 0.
TOL = 1e-5
SHAPE = (2, 16, 3, 4, 6)  # [B, C, T, H, W]: 3 x 2 x 3 = 18 video tokens (patch 1 x 2 x 2)
PROMPTS = ["a red square moving left on a black background", "a cat"]


@pytest.fixture(scope="module")
def tiny():
    return build_tiny(HUNYUANVIDEO_TINY, seed=0)


@pytest.fixture(scope="module")
def model(tiny):
    return tiny["transformer"]


def inputs(seed: int, valid=(7, 20), guidance=(6000.0, 3000.0)) -> dict:
    """Forward keywords with a padded text mask (``valid`` tokens first per sample) and embedded guidance."""
    g = torch.Generator().manual_seed(seed)
    length = HUNYUANVIDEO_TINY.text_len
    return dict(hidden_states=torch.randn(*SHAPE, generator=g), timestep=torch.tensor([999.0, 400.0]),
                encoder_hidden_states=torch.randn(2, length, HUNYUANVIDEO_TINY.text_dim, generator=g),
                encoder_attention_mask=(torch.arange(length)[None] < torch.tensor(valid)[:, None]).float(),
                pooled_projections=torch.randn(2, 16, generator=g), guidance=torch.tensor(guidance))


def oracle(model, kwargs) -> torch.Tensor:
    with torch.no_grad():
        return model(**kwargs, return_dict=False)[0]


def pieces(model, kwargs) -> torch.Tensor:
    """ModelAdapter.forward from prepare's tensors and the RoPE tables, as the runtimes drive the pieces."""
    a = HUNYUAN_VIDEO
    prepared = a.prepare(model, **{k: kwargs[k] for k in a.conditioning})
    with torch.no_grad():
        return a.forward(model, kwargs["hidden_states"], kwargs["timestep"], prepared,
                         a.rope(model, kwargs["hidden_states"].shape))


# ---------------------------------------------------------------------------------------------- presets, registry
def test_the_presets_are_the_published_configs():
    t2v, i2v = HUNYUANVIDEO_T2V, HUNYUANVIDEO_I2V
    assert (t2v.default_height, t2v.default_width, t2v.default_video_length, t2v.default_steps) == (720, 1280, 129, 50)
    assert (t2v.flow_shift, t2v.guidance_scale, t2v.text_len, t2v.crop_start) == (7.0, 6.0, 256, 95)
    dit = t2v.transformer
    assert (dit["num_layers"], dit["num_single_layers"], dit["num_attention_heads"], dit["attention_head_dim"]) == \
        (20, 40, 24, 128)
    assert (dit["in_channels"], dit["text_embed_dim"], dit["pooled_projection_dim"], dit["rope_axes_dim"]) == \
        (16, 4096, 768, [16, 56, 56])
    assert dit["guidance_embeds"] and (dit["patch_size_t"], dit["patch_size"]) == (1, 2)
    assert sum(dit["rope_axes_dim"]) == dit["attention_head_dim"]
    assert i2v.transformer["in_channels"] == 33 and i2v.transformer["image_condition_type"] == "latent_concat"
    assert not i2v.transformer["guidance_embeds"] and i2v.tasks == ("i2v",) and i2v.text_len == 288 + 252
    with torch.device("meta"):  # the real configs build (names and shapes only)
        real = HUNYUAN_VIDEO.build(dit)
    assert len(HUNYUAN_VIDEO.blocks(real)) == 60
    assert 12.5e9 < sum(p.numel() for p in real.parameters()) < 13.5e9  # "13B"


def test_the_family_is_registered():
    family = families.FAMILIES["hunyuanvideo"]
    for preset in family.presets:
        assert families.get_preset(preset.name) is preset and families.family_for(preset) is family
    assert registry.get_adapter("hunyuanvideo") is HUNYUAN_VIDEO
    assert HUNYUANVIDEO_TINY.model == HUNYUAN_VIDEO.name == "hunyuanvideo"


def test_build_tiny_is_seeded_and_frozen(tiny):
    again = build_tiny(HUNYUANVIDEO_TINY, seed=0, names=["transformer"])["transformer"]
    other = build_tiny(HUNYUANVIDEO_TINY, seed=1, names=["transformer"])["transformer"]
    first = next(tiny["transformer"].parameters())
    assert torch.equal(first, next(again.parameters())) and not torch.equal(first, next(other.parameters()))
    assert all(not m.training for m in tiny.values() if isinstance(m, torch.nn.Module))
    with pytest.raises(HyvInputError, match="has no component image_encoder"):
        build_tiny(HUNYUANVIDEO_TINY, names=["image_encoder"])


# ---------------------------------------------------------------------------------------------- the adapter
def test_the_pieces_are_diffusers_forward_with_a_padded_mask(model):
    """The 2 dual- then 2 single-stream blocks run piece by piece equal diffusers' forward; a padded text token's
    value changes nothing (it is masked as a key), a valid one changes the output."""
    kwargs = inputs(0)
    expected = oracle(model, kwargs)
    assert len(HUNYUAN_VIDEO.blocks(model)) == 4
    assert (pieces(model, kwargs) - expected).abs().max() <= TOL
    padded = dict(kwargs, encoder_hidden_states=kwargs["encoder_hidden_states"].clone())
    padded["encoder_hidden_states"][0, 7:] = 100.0
    assert (pieces(model, padded) - expected).abs().max() <= TOL
    padded["encoder_hidden_states"][0, 3] = 100.0
    assert (pieces(model, padded) - expected)[0].abs().max() > 1e-3


def test_guidance_and_pooled_text_reach_every_block(model):
    """The embedded guidance and the pooled CLIP vector are part of the conditioning: changing either changes the
    output, and the pieces follow diffusers there too."""
    base = oracle(model, inputs(1))
    for change in (dict(guidance=(1000.0, 1000.0)), dict(valid=(7, 20))):
        kwargs = inputs(1, **change)
        if "valid" in change:
            kwargs["pooled_projections"] = kwargs["pooled_projections"] + 1
        expected = oracle(model, kwargs)
        assert (expected - base).abs().max() > 1e-3
        assert (pieces(model, kwargs) - expected).abs().max() <= TOL


def test_hyv_lib_attention_in_pieces_and_in_the_torch_runtime(model):
    """hyv_lib's processors (a 1-D key mask, no S x S tensor) on every block and the refiner: the pieces, and the
    torch runtime (runtimes.step.make_step: diffusers' forward with them installed), equal diffusers' own."""
    from hyv_lib.runtimes.step import make_step

    copied = copy.deepcopy(model)
    step = make_step(copied, "torch", attention="auto")
    assert all(isinstance(b.attn.processor, HunyuanVideoJointProcessor) for b in HUNYUAN_VIDEO.blocks(copied))
    assert all(isinstance(b.attn.processor, SelfAttnProcessor)
               for b in copied.context_embedder.token_refiner.refiner_blocks)
    assert all(isinstance(b.attn.processor, HunyuanVideoAttnProcessor2_0) for b in HUNYUAN_VIDEO.blocks(model))
    for seed in (2, 3):
        kwargs = inputs(seed, valid=(32, 1))  # one sample unpadded, one with a single valid token
        expected = oracle(model, kwargs)
        with torch.no_grad():
            assert (step(**kwargs) - expected).abs().max() <= TOL
        assert (pieces(copied, kwargs) - expected).abs().max() <= TOL


def test_token_ranges_and_tables(model):
    """Ulysses-style ranges of the patch embedding are its tokens (zero patches past the end); the patches are the
    Conv3d's; RoPE has one row per token; the block_call of a recorded forward gives the text mask back."""
    latents = inputs(4)["hidden_states"]
    a = HUNYUAN_VIDEO
    with torch.no_grad():
        whole = a.embed_video(model, latents)
        ranges = torch.cat([a.embed_video(model, latents, s, s + 5) for s in (0, 5, 10, 15)], dim=1)
        zero = a.embed_video(model, torch.zeros_like(latents), 0, 1)
    assert whole.shape[1] == a.video_token_count(model, SHAPE) == 18 == patches(latents, 1, 2).shape[1]
    torch.testing.assert_close(ranges[:, :18], whole, rtol=0, atol=1e-6)
    torch.testing.assert_close(ranges[:, 18:], zero.expand(-1, 2, -1), rtol=0, atol=0)
    cos, sin = a.rope(model, SHAPE)
    assert cos.shape == sin.shape == (18, model.config.attention_head_dim)
    recorded = {}

    def record(module, args):
        recorded["call"] = a.block_call(args, {})

    handle = model.single_transformer_blocks[0].register_forward_pre_hook(record)
    try:
        oracle(model, inputs(4))
    finally:
        handle.remove()
    _, context, _, block_inputs, _ = recorded["call"]
    assert block_inputs["context_mask"].tolist() == inputs(4)["encoder_attention_mask"].bool().tolist()
    assert context.shape[1] == HUNYUANVIDEO_TINY.text_len


def test_rules_lora_targets_and_checks(model):
    from hyv_lib.models.lora import lora_target_names

    names = dict(model.named_parameters())
    for strategy, rules in HUNYUAN_VIDEO.rule_sets.items():
        assert all(any(rule.matches(n) for n in names) for rule in rules), strategy
    tp = {rule.name: sum(rule.matches(n) for n in names) for rule in HUNYUAN_VIDEO.rules("tp")}
    # dual blocks: 6 Q/K/V + 2 ff in (weights and biases), single: 3 Q/K/V + proj_mlp; 2 blocks of each kind
    assert tp == {"tp/attn_qkv column": 2 * 12 + 2 * 6, "tp/mlp_in column": 2 * 4 + 2 * 2,
                  "tp/attn_out row": 2 * 2, "tp/mlp_out row": 2 * 2 + 2}
    linears = lambda group: set(lora_target_names(model, group))  # noqa: E731
    assert len(linears("attn")) == 2 * 8 + 2 * 3 and len(linears("mlp")) == 2 * 4 + 2 * 2
    assert len(linears("single")) == 2 * 5 and linears("single") <= linears("attn") | linears("mlp")
    with pytest.raises(ValueError, match="token_replace"):
        HUNYUAN_VIDEO.check(types.SimpleNamespace(config=types.SimpleNamespace(image_condition_type="token_replace",
                                                                               patch_size_t=1)), "JaxTransformer")
    with pytest.raises(ValueError, match="embeds the guidance scale"):
        HUNYUAN_VIDEO.prepare(model, **{k: v for k, v in inputs(5).items() if k in HUNYUAN_VIDEO.conditioning
                                        and k != "guidance"})
    example = HUNYUAN_VIDEO.example_inputs(HUNYUANVIDEO_T2V, 720, 1280, 129, dtype=torch.float32)
    assert example["hidden_states"].shape == (1, 16, 33, 90, 160) and example["guidance"].shape == (1,)


# ---------------------------------------------------------------------------------------------- stages 1 and 2
def pipeline_of(tiny) -> HunyuanVideoPipeline:
    return HunyuanVideoPipeline(**{name: tiny[name] for name in COMPONENTS})


def test_stage1_is_the_pipelines_encode_prompt(tiny):
    """encode_prompts equals HunyuanVideoPipeline.encode_prompt (Llama in the template, cropped; CLIP pooled), the
    crop being the tiny tokenizer's template length; the family's cut counts say what a long prompt loses."""
    preset = HUNYUANVIDEO_TINY
    ours = families.family_for(preset).encode_texts(tiny, preset, PROMPTS)
    template = text.prompt_template(preset, tiny["tokenizer"])
    with torch.no_grad():
        embeds, pooled, mask = pipeline_of(tiny).encode_prompt(PROMPTS, prompt_template=template,
                                                               max_sequence_length=preset.text_len,
                                                               device=torch.device("cpu"))
    assert torch.equal(ours["prompt_embeds"], embeds) and torch.equal(ours["pooled_prompt_embeds"], pooled)
    assert torch.equal(ours["prompt_embeds_mask"], mask.long()) and ours["prompt_embeds_mask"].dtype == torch.int64
    assert ours["prompt_embeds"].shape == (2, preset.text_len, preset.text_dim)
    assert ours["prompt_embeds_mask"].sum(1).tolist() == [32, 6]  # "a cat" and <|eot_id|>: 6 bytes
    cuts = families.family_for(preset).tokens_cut(tiny, preset, {"prompt": PROMPTS[0], "negative_prompt": "a cat"})
    # its own tokens are its bytes (the template's <|eot_id|> after it is not counted); 32 fit after the crop
    assert cuts["prompt_tokens_dropped"] == (len(PROMPTS[0]) - preset.text_len, len(PROMPTS[0]), preset.text_len,
                                             "the text encoder")
    assert cuts["negative_prompt_tokens_dropped"][:2] == (0, 5)
    assert cuts["prompt_clip_tokens_dropped"] == (0, len(PROMPTS[0]), 77, "CLIP")


def test_stage2_is_the_pipelines_latents(tiny):
    """family.sample from stage 1's tensors equals HunyuanVideoPipeline(output_type="latent") from the same noise:
    embedded guidance, one sample per step, the shifted flow-matching schedule."""
    from hyv_lib.pipeline.settings import Stage2Settings
    from hyv_lib.pipeline.text import encode_pair
    from hyv_lib.runtimes.step import torch_step

    preset = HUNYUANVIDEO_TINY
    family = families.family_for(preset)
    embeds = encode_pair(tiny, preset, PROMPTS[0], "")
    family.check_stage1(embeds, preset, "stage1_embeddings.safetensors")
    settings = Stage2Settings(height=32, width=48, video_length=5, num_inference_steps=3, guidance_scale=4.5,
                              flow_shift=preset.flow_shift, seed=7)
    ours = family.sample(torch_step(tiny["transformer"]), tiny["transformer"], tiny["scheduler"].config, preset,
                         embeds, settings, progress=False)
    noise = torch.randn(ours.shape, generator=torch.Generator().manual_seed(7))
    pipe = pipeline_of(tiny)
    pipe.set_progress_bar_config(disable=True)
    template = text.prompt_template(preset, tiny["tokenizer"])
    theirs = pipe(prompt=PROMPTS[0], height=32, width=48, num_frames=5, num_inference_steps=3, guidance_scale=4.5,
                  latents=noise.clone(), prompt_template=template, max_sequence_length=preset.text_len,
                  output_type="latent").frames
    assert ours.shape == (1, 16, 2, 4, 6)
    assert (ours - theirs).abs().max() <= TOL and not torch.equal(ours, noise)


def test_stage1_file_checks():
    preset = HUNYUANVIDEO_TINY
    good = {"prompt_embeds": torch.zeros(1, 32, 32), "prompt_embeds_mask": torch.ones(1, 32, dtype=torch.int64),
            "pooled_prompt_embeds": torch.zeros(1, 16)}
    good.update({f"negative_{k}": v for k, v in good.items()})
    recipe.check_stage1(good, preset, "s.safetensors")
    for bad, message in ((dict(good, extra=torch.zeros(1)), "must hold exactly"),
                         (dict(good, prompt_embeds=torch.zeros(1, 31, 32)), "prompt_embeds must be a float"),
                         (dict(good, pooled_prompt_embeds=torch.full((1, 16), float("nan"))), "NaN")):
        with pytest.raises(HyvInputError, match=message) as err:
            recipe.check_stage1(bad, preset, "s.safetensors")
        assert err.value.argument == "input_dir"
    i2v = dataclasses.replace(preset, tasks=("i2v",))
    with pytest.raises(HyvInputError, match="cond_latents"):
        recipe.check_stage1(good, i2v, "s.safetensors")


@pytest.mark.parametrize("name", ["hunyuanvideo_tiny", "hunyuanvideo_i2v"])
def test_a_saved_folder_loads_in_diffusers(tmp_path, name):
    """save_tiny_pipeline writes a HunyuanVideoPipeline folder (the real image-to-video layout at tiny widths: a
    HunyuanVideoImageToVideoPipeline one, with LLaVA), which diffusers loads, hyv_lib loads by the family's classes,
    and whose configs say which preset it is."""
    from diffusers import HunyuanVideoImageToVideoPipeline

    from hyv_lib.models.components import load_components, save_tiny_pipeline
    from hyv_lib.models.folder import detect_preset
    from hyv_lib.models.hunyuan_video.presets import real_layout_tiny

    preset = families.get_preset(name)
    save_tiny_pipeline(str(tmp_path), preset=name)
    pipeline = HunyuanVideoImageToVideoPipeline if "i2v" in preset.tasks else HunyuanVideoPipeline
    pipe = pipeline.from_pretrained(str(tmp_path))
    assert pipe.transformer.config.in_channels == preset.transformer["in_channels"]
    assert pipe.scheduler.config.shift == preset.flow_shift
    assert detect_preset(str(tmp_path))[0].name == name
    loaded = load_components(preset, str(tmp_path), families.family_for(preset).text_components)
    built = build_tiny(real_layout_tiny(preset), seed=0, names=["text_encoder"])["text_encoder"]
    assert torch.equal(next(loaded["text_encoder"].parameters()), next(built.parameters()))


# ---------------------------------------------------------------------------------------------- the piecewise runtimes
def swapped_oracle(model, later: dict, first: dict) -> torch.Tensor:
    """diffusers' forward on ``later`` with the last block's input tokens taken from the forward on ``first``:
    DeepCache's cached step with one block recomputed, by the model's own code (the last block is single-stream)."""
    last, kept = model.single_transformer_blocks[-1], {}

    def record(module, args):
        kept["tokens"] = args[:2]

    def swap(module, args):
        return (*kept["tokens"], *args[2:])

    for hook, kwargs in ((record, first), (swap, later)):
        handle = last.register_forward_pre_hook(hook)
        try:
            out = oracle(model, kwargs)
        finally:
            handle.remove()
    return out


@pytest.fixture(scope="module")
def jax_model(model):
    pytest.importorskip("torchax")
    from hyv_lib.runtimes.jax_step import JaxTransformer

    return JaxTransformer(copy.deepcopy(model))


def test_the_jax_runtime_on_one_device(model, jax_model):
    """JaxTransformer (torchax, one device) runs both block kinds with the guidance and pooled text in every block's
    modulation, equal to diffusers' forward, one compilation for new data."""
    for seed in (2, 3):
        kwargs = inputs(seed, valid=(20, 5), guidance=(6000.0 + seed, 1000.0))
        err = (jax_model(**kwargs) - oracle(model, kwargs)).abs().max().item()
        assert err <= TOL, err
    assert jax_model.compilations == 1


def test_deepcache_on_both_runtimes(model, jax_model):
    """A cached step at a new timestep (the last block recomputed on the tokens cached by the full step) equals
    diffusers' forward with those tokens put back, on the torch and JAX runtimes: the cached step's modulation has
    the guidance and pooled text too (a sampling run keeps both from step to step)."""
    from hyv_lib.runtimes.deepcache import TorchDeepCache

    first = inputs(6)
    later = {**first, "timestep": torch.tensor([500.0, 200.0])}
    expected_full, expected_cached = oracle(model, first), swapped_oracle(model, later, first)
    assert (expected_cached - oracle(model, later)).abs().max() > 1e-3  # the swap changes the result
    for runtime in (TorchDeepCache(model), jax_model):
        full, cache = runtime.run_and_cache(1, **first)
        assert (full - expected_full).abs().max() <= TOL
        cached = runtime.run_from_cache(cache, 1, **later)
        assert (cached - expected_cached).abs().max() <= TOL, type(runtime).__name__
