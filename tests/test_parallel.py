"""Ulysses sequence parallelism on gloo CPU processes: equal to diffusers' forward, bad head splits rejected."""

import copy
import time

import pytest
import torch
import torch.distributed as dist

from hyv_lib.models import build_tiny_components
from hyv_lib.parallel import UlyssesTransformer, check_heads, run_distributed, shard_length
from hyv_lib.presets import get_preset

TINY = get_preset("tiny")


def inputs(seed=0, image=False, text_lengths=(14, 40), byt5_lengths=(0, 9), latent=(2, 6, 10)):
    g = torch.Generator().manual_seed(seed)
    b, c = len(text_lengths), TINY.latent_channels
    text_mask = (torch.arange(TINY.text_len)[None] < torch.tensor(text_lengths)[:, None]).long()
    byt5_mask = (torch.arange(TINY.byt5_len)[None] < torch.tensor(byt5_lengths)[:, None]).long()
    image_embeds = torch.randn(b, TINY.image_tokens, TINY.image_dim, generator=g) if image else \
        torch.zeros(b, TINY.image_tokens, TINY.image_dim)
    return dict(hidden_states=torch.randn(b, 2 * c + 1, *latent, generator=g), timestep=torch.tensor([700.0] * b),
                encoder_hidden_states=torch.randn(b, TINY.text_len, TINY.text_dim, generator=g),
                encoder_attention_mask=text_mask,
                encoder_hidden_states_2=torch.randn(b, TINY.byt5_len, TINY.byt5_dim, generator=g),
                encoder_attention_mask_2=byt5_mask, image_embeds=image_embeds)


# Video token counts 120 (divides 2 and 4), 35 (divides neither), 3 (fewer tokens than 4 ranks: one
# rank holds only padding); t2v and i2v; CFG-style batches with different text lengths, no/partial ByT5.
CASES = [
    dict(seed=0),
    dict(seed=1, image=True, text_lengths=(128, 1), byt5_lengths=(32, 0), latent=(1, 5, 7)),
    dict(seed=2, text_lengths=(3, 77), byt5_lengths=(5, 5), latent=(3, 1, 1)),
]


def tiny_transformer(heads):
    """The tiny preset's transformer (2 heads) or a variant with more heads of the same width."""
    if heads == TINY.transformer["num_attention_heads"]:
        return build_tiny_components(TINY, names=["transformer"])["transformer"]
    from diffusers import HunyuanVideo15Transformer3DModel

    torch.manual_seed(3)
    return HunyuanVideo15Transformer3DModel(**{**TINY.transformer, "num_attention_heads": heads}).eval()


def compare_with_oracle(heads):
    """On every rank: Ulysses vs diffusers' forward for each case. Returns (max errors, max spread of
    the outputs across ranks, a Ulysses-vs-eager 3-step denoise difference, seconds per Ulysses call)."""
    from hyv_lib import pipeline

    world = dist.get_world_size()
    oracle = tiny_transformer(heads)
    ulysses = UlyssesTransformer(copy.deepcopy(oracle))
    errors, spreads, seconds = [], [], []
    for case in CASES:
        kwargs = inputs(**case)
        with torch.no_grad():
            expected = oracle(**kwargs).sample
        start = time.perf_counter()
        out = ulysses(**kwargs)
        seconds.append(time.perf_counter() - start)
        assert out.shape == expected.shape
        errors.append((out - expected).abs().max().item())
        every = [torch.empty_like(out) for _ in range(world)]
        dist.all_gather(every, out)
        spreads.append(max((o - out).abs().max().item() for o in every))

    # The pipeline's loop takes the wrapper as a transformer step unchanged.
    kwargs = inputs(seed=4, latent=(1, 3, 5))
    conditioning = {k: v for k, v in kwargs.items() if k not in ("hidden_states", "timestep")}
    latents = pipeline.initial_latents((1, TINY.latent_channels, 1, 3, 5), seed=0)
    runs = []
    for step in (pipeline.torch_step(oracle), ulysses):
        scheduler = build_tiny_components(TINY, names=["scheduler"])["scheduler"]
        runs.append(pipeline.denoise(step, latents, conditioning, scheduler, num_inference_steps=3,
                                     guidance_scale=6.0, progress=False))
    return errors, spreads, (runs[0] - runs[1]).abs().max().item(), seconds


def bad_split_message():
    with pytest.raises(ValueError) as info:
        UlyssesTransformer(tiny_transformer(2))
    return str(info.value)


def check_world(heads, expect_bad_split):
    result = {"oracle": compare_with_oracle(heads)}
    if expect_bad_split:
        result["bad_split"] = bad_split_message()
    return result


@pytest.mark.parametrize("world_size", [2, 4])
def test_ulysses_equals_the_oracle(world_size):
    result = run_distributed(check_world, world_size, 4, world_size > 2, timeout=240)
    errors, spreads, loop_error, seconds = result["oracle"]
    print(f"world {world_size}: max errors per case {['%.1e' % e for e in errors]}, rank spread {max(spreads)}, "
          f"3-step loop {loop_error:.1e}, seconds per call {['%.3f' % s for s in seconds]}")
    assert max(errors) <= 1e-5
    assert max(spreads) == 0.0  # every rank returns the same tensor
    assert loop_error <= 1e-4
    if world_size > 2:
        assert result["bad_split"].startswith("2 heads cannot be split over 4 ranks")


def test_two_heads_on_two_ranks():
    """The tiny preset itself (2 heads): one head per rank."""
    errors = run_distributed(compare_with_oracle, 2, 2, timeout=240)[0]
    assert max(errors) <= 1e-5


def test_head_check_and_shards():
    check_heads(16, 8)
    with pytest.raises(ValueError, match=r"^16 heads cannot be split over 3 ranks.*1, 2, 4, 8, 16\)$"):
        check_heads(16, 3)
    assert [shard_length(n, 4) for n in (120, 35, 3)] == [30, 9, 1]


def test_needs_an_initialised_process_group():
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    with pytest.raises(RuntimeError, match="init_process_group"):
        UlyssesTransformer(tiny_transformer(2))
