"""How many of a text's own tokens an encoder's truncation drops, counted from its tokenizer."""

from __future__ import annotations


def kept(span: tuple[int, int], length: int, window: int, side: str) -> int:
    """Tokens of ``span`` [start, end) left when a sequence of ``length`` is truncated to ``window`` on ``side``."""
    first, last = (0, min(window, length)) if side != "left" else (max(0, length - window), length)
    return max(0, min(span[1], last) - max(span[0], first))


def plain_cut(tokenizer, text: str, max_length: int) -> tuple[int, int]:
    """(dropped, own) tokens of ``text`` tokenized with special tokens and truncated to ``max_length`` (ByT5's glyph
    text, T5's prompt): its own tokens are counted without the special ones (the EOS that truncation keeps)."""
    own = len(tokenizer(text, add_special_tokens=False).input_ids)
    full = len(tokenizer(text, add_special_tokens=True).input_ids)
    return own - min(own, max(0, max_length - (full - own))), own
