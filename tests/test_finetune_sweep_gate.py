"""The fine-tuning gate's data split and scoring (hyv_lib.tiny.finetune_gate), checked by hand."""

from hyv_lib.tiny import data
from hyv_lib.tiny import finetune_gate as gate


def test_the_held_out_captions_are_new_but_made_of_seen_parts():
    assert len(gate.NEW) == 24 and len(gate.HELD_OUT) == 8 and len(gate.TRAIN) == 16
    assert not set(gate.HELD_OUT) & set(gate.TRAIN)
    for combo in gate.HELD_OUT:  # every shape, direction and background of a held-out caption is trained on
        assert any(t.shape == combo.shape for t in gate.TRAIN)
        assert any(t.direction == combo.direction for t in gate.TRAIN)
        assert any(t.background == combo.background for t in gate.TRAIN)
    assert len(gate.DATASETS["issue"]) == 12  # the issue's 12 clips of the new colour, nothing else
    assert {c.color for c, _ in gate.DATASETS["issue"]} == {gate.NEW_COLOR}
    assert all(c.color in data.COLORS for c in gate.KNOWN_PROBE) and len(gate.KNOWN_PROBE) == 8


def test_score_counts_new_and_known_colours_separately():
    combos = [gate.HELD_OUT[0], gate.HELD_OUT[1], gate.KNOWN_PROBE[0], gate.KNOWN_PROBE[1]]
    reads = [gate.NEW_COLOR, None, gate.KNOWN_PROBE[0].color, gate.NEW_COLOR]
    got = gate.score(reads, combos)
    assert (got["new"], got["new_total"], got["known"], got["known_total"]) == (1, 2, 1, 2)
    assert gate.caption(gate.HELD_OUT[0], "cyan").split()[1] == "cyan"


def test_colour_twins_change_the_colour_word_only():
    issue = [c for c, _ in gate.DATASETS["issue"]]
    assert [c for c, _ in gate.DATASETS["twins"]] == issue + gate.TWINS
    for new, twin in zip(issue, gate.TWINS):
        assert (twin.shape, twin.direction, twin.background) == (new.shape, new.direction, new.background)
    assert [t.color for t in gate.TWINS[:4]] == ["red", "green", "blue", "yellow"]  # turning by one per caption
    assert set(gate.TWINS) <= set(data.split_combos()[0]) and not set(gate.TWINS) & set(gate.KNOWN_PROBE)
