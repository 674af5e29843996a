"""Token layout: sizes from the presets and the valid-first gather against diffusers' own reorder."""

import torch

from hyv_lib.models.families import get_preset
from hyv_lib.models.components import build_tiny_components
from hyv_lib.models.hunyuan_video15.layout import context_tokens, dense_mask_bytes, joint_sequence_length, valid_first_order

TINY = get_preset("tiny")


def test_real_sizes():
    p720, p480 = get_preset("720p_t2v"), get_preset("480p_t2v")
    assert context_tokens(p720) == 1985
    assert joint_sequence_length(p720, 720, 1280, 121) == 31 * 45 * 80 + 1985
    assert dense_mask_bytes(p720, 720, 1280, 121, batch=1) == 113_585**2  # ~12.0 GiB per block call
    assert joint_sequence_length(p480, 480, 848, 121) == 31 * 30 * 53 + 1985


def test_valid_first_order_matches_diffusers_reorder():
    """Capture the context entering block 0 of diffusers' forward and rebuild it with our gather."""
    model = build_tiny_components(TINY, names=["transformer"])["transformer"]
    g = torch.Generator().manual_seed(0)
    b, c = 2, TINY.latent_channels
    text_mask = (torch.arange(TINY.text_len)[None] < torch.tensor([[5], [77]])).long()
    byt5_mask = (torch.arange(TINY.byt5_len)[None] < torch.tensor([[0], [12]])).long()
    captured = {}
    hooks = [
        model.context_embedder.register_forward_hook(lambda m, a, out: captured.__setitem__("text", out)),
        model.context_embedder_2.register_forward_hook(lambda m, a, out: captured.__setitem__("byt5", out)),
        model.transformer_blocks[0].register_forward_pre_hook(
            lambda m, args: captured.update(context=args[1], mask=args[3])),
    ]
    with torch.no_grad():
        model(hidden_states=torch.randn(b, 2 * c + 1, 1, 2, 2, generator=g), timestep=torch.tensor([900.0, 900.0]),
              encoder_hidden_states=torch.randn(b, TINY.text_len, TINY.text_dim, generator=g),
              encoder_attention_mask=text_mask,
              encoder_hidden_states_2=torch.randn(b, TINY.byt5_len, TINY.byt5_dim, generator=g),
              encoder_attention_mask_2=byt5_mask, image_embeds=torch.zeros(b, TINY.image_tokens, TINY.image_dim))
    for h in hooks:
        h.remove()
    cond = model.cond_type_embed.weight
    image = torch.zeros(b, TINY.image_tokens, cond.shape[1]) + cond[2]  # t2v: image tokens zeroed, then + type
    sources = [image, captured["byt5"] + cond[1], captured["text"] + cond[0]]
    image_mask = torch.zeros(b, TINY.image_tokens)  # t2v: no valid image token
    order, mask = valid_first_order(image_mask, byt5_mask, text_mask)
    keep = torch.cat([torch.ones(b, TINY.image_tokens), byt5_mask, text_mask], 1).bool()  # invalid text is zeroed
    context = (torch.cat(sources, 1) * keep[..., None]).gather(1, order[..., None].expand(-1, -1, cond.shape[1]))
    assert torch.equal(mask, captured["mask"])
    torch.testing.assert_close(context, captured["context"], rtol=0, atol=0)
    assert mask[0].sum() == 5 and mask[1].sum() == 89 and mask[1, :89].all()
