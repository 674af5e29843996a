"""The book checker's page rules, on hand-written HTML in the form myst-nb renders cell outputs."""

import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("check_book", ROOT / "tools" / "check_book.py")
check_book = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_book)


def output(kind, text):
    return f'<div class="output {kind} highlight-myst-ansi notranslate"><div class="highlight"><pre><span></span>{text}</pre></div></div>'


def problems(page, paths=("/work/proj",)):
    return check_book.static_problems(f"<html><body><p>Chapter text.</p>{page}</body></html>", list(paths), "/tmp")


def test_a_clean_page_passes():
    one_bar = output("stderr", "denoise:   0%|          | 0/2\r denoise: 100%|##########| 2/2 [00:01&lt;00:00]\n")
    assert problems(output("stream", "PSNR 31.2 dB\n") + one_bar + "<p>see /work/projects/x (another folder)</p>") == []


def test_each_rule_fails_its_page():
    assert problems("<p>saved to /work/proj/notebooks/out.mp4</p>") == [
        "absolute path of the build machine in the page: /work/proj"]
    assert problems(output("stderr", "\n  \n")) == ["empty stderr box in a cell's output"]
    two_bars = output("stderr", "Loading weights: 100%|#| 3/3\nLoading weights: 100%|#| 5/5\n")
    assert problems(two_bars) == ["2 progress-bar lines in one cell's output (one at most)"]
    assert problems(output("stream", "wrote /tmp/tmpab12/latents.safetensors\n")) == [
        "temporary path of the build machine in a cell's output: /tmp"]
    assert problems("<p>The speed-up goal met.</p>") == ["internal wording in the page: 'goal met'"]
    assert problems('<video controls src="data:video/mp4;base64,AAAA"></video>') == [
        "video embedded as base64 in the page (link the file: display.video_html(media_dir=...))"]
    assert problems('<video controls src="../_static/videos/ab12.mp4"></video>') == []
    assert problems("<p>as issue 6 asked</p>") == ["internal wording in the page: 'issue 6'"]
