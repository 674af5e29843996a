"""The procedural dataset: captions, the held-out split, rendering, and the reader that grades generations."""

import numpy as np
import pytest

from hyv_lib.runtimes.vae import to_uint8_frames
from hyv_lib.tiny import data, quality


def test_split_is_disjoint_and_covers_every_word():
    train, held = data.split_combos()
    assert len(train) == 135 and len(held) == 45
    assert not set(train) & set(held)
    assert set(train) | set(held) == set(data.all_combos())
    for attr, values in (("color", data.COLORS), ("shape", data.SHAPES), ("direction", data.DIRECTIONS),
                         ("background", data.BACKGROUNDS)):
        assert {getattr(c, attr) for c in train} == set(values)
    assert data.split_combos() == (train, held)  # seeded


def test_render_is_seeded_in_range_and_moves_the_right_way():
    combo = data.Combo("red", "triangle", "up", "gray")
    clip = data.render_clip(combo, seed=3)
    assert clip.shape == (3, data.FRAMES, data.HEIGHT, data.WIDTH) and clip.dtype == np.float32
    assert clip.min() >= -1 and clip.max() <= 1
    np.testing.assert_array_equal(clip, data.render_clip(combo, seed=3))
    assert not np.array_equal(clip, data.render_clip(combo, seed=4))
    reading = quality.read_video(to_uint8_frames(clip))
    assert (reading.color, reading.direction, reading.background) == ("red", "up", "gray")


def test_a_one_frame_clip_is_an_image_of_the_same_shape():
    """frames=1 (4n+1 with n=0) renders an image (train_vae(clip_size=(1, H, W)) trains on images): the seed's
    shape and size, placed anywhere along the direction's axis since a still image has no path to fit."""
    combo = data.Combo("blue", "circle", "left", "black")
    image = data.render_clip(combo, seed=5, frames=1)
    video = data.render_clip(combo, seed=5)
    assert image.shape == (3, 1, data.HEIGHT, data.WIDTH)
    area = [float((clip[:, 0] > -1).any(axis=0).sum()) for clip in (image, video)]  # pixels touched by the shape
    assert abs(area[0] - area[1]) <= 0.02 * area[1], area
    reading = quality.read_video(to_uint8_frames(image))
    assert (reading.color, reading.background) == ("blue", "black")
    with pytest.raises(ValueError, match="4n\\+1"):
        data.render_clip(combo, seed=5, frames=2)


def test_reader_is_right_on_every_ground_truth_caption():
    combos = data.all_combos()
    readings = [quality.read_video(to_uint8_frames(data.render_clip(c, seed=i))) for i, c in enumerate(combos)]
    assert quality.attribute_rates(readings, combos) == {"color": 1.0, "direction": 1.0, "background": 1.0}


def test_unseen_colors_render_and_read_only_with_their_palette():
    palette = {**data.COLORS, **data.UNSEEN_COLORS}
    for color in data.UNSEEN_COLORS:
        clip = to_uint8_frames(data.render_clip(data.Combo(color, "circle", "left", "black"), seed=0))
        assert quality.read_video(clip, colors=palette).color == color
        assert quality.read_video(clip).color != color
        # Edge pixels blend into the background, so the mean is near (not at) the color.
        np.testing.assert_allclose(quality.foreground_rgb(clip), data.UNSEEN_COLORS[color], atol=0.08)
    assert quality.foreground_rgb(np.zeros((3, 8, 8, 3), np.uint8)) is None


def test_captions_round_trip_and_bad_input_is_named():
    for combo in data.all_combos()[:20]:
        assert data.parse_caption(combo.caption) == combo
    with pytest.raises(ValueError, match="'magenta'"):
        data.parse_caption("a magenta circle moving left on a black background")
    with pytest.raises(ValueError, match="caption must read"):
        data.parse_caption("a red circle")
    with pytest.raises(ValueError, match="4n\\+1"):
        data.render_clip(data.all_combos()[0], seed=0, frames=8)
    with pytest.raises(ValueError, match="color must be one of"):
        data.render_clip(data.Combo("magenta", "circle", "left", "black"), seed=0)
    with pytest.raises(ValueError, match="num_held_out"):
        data.split_combos(num_held_out=0)


def test_reader_reports_an_empty_video_as_no_shape():
    blank = np.zeros((9, 64, 112, 3), np.uint8)
    reading = quality.read_video(blank)
    assert reading.color is None and reading.direction is None and reading.background == "black"
    with pytest.raises(ValueError, match="frames"):
        quality.read_video(blank[0])


def test_shapes_move_at_the_documented_speed():
    """SPEED bounds the travel: 13-20 px over the 9 frames at 64 px height, for every direction."""
    low, high = (s * data.HEIGHT * (data.FRAMES - 1) for s in data.SPEED)
    for i, combo in enumerate(data.all_combos()[::7]):
        reading = quality.read_video(to_uint8_frames(data.render_clip(combo, seed=i)))
        assert reading.direction == combo.direction
        assert low - 1 <= reading.travel_px <= high + 1, (combo, reading.travel_px)


def test_the_frozen_tokenizer_words_are_the_datasets_and_build_the_shipped_tokenizer():
    """hyv-tiny's tokenizer words live in presets (the model), not in the training data module: they must still be the
    dataset's words in its order, build exactly the bundled tokenizer, and make each word one token."""
    from hyv_lib.base.presets import tiny_tokenizer_captions, tiny_vocabulary
    from hyv_lib.models.families import get_preset
    from hyv_lib.models.components import load_components
    from hyv_lib.models.hunyuan_video15.components import build_tiny_tokenizer

    expected = [data.Combo(c, s, d, b).caption for c in [*data.COLORS, "cyan"] for s in data.SHAPES
                for d in data.DIRECTIONS for b in data.BACKGROUNDS]
    assert tiny_tokenizer_captions() == expected
    built = build_tiny_tokenizer(word_tokens=True)
    shipped = load_components(get_preset("tiny_trained"), None, ["tokenizer"])["tokenizer"]
    assert built.get_vocab() == shipped.get_vocab()
    def tokens(text):
        return len(built(text, add_special_tokens=False).input_ids)

    assert all(tokens(caption) == len(caption.split()) == 9 for caption in expected)  # one token per word
    assert {w for c in expected for w in c.split()} == set(tiny_vocabulary())
    assert tokens("a dark circle moving left on a gray background") > 9  # out of vocabulary: split


def test_centroid_track_follows_the_shape_frame_by_frame():
    """centroid_track gives the (x, y) the reader's direction comes from: a shape moving right has x rising every
    frame at a steady y, first to last as far as read_video's travel; a frame without a shape is NaN."""
    clip = to_uint8_frames(data.render_clip(data.Combo("green", "square", "right", "black"), seed=2))
    track = quality.centroid_track(clip)
    assert track.shape == (data.FRAMES, 2)
    assert (np.diff(track[:, 0]) > 0).all() and np.ptp(track[:, 1]) < 0.5
    assert np.hypot(*(track[-1] - track[0])) == pytest.approx(quality.read_video(clip).travel_px)
    clip[-1] = clip[-1, 0, 0]  # the last frame: background only
    assert np.isnan(quality.centroid_track(clip)[-1]).all() and not np.isnan(quality.centroid_track(clip)[:-1]).any()
