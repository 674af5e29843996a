"""Text encoding: diffusers' recipe on the offline tiny tokenizer."""

import pytest
import torch

from hyv_lib.models.hunyuan_video15.presets import TINY_TRAINED
from hyv_lib.models.families import get_preset
from hyv_lib.models.components import build_tiny_components
from hyv_lib.models.hunyuan_video15.components import build_tiny_tokenizer
from hyv_lib.pipeline.text import encode_prompts
from hyv_lib.models.hunyuan_video15.text import system_message, template_crop_start

TINY = get_preset("tiny")


@pytest.fixture(scope="module")
def text_components():
    return build_tiny_components(TINY, names=["tokenizer", "text_encoder", "tokenizer_2", "text_encoder_2"])


def test_tokenizer_is_offline_lossless_and_round_trips(tmp_path):
    from transformers import Qwen2Tokenizer

    tok = build_tiny_tokenizer()
    text = "a red ball — «ünïcode» 🎈"
    ids = tok(text, add_special_tokens=False).input_ids
    assert tok.decode(ids) == text and tok.unk_token_id is None
    tok.save_pretrained(tmp_path)
    assert Qwen2Tokenizer.from_pretrained(tmp_path)(text).input_ids == tok(text).input_ids


def test_word_tokenizer_gives_each_caption_word_one_token_and_stays_lossless(tmp_path):
    """hyv-tiny's tokenizer: one token per word of every caption (unseen cyan too), bytes for the rest."""
    from transformers import Qwen2Tokenizer

    from hyv_lib.tiny import data

    tok = build_tiny_tokenizer(word_tokens=True)
    for caption in ("a red circle moving left on a black background", "a cyan square moving up on a gray background"):
        assert len(tok(caption, add_special_tokens=False).input_ids) == len(caption.split())
    text = "a red ball — «ünïcode» 🎈"
    assert tok.decode(tok(text, add_special_tokens=False).input_ids) == text and tok.unk_token_id is None
    tok.save_pretrained(tmp_path)
    caption = data.all_combos()[-1].caption
    assert Qwen2Tokenizer.from_pretrained(tmp_path)(caption).input_ids == tok(caption).input_ids
    assert TINY_TRAINED.word_tokens and not TINY.word_tokens


def test_crop_start_removes_exactly_the_template_prefix(text_components):
    tok = text_components["tokenizer"]
    crop = template_crop_start(tok)
    conv = [{"role": "system", "content": system_message()}, {"role": "user", "content": "a red ball"}]
    ids = tok.apply_chat_template(conv, add_generation_prompt=True, tokenize=True, return_dict=True).input_ids
    assert tok.decode(ids[crop:]).startswith("a red ball")
    assert "<|im_start|>user" in tok.decode(ids[:crop])


def test_mllm_embeddings_are_hidden_states_minus_3_after_the_crop(text_components):
    tok, enc = text_components["tokenizer"], text_components["text_encoder"]
    out = encode_prompts(text_components, TINY, ["a red ball"])
    crop = template_crop_start(tok)
    conv = [{"role": "system", "content": system_message()}, {"role": "user", "content": "a red ball"}]
    batch = tok.apply_chat_template([conv], add_generation_prompt=True, tokenize=True, return_dict=True,
                                    padding="max_length", max_length=crop + TINY.text_len, return_tensors="pt")
    hidden = enc(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                 output_hidden_states=True).hidden_states[-3]
    torch.testing.assert_close(out["prompt_embeds"], hidden[:, crop:], rtol=0, atol=0)
    assert out["prompt_embeds"].shape == (1, TINY.text_len, TINY.text_dim)
    mask = out["prompt_embeds_mask"][0]
    n = int(mask.sum())
    assert mask[:n].all() and not mask[n:].any()  # valid tokens first, then padding
    assert n == len(tok("a red ball<|im_end|>\n<|im_start|>assistant\n").input_ids)


def test_byt5_encodes_only_quoted_text(text_components):
    out = encode_prompts(text_components, TINY, ["no quotes here", 'a sign saying "HELLO"', ""])
    e2, m2 = out["prompt_embeds_2"], out["prompt_embeds_mask_2"]
    assert e2.shape == (3, TINY.byt5_len, TINY.byt5_dim)
    assert not m2[0].any() and not e2[0].any()  # no quoted text: zeros and mask 0
    assert m2[1].sum() == len('Text "HELLO". '.encode()) + 1  # bytes + </s>
    assert not m2[2].any()


def test_empty_prompt_is_valid_and_finite(text_components):
    out = encode_prompts(text_components, TINY, [""])
    assert all(torch.isfinite(v.float()).all() for v in out.values())
    assert out["prompt_embeds_mask"].sum() > 0  # diffusers substitutes " " for an empty prompt


def test_word_tokenizer_is_the_one_hyv_tiny_was_trained_with():
    """The shipped DiT learned to read particular rows of the random text-encoder embedding: the tokenizer the
    training script builds must number every token as the bundled one does."""
    from transformers import Qwen2Tokenizer

    from hyv_lib.tiny import data

    bundled = Qwen2Tokenizer.from_pretrained(f"{TINY_TRAINED.bundled_path}/tokenizer")
    built = build_tiny_tokenizer(word_tokens=True)
    assert built.get_vocab() == bundled.get_vocab()
    for caption in (data.all_combos()[7].caption, "a orange square moving up on a gray background"):
        assert built(caption).input_ids == bundled(caption).input_ids
