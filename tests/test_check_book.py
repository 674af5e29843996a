"""The book checker's page rules, on hand-written HTML in the form myst-nb renders cell outputs."""

import importlib.util
import os
import pathlib
import shutil

import pytest

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


def test_a_stderr_box_fails_with_a_snippet():
    libtpu = ("Failed to find host bounds for accelerator type: WARNING: could not determine TPU accelerator type\n"
              "E0000 00:00:1795715022.071748    4284 common_lib.cc:554] INVALID_ARGUMENT: unexpected worker hostname\n")
    assert problems(output("stderr", libtpu)) == [
        "stderr box in a cell's output: 'Failed to find host bounds for accelerator type: WARNING: could not determine "
        "TPU accelerator type E0000 00:00:179571502'"]  # whitespace collapsed, 120 characters
    bar_and_warning = output("stderr", "denoise: 100%|##########| 2/2\nUserWarning: the NumPy array is not writable\n")
    assert problems(bar_and_warning) == [
        "stderr box in a cell's output: 'UserWarning: the NumPy array is not writable'"]


def test_a_page_over_500_kb_fails():
    assert check_book.size_problems(500_000) == []
    assert check_book.size_problems(910_000) == ["page is 910 KB, over 500 KB"]


def chapter_links(link, page="notebooks/06_image_to_video.html"):
    return check_book.chapter_link_problems(f"<html><body><p>See {link}.</p></body></html>", page)


def test_a_link_naming_another_chapter_fails():
    # The reviewer's find: a runbook section titled like a chapter, linked from chapter 6 and from its own sidebar.
    ref = ('<a class="reference internal" href="../book/runbook.html#image-to-video">'
           '<span class="std std-ref">7. Image to video</span></a>')
    assert chapter_links(ref) == [
        "link text '7. Image to video' names chapter 7, but leads to book/runbook.html (not a chapter)"]
    own_toc = '<a class="reference internal nav-link" href="#image-to-video">7. Image to video</a>'
    assert chapter_links(own_toc, "book/runbook.html") == [
        "link text '7. Image to video' names chapter 7, but leads to book/runbook.html (not a chapter)"]
    assert chapter_links('<a href="../notebooks/04_deepcache.html#cost">chapter 5</a>', "book/runbook.html") == [
        "link text 'chapter 5' names chapter 5, but leads to notebooks/04_deepcache.html (chapter 4)"]
    # Right: the target is the chapter named; the footer's "next" link; other sites; numbers that are not chapters.
    assert chapter_links('<a href="07_training_a_tiny_hunyuanvideo.html">7. Training a tiny HunyuanVideo-1.5</a>') == []
    assert chapter_links('<a href="../notebooks/05_end_to_end_720p.html#memory">Chapter 5</a>', "book/intro.html") == []
    assert chapter_links('<a class="right-next" href="07_x.html"><p>next</p>\n<p>7. Training</p></a>') == []
    assert chapter_links('<a href="https://example.org/ch">chapter 3</a>') == []
    assert chapter_links('<a href="../book/runbook.html">2.5 s per step</a>') == []


