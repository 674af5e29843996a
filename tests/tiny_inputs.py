"""Forward keyword arguments for the tiny transformer with real padding, shared by the runtime tests."""

from hyv_lib.models.families import get_preset
from hyv_lib.models.hunyuan_video15.components import example_forward_kwargs

TINY = get_preset("tiny")


def forward_kwargs(seed=0, image=False, text_lengths=(14, 40), byt5_lengths=(0, 9), latent=(2, 6, 10)):
    """:func:`hyv_lib.models.hunyuan_video15.components.example_forward_kwargs` for the tiny preset."""
    return example_forward_kwargs(TINY, seed=seed, image=image, text_lengths=text_lengths, byt5_lengths=byt5_lengths,
                                  latent=latent)
