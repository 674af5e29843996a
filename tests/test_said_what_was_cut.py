"""What used to go silently: a prompt cut to its text encoder's window (warned, counted, recorded), which caption of a
data.json list is encoded (--caption first|random, recorded), an empty prompts file (refused), and --offload without
a GPU (one warning line, recorded as not applied)."""

import hashlib
import json

import pytest
import torch
from PIL import Image

from hyv_lib.base.presets import tiny_vocabulary
from hyv_lib.models.cogvideox.presets import COGVIDEOX_TINY
from hyv_lib.models.hunyuan_video15.presets import TINY
from hyv_lib.models.families import get_preset
from hyv_lib.cli.commands import run
from hyv_lib.models.components import load_components, text_components
from hyv_lib.pipeline.settings import resolve_settings
from hyv_lib.pipeline.text import encode_prompts, tokens_dropped
from hyv_lib.runtimes import placement
from hyv_lib.training.features import extract_features

TRAINED = get_preset("tiny_trained")
# Hand-counted: 10 + 10 + 10 = 30 words, every one in hyv-tiny's vocabulary (one word token each).
WORDS_30 = ("a red circle moving left on a gray background a "
            "blue square moving up on a black background a green "
            "triangle moving right on a purple background a red circle")
WORDS = WORDS_30.split()


@pytest.fixture(scope="module")
def trained_text():
    return load_components(TRAINED, None, list(text_components(TRAINED)))


@pytest.fixture(scope="module")
def tiny_tokenizers():
    return load_components(TINY, None, ["tokenizer", "tokenizer_2"])


def test_word_prompt_hand_counted_and_the_dropped_words_change_nothing(trained_text):
    """tiny_trained reads 24 tokens after the template's crop; its word tokenizer makes one token per known word.
    30 words: 6 dropped; 24: none (only the template's closing turn is cut, which is not the prompt's). The 25th word
    on is truly unseen: the embeddings of 25 and 30 words equal those of the first 24."""
    assert len(WORDS) == 30 and set(WORDS) <= set(tiny_vocabulary()) and TRAINED.text_len == 24
    tokenizer = trained_text["tokenizer"]
    assert len(tokenizer(WORDS_30, add_special_tokens=False).input_ids) == 30  # one token a word
    for n, expected in ((9, 0), (24, 0), (25, 1), (30, 6)):
        counts = tokens_dropped(trained_text, TRAINED, " ".join(WORDS[:n]), " ".join(WORDS[:n - 1]))
        assert counts == {"prompt_tokens_dropped": expected, "prompt_quoted_tokens_dropped": 0,
                          "negative_prompt_tokens_dropped": max(0, expected - 1),
                          "negative_prompt_quoted_tokens_dropped": 0}, n
    embeds = encode_prompts(trained_text, TRAINED, [" ".join(WORDS[:n]) for n in (24, 25, 30, 23)])
    kept = embeds["prompt_embeds"]
    assert torch.equal(kept[0], kept[1]) and torch.equal(kept[0], kept[2]) and not torch.equal(kept[0], kept[3])


def test_byte_prompt_and_quoted_text_hand_counted(tiny_tokenizers, caplog):
    """tiny's tokenizer is byte-level (one token an ASCII character), its window 128 tokens; ByT5 reads 32 bytes, its
    EOS among them. 10,000 characters: 9,872 dropped, one warning line saying so."""
    assert TINY.text_len == 128 and TINY.byt5_len == 32
    glyph = 'the word "' + "X" * 40 + '"'  # ByT5 encodes 'Text "XXX...". ': 6 + 40 + 3 = 49 bytes, keeps 31
    with caplog.at_level("WARNING", logger="hyv_lib"):
        counts = tokens_dropped(tiny_tokenizers, TINY, "b" * 10_000, glyph, warn=True)
    assert counts == {"prompt_tokens_dropped": 9_872, "prompt_quoted_tokens_dropped": 0,
                      "negative_prompt_tokens_dropped": 0, "negative_prompt_quoted_tokens_dropped": 18}
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["prompt: 9,872 of 10,000 tokens dropped (the text encoder reads 128; only the first 128 are "
                     "encoded: shorten it)",
                     "negative prompt's quoted text: 18 of 49 tokens dropped (ByT5 reads 32; only the first 31 are "
                     "encoded: shorten it)"]
    assert tokens_dropped(tiny_tokenizers, TINY, "b" * 128, "")["prompt_tokens_dropped"] == 0
    assert tokens_dropped(tiny_tokenizers, TINY, "b" * 129, "")["prompt_tokens_dropped"] == 1


