"""Forward keyword arguments for the tiny transformer with real padding, shared by the runtime tests."""

from hyv_lib.models.families import get_preset
from hyv_lib.models.hunyuan_video15.components import example_forward_kwargs

TINY = get_preset("tiny")


def forward_kwargs(seed=0, image=False, text_lengths=(14, 40), byt5_lengths=(0, 9), latent=(2, 6, 10)):
    """:func:`hyv_lib.models.hunyuan_video15.components.example_forward_kwargs` for the tiny preset."""
    return example_forward_kwargs(TINY, seed=seed, image=image, text_lengths=text_lengths, byt5_lengths=byt5_lengths,
                                  latent=latent)


def replay_draws(features, picks, generator, shift: float):
    """The random draws of ``hyv_lib.training.loop.build_batch`` replayed by hand from the generator state it started
    at, in its order (caption-dropout coins, noise, the logit-normal z): (clips, drop, x0, noise, sigma) of the
    flow-matching objective at ``shift`` (sigma = shift u / (1 + (shift - 1) u))."""
    import torch

    clips = [features[i] for i in picks]
    drop = torch.rand(len(picks), generator=generator) < 0.5
    x0 = torch.stack([c["latents"] for c in clips])
    noise = torch.randn(x0.shape, generator=generator)
    u = torch.sigmoid(torch.randn(len(picks), generator=generator)) * (1 - 2e-5) + 1e-5
    return clips, drop, x0, noise, shift * u / (1 + (shift - 1) * u)


def write_image_clips(folder, captions, seed=0, size=(64, 112)):
    """One random PNG image (a one-frame clip) per caption in ``folder`` and a data.json listing them; returns the
    data.json's path."""
    import json

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    entries = []
    for i, caption in enumerate(captions):
        Image.fromarray(rng.integers(0, 255, (*size, 3), dtype=np.uint8)).save(folder / f"img{i}.png")
        entries.append({"path": f"img{i}.png", "cap": caption})
    (folder / "data.json").write_text(json.dumps(entries))
    return str(folder / "data.json")