def test_a_table_wider_than_the_page_fails(tmp_path, capsys):
    """Laid out in Chromium: a wide table fails unless a horizontally scrolling wrapper in the column holds it."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or "/usr/bin/chromium"
    if not os.access(chromium, os.X_OK) or importlib.util.find_spec("websocket") is None:
        pytest.skip("needs Chromium and websocket-client (as make check-book does)")
    wide = "<table><tr>" + "".join(f"<th>column_{i}_with_a_long_name</th>" for i in range(12)) + "</tr></table>"
    narrow = "<table><tr><th>preset</th><th>GiB</th></tr></table>"
    column = '<main><article class="bd-article" style="width: 600px">{}</article></main>'
    (tmp_path / "wide.html").write_text(f"<html><body>{column.format(narrow + wide)}</body></html>")
    (tmp_path / "scrolls.html").write_text(
        f'<html><body>{column.format(narrow + "<div style=overflow-x:auto>" + wide + "</div>")}</body></html>')
    assert check_book.main([str(tmp_path), "--chromium", chromium]) == 1
    out = capsys.readouterr().out
    assert "ok   scrolls.html" in out and "FAIL wide.html" in out
    assert out.count("table wider than the page") == 1
    assert "12 columns) and not in a horizontally scrolling wrapper: 'column_0_with_a_long_name | column_1" in out


def test_no_source_the_book_renders_uses_internal_wording():
    """The book renders the notebooks, the pages and (through autodoc and viewcode) every line of hyv_lib: a tracker's
    wording in any of them fails check-book at the end of a 25-minute build, so it is caught here first."""
    sources = [*ROOT.glob("hyv_lib/**/*.py"), *ROOT.glob("notebooks/*.py"), *ROOT.glob("book/**/*.md")]
    assert len(sources) > 100
    found = []
    for path in sources:
        # joined as the page shows them: comment markers and line breaks gone ("issue\n# 45" reads "issue 45")
        text = " ".join(line.strip().lstrip("#:").strip() for line in path.read_text().splitlines())
        found += [f"{path.relative_to(ROOT)}: {m.group(0)!r}" for m in check_book.INTERNAL_TEXT.finditer(text)]
    assert found == []


def cell(code, outputs=""):
    """A notebook cell as myst-nb renders it: the code's input box, then its outputs."""
    return (f'<div class="cell docutils container"><div class="cell_input docutils container">'
            f'<div class="highlight-ipython3 notranslate"><div class="highlight"><pre><span></span>{code}\n</pre></div>'
            f'</div></div><div class="cell_output docutils container">{outputs}</div></div>')


def test_a_chapter_that_copies_a_video_must_show_it(tmp_path):
    """Chapter 5's find: video_html(..., media_dir=...) in an else branch copied the mp4 into the book, and its HTML,
    neither the cell's last value nor displayed, never reached the page."""
    (tmp_path / "_static" / "videos").mkdir(parents=True)
    (tmp_path / "_static" / "videos" / "ab12.mp4").write_bytes(b"mp4")
    call = ('<span class="n">video_html</span><span class="p">(</span><span class="n">os</span><span class="o">.'
            '</span><span class="n">path</span><span class="o">.</span><span class="n">join</span><span class="p">('
            '</span><span class="n">d</span><span class="p">,</span> <span class="s2">&quot;out.mp4&quot;</span>'
            '<span class="p">),</span> <span class="n">media_dir</span><span class="o">=</span>'
            '<span class="s2">&quot;../_static/videos&quot;</span><span class="p">)</span>')
    video = '<div class="output text_html"><video width="640" controls src="../_static/videos/ab12.mp4"></video></div>'

    def check(page, path="notebooks/05_end_to_end_720p.html"):
        return check_book.video_embed_problems(f"<html><body>{page}</body></html>", path, tmp_path)

    missing = ["the code copies 1 mp4 file(s) into _static/videos (video_html(media_dir=...)) but the page shows "
               "0 <video> of them (display() the HTML video_html returns)"]
    assert check(cell(f"else:\n    {call}  # linked")) == missing
    assert check(cell(f"display({call})", video)) == []
    assert check(cell(call, video.replace("ab12", "cd34"))) == [
        "video links _static/videos/cd34.mp4, which is not in the build"] + [missing[0]]
    assert check(cell(call, video.replace(' src="../_static/videos/ab12.mp4">',
                                          '><source src="../_static/videos/ab12.mp4" type="video/mp4">'))) == []
    # No call that copies a file: nothing to show (a data-URI video, a prose example, a page that is not a chapter)
    assert check(cell('video_html(path)')) == []
    assert check('<pre>video_html(p, media_dir="x")</pre>') == []
    assert check(cell(f"else:\n    {call}"), "book/runbook.html") == []