def test_cogvideox_t5_count():
    """CogVideoX's T5 reads 226 tokens, its EOS the last: of 300 bytes (cogvideox_tiny's ByT5 tokenizer) 75 are
    dropped; no ByT5 glyph keys for a model without ByT5."""
    components = load_components(COGVIDEOX_TINY, None, ["tokenizer"])
    assert COGVIDEOX_TINY.text_len == 226
    assert tokens_dropped(components, COGVIDEOX_TINY, "c" * 300, "c" * 225) == {
        "prompt_tokens_dropped": 75, "negative_prompt_tokens_dropped": 0}


def test_stage1_records_and_warns(tmp_path, capsys):
    out = tmp_path / "s1"
    code = run(["stage1", "--preset", "tiny_trained", "--prompt", WORDS_30, "--negative_prompt", "a red circle",
                "--output_dir", str(out), "--text_device", "cpu"])
    err = capsys.readouterr().err
    assert code == 0, err
    config = json.loads((out / "generation_config.json").read_text())
    assert (config["prompt_tokens_dropped"], config["negative_prompt_tokens_dropped"]) == (6, 0)
    assert (config["prompt_quoted_tokens_dropped"], config["negative_prompt_quoted_tokens_dropped"]) == (0, 0)
    warned = [line for line in err.splitlines() if "tokens dropped" in line]
    assert warned == ["prompt: 6 of 30 tokens dropped (the text encoder reads 24; only the first 24 are encoded: "
                      "shorten it)"]


# ------------------------------------------------------------------------------------------------ caption lists
def _images(root, count):
    """``count`` one-frame clips (png) in ``root``."""
    for i in range(count):
        Image.new("RGB", (112, 64), (40 * i, 90, 200 - 40 * i)).save(root / f"f{i}.png")


def test_caption_lists_first_by_default_random_reproducible(tmp_path, capsys):
    _images(tmp_path, 4)
    caps = [[f"a red circle {i}", f"a blue square {i}", f"a green triangle {i}"] for i in range(4)]
    (tmp_path / "data.json").write_text(json.dumps([{"path": f"f{i}.png", "cap": caps[i]} for i in range(4)]))
    base = ["extract_features", "--data_json", str(tmp_path / "data.json"), "--preset", "tiny_trained", "--quiet",
            "--device", "cpu"]

    def index_of(folder):
        return json.loads((tmp_path / folder / "features.safetensors.index.json").read_text())

    components = load_components(TRAINED, None, [*text_components(TRAINED), "vae"])
    api = dict(preset="tiny_trained", progress=False, device="cpu", components=components)
    assert extract_features(str(tmp_path / "data.json"), output_dir=str(tmp_path / "first"), **api).ok  # default
    first = index_of("first")
    assert first["metadata"]["caption"] == "first" and "caption_seed" not in first["metadata"]
    assert [c["caption"] for c in first["clips"]] == [cap[0] for cap in caps]

    # random: the documented pick, sha256(f"{seed}:{entry}")[:8] (big-endian) mod len(cap), the same in a rerun
    picks = [int.from_bytes(hashlib.sha256(f"7:{i}".encode()).digest()[:8], "big") % 3 for i in range(4)]
    assert any(picks)  # not the first caption everywhere
    assert run([*base, "--output_dir", str(tmp_path / "random"), "--caption", "random", "--caption_seed", "7"]) == 0
    assert extract_features(str(tmp_path / "data.json"), output_dir=str(tmp_path / "again"), caption="random",
                            caption_seed=7, **api).ok
    for folder in ("random", "again"):
        index = index_of(folder)
        assert index["metadata"]["caption"] == "random" and index["metadata"]["caption_seed"] == 7
        assert [c["caption"] for c in index["clips"]] == [caps[i][p] for i, p in enumerate(picks)]
    capsys.readouterr()
    # another choice into the same folder is refused; a bad choice is bad input
    assert run([*base, "--output_dir", str(tmp_path / "random")]) == 2
    assert "caption" in capsys.readouterr().err
    assert run([*base, "--output_dir", str(tmp_path / "bad"), "--caption", "longest"]) == 2
    assert capsys.readouterr().err.startswith("error: --caption: must be one of first, random")
    # a folder made before --caption (no "caption" in its metadata) encoded the first: a default rerun adds to it
    index = index_of("first")
    del index["metadata"]["caption"]
    (tmp_path / "first" / "features.safetensors.index.json").write_text(json.dumps(index))
    assert extract_features(str(tmp_path / "data.json"), output_dir=str(tmp_path / "first"), **api).skipped


