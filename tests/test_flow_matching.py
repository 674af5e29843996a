"""hyv_lib.models.flow_matching against hand-worked values and closed forms; the tiny trainer's loss unchanged by it."""

import math

import pytest
import torch

from hyv_lib.models.flow_matching import (
    TRAIN_EPS,
    condition_channels,
    flow_matching_loss,
    sample_sigmas,
    shift_sigmas,
    training_inputs,
)


def test_shift_warp_hand_worked():
    u = torch.tensor([0.0, 0.25, 0.5, 1.0])
    # s = 3: 3u / (1 + 2u) -> 0, 0.75 / 1.5, 1.5 / 2, 3 / 3
    assert torch.allclose(shift_sigmas(u, 3.0), torch.tensor([0.0, 0.5, 0.75, 1.0]))
    # s = 5 at u = 0.5: 2.5 / 3
    assert shift_sigmas(torch.tensor([0.5]), 5.0).item() == pytest.approx(2.5 / 3)
    assert torch.equal(shift_sigmas(u, 1.0), u)


def test_uniform_is_the_tiny_trainers_draw():
    got = sample_sigmas(6, shift=3.0, sampling="uniform", generator=torch.Generator().manual_seed(1))
    u = torch.rand(6, generator=torch.Generator().manual_seed(1))
    assert torch.equal(got, 3.0 * u / (1 + 2.0 * u))


def _normal_cdf(x: float) -> float:
    return 0.5 * (1 + math.erf(x / math.sqrt(2)))


@pytest.mark.parametrize("shift", [1.0, 3.0])
def test_logit_normal_distribution_closed_form(shift):
    """P(sigma <= x) = Phi(logit(u(x))) with u(x) the inverse warp x / (s - (s - 1) x), undoing the eps squeeze."""
    n = 200_000
    sigma = sample_sigmas(n, shift=shift, generator=torch.Generator().manual_seed(0)).double()
    lo, hi = shift_sigmas(torch.tensor(TRAIN_EPS), shift), shift_sigmas(torch.tensor(1 - TRAIN_EPS), shift)
    assert sigma.min() >= lo - 1e-7 and sigma.max() <= hi + 1e-7
    for x in (0.1, 0.3, 0.5, 0.75, 0.9):
        u = x / (shift - (shift - 1) * x)
        v = (u - TRAIN_EPS) / (1 - 2 * TRAIN_EPS)
        expected = _normal_cdf(math.log(v / (1 - v)))
        empirical = (sigma <= x).double().mean().item()
        assert abs(empirical - expected) < 4e-3, (x, empirical, expected)  # ~3.5 standard errors at n = 200k
    median = sigma.median().item()
    assert median == pytest.approx(shift / (shift + 1), abs=4e-3)  # warp(1/2) = s / (s + 1): 0.5 and 0.75
    if shift == 1.0:
        assert sigma.mean().item() == pytest.approx(0.5, abs=2e-3)  # sigmoid(z) is symmetric about 1/2


def test_unknown_sampling_is_refused():
    with pytest.raises(ValueError, match="logit_normal"):
        sample_sigmas(2, shift=3.0, sampling="lognormal")


def test_training_inputs_hand_worked():
    x0 = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).view(1, 2, 3, 1, 1)
    noise = torch.tensor([-1.0, 0.0, 1.0, 2.0, 0.0, -2.0]).view(1, 2, 3, 1, 1)
    sigma = torch.tensor([0.25])
    hidden, target = training_inputs(x0, noise, sigma)
    assert hidden.shape == (1, 5, 3, 1, 1)
    # 0.75 x0 + 0.25 noise
    assert torch.equal(hidden[0, :2, :, 0, 0], torch.tensor([[0.5, 1.5, 2.5], [3.5, 3.75, 4.0]]))
    assert torch.equal(hidden[0, 2:], torch.zeros(3, 3, 1, 1))  # t2v: condition latents and mask all zero
    assert torch.equal(target[0, :, :, 0, 0], torch.tensor([[-2.0, -2.0, -2.0], [-2.0, -5.0, -8.0]]))

    cond = torch.tensor([7.0, 8.0]).view(1, 2, 1, 1, 1)
    hidden, _ = training_inputs(x0, noise, sigma, cond)
    assert torch.equal(hidden[0, 2:4, :, 0, 0], torch.tensor([[7.0, 0.0, 0.0], [8.0, 0.0, 0.0]]))
    assert torch.equal(hidden[0, 4, :, 0, 0], torch.tensor([1.0, 0.0, 0.0]))  # mask: 1 on latent frame 0 only
    assert torch.equal(condition_channels(x0, cond), hidden[:, 2:])


def test_flow_matching_loss_in_fp32():
    prediction = torch.tensor([1.0, 3.0], dtype=torch.float16)
    loss = flow_matching_loss(prediction, torch.tensor([0.0, 1.0]))
    assert loss.dtype == torch.float32 and loss.item() == 2.5  # (1 + 4) / 2


def test_tiny_dit_loss_keeps_its_math():
    """The tiny trainer's dit_loss now calls this module; its loss is bit-identical to its former inline code."""
    from hyv_lib.models.families import get_preset
    from hyv_lib.models.components import build_tiny_components
    from hyv_lib.models.hunyuan_video15.components import example_forward_kwargs
    from hyv_lib.tiny.train import dit_loss

    preset = get_preset("tiny")
    transformer = build_tiny_components(preset, names=["transformer"])["transformer"]
    kwargs = example_forward_kwargs(preset)
    conditioning = {k: v for k, v in kwargs.items() if k not in ("hidden_states", "timestep")}
    g = torch.Generator().manual_seed(3)
    x0 = torch.randn(2, preset.latent_channels, 2, 6, 10, generator=g)
    for cond_latents in (None, torch.randn(2, preset.latent_channels, 1, 6, 10, generator=g)):
        got = dit_loss(transformer, x0, conditioning, 3.0, torch.Generator().manual_seed(7), cond_latents)
        # the former inline code of dit_loss
        gen = torch.Generator().manual_seed(7)
        b, c, f, h, w = x0.shape
        noise = torch.randn(x0.shape, generator=gen)
        u = torch.rand(b, generator=gen)
        sigma = 3.0 * u / (1 + 2.0 * u)
        s = sigma.view(b, 1, 1, 1, 1)
        condition = torch.zeros(b, c + 1, f, h, w)
        if cond_latents is not None:
            condition[:, :c, :1] = cond_latents
            condition[:, c, 0] = 1.0
        hidden = torch.cat([(1 - s) * x0 + s * noise, condition], dim=1)
        prediction = transformer(hidden_states=hidden, timestep=sigma * 1000, **conditioning, return_dict=False)[0]
        expected = (prediction.float() - (noise - x0)).pow(2).mean()
        assert torch.equal(got, expected)
