"""Forward keyword arguments for the tiny transformer with real padding, shared by the runtime tests."""

import torch

from hyv_lib.presets import get_preset

TINY = get_preset("tiny")


def forward_kwargs(seed=0, image=False, text_lengths=(14, 40), byt5_lengths=(0, 9), latent=(2, 6, 10)):
    """A CFG-style batch: one sample per entry of ``text_lengths``, valid text/ByT5 tokens first,
    t2v (zero image embeddings) unless ``image``; ``latent`` is (frames, height, width)."""
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