# ------------------------------------------------------------------------------------------ empty prompts file
@pytest.mark.parametrize("text", ["", "\n\n", "# a comment\n   \n# another\n"])
def test_an_empty_prompts_file_is_refused(tmp_path, capsys, text):
    (tmp_path / "p.txt").write_text(text)
    code = run(["generate", "--preset", "tiny", "--prompts_file", str(tmp_path / "p.txt"),
                "--output_dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("error: --prompts_file: ") and "holds no prompt" in err
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------------------------- offload, no GPU
def test_offload_without_a_gpu_is_one_warning_and_recorded(tmp_path, capsys, monkeypatch):
    assert not torch.cuda.is_available()  # this machine
    for mode in ("block", "model"):
        record = resolve_settings(TINY, offload=mode).config()
        assert {k: record[k] for k in ("offload", "offload_requested", "offload_applied")} == {
            "offload": None, "offload_requested": mode, "offload_applied": False}
    assert "offload_requested" not in resolve_settings(TINY).config()
    with monkeypatch.context() as m:  # where there is a GPU (the CPU counted as one): applied and recorded as before
        m.setattr(placement, "OFFLOAD_DEVICE_TYPES", ("cuda", "cpu"))
        record = resolve_settings(TINY, offload="block").config()
        assert (record["offload"], record["offload_requested"], record["offload_applied"]) == ("block", "block", True)

    out = tmp_path / "run"  # generate resolves the settings twice (its own check, then stage 2): one line all the same
    code = run(["generate", "--preset", "tiny", "--prompt", "a red ball", "--output_dir", str(out), "--offload",
                "block", "--video_length", "1", "--num_inference_steps", "1", "--text_device", "cpu"])
    err = capsys.readouterr().err
    assert code == 0, err
    lines = [line for line in err.splitlines() if "--offload" in line]
    assert lines == ["--offload block: no GPU here, so nothing is offloaded (the weights stay on the host CPU)"]
    config = json.loads((out / "generation_config.json").read_text())
    assert (config["offload"], config["offload_requested"], config["offload_applied"]) == (None, "block", False)

    (tmp_path / "p.txt").write_text("a red ball\na blue ball\n")  # one kept model for both prompts: one line too
    code = run(["generate", "--preset", "tiny", "--prompts_file", str(tmp_path / "p.txt"), "--output_dir",
                str(tmp_path / "many"), "--offload", "model", "--video_length", "1", "--num_inference_steps", "1",
                "--text_device", "cpu", "--quiet"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert [line for line in err.splitlines() if "--offload" in line] == [
        "--offload model: no GPU here, so nothing is offloaded (the weights stay on the host CPU)"]
    for folder in ("0000", "0001"):
        config = json.loads((tmp_path / "many" / folder / "generation_config.json").read_text())
        assert (config["offload"], config["offload_requested"], config["offload_applied"]) == (None, "model", False)
