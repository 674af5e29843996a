"""Every chapter's layout, read from its jupytext source: a concept figure before the first code cell, and the one
exercise format (the verbatim preamble, a numbered question list, one "Answers" dropdown with one item per question)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
CHAPTERS = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.py"))

PREAMBLE = ("Marked ★ (easy) to ★★★ (hard), and *open* where no one has the answer yet "
            "({ref}`notation-exercises`).")
FIGURE = re.compile(r"^:::\{figure\}|!\[|<img\b", re.MULTILINE)
ITEM = re.compile(r"^(\d+)\. ")


def cells(path: Path) -> list[tuple[str, str]]:
    """(kind, text) for each cell of a py:percent notebook, in order: kind is "markdown" or "code"; a markdown
    cell's text has its leading "# " removed. The YAML header before the first cell is skipped."""
    out: list[tuple[str, list[str]]] = []
    for line in path.read_text().split("\n"):
        if line.startswith("# %%"):
            out.append(("markdown" if "[markdown]" in line else "code", []))
        elif out:
            out[-1][1].append(line)
    result = []
    for kind, lines in out:
        if kind == "markdown":
            lines = [ln[2:] if ln.startswith("# ") else "" if ln == "#" else ln for ln in lines]
        result.append((kind, "\n".join(lines).strip("\n")))
    return result


def figure_problem(path: Path) -> str | None:
    """Why the chapter's first figure does not come before its first code cell, or None."""
    for kind, text in cells(path):
        if kind == "code" and text.strip():
            return "its first code cell comes before any figure (`:::{figure}`, `![` or `<img` in markdown)"
        if kind == "markdown" and FIGURE.search(text):
            return None
    return "it has no figure in markdown"


def numbered_items(lines: list[str]) -> list[int]:
    """The numbers of the top-level items of a markdown list (items start at column 0)."""
    return [int(m.group(1)) for m in map(ITEM.match, lines) if m]


def exercise_problem(path: Path) -> str | None:
    """Why the chapter's Exercises section is not in the one format, or None."""
    markdown = "\n".join(text for kind, text in cells(path) if kind == "markdown")
    parts = re.split(r"^## Exercises[ \t]*$", markdown, flags=re.MULTILINE)
    if len(parts) != 2:
        return f"{len(parts) - 1} '## Exercises' headings (want 1)"
    section = parts[1]
    if re.search(r"^#{1,2} ", section, flags=re.MULTILINE):
        return "a heading follows '## Exercises' (it must be the last section)"
    lines = section.split("\n")
    body = [ln for ln in lines if ln.strip()]
    if not body or body[0] != PREAMBLE:
        return f"the first line is not the verbatim preamble {PREAMBLE!r}"
    admonitions = [ln for ln in lines if ln.startswith(":::{admonition}")]
    if admonitions != [":::{admonition} Answers"]:
        return f"admonitions {admonitions} (want exactly one ':::{{admonition}} Answers')"
    start = lines.index(":::{admonition} Answers")
    if start + 1 >= len(lines) or lines[start + 1].strip() != ":class: dropdown":
        return "the Answers admonition is not `:class: dropdown`"
    try:
        end = lines.index(":::", start + 2)
    except ValueError:
        return "the Answers admonition is not closed with ':::'"
    questions = numbered_items(lines[:start])
    answers = numbered_items(lines[start + 2:end])
    if not questions or questions != list(range(1, len(questions) + 1)):
        return f"questions numbered {questions} (want 1..N, one numbered list)"
    if answers != questions:
        return f"{len(questions)} questions but answers numbered {answers}"
    if any(ln.strip() for ln in lines[end + 1:]):
        return "text after the Answers dropdown"
    # one list: no blank line between question items except inside an item (continuations are indented)
    first = next(i for i, ln in enumerate(lines) if ITEM.match(ln))
    between = lines[first:start]
    stray = [ln for ln in between if ln.strip() and not ITEM.match(ln) and not ln.startswith(" ")]
    if stray:
        return f"text between the questions that is not part of an item: {stray[0]!r}"
    return None


def test_chapters_found():
    assert len(CHAPTERS) >= 10, CHAPTERS


def test_first_figure_before_first_code():
    problems = [f"{p.name}: {why}" for p in CHAPTERS if (why := figure_problem(p))]
    assert not problems, "chapters whose opening has no concept figure:\n" + "\n".join(problems)


def test_one_exercise_format():
    problems = [f"{p.name}: {why}" for p in CHAPTERS if (why := exercise_problem(p))]
    assert not problems, "chapters whose Exercises are not in the one format:\n" + "\n".join(problems)


@pytest.mark.parametrize("text, problem", [
    ("## Exercises\n\n" + PREAMBLE + "\n\n1. ★ Q?\n2. ★★ R?\n\n:::{admonition} Answers\n:class: dropdown\n"
     "1. A.\n2. B.\n:::", None),
    ("## Exercises\n\n" + PREAMBLE + "\n\n1. ★ Q?\n2. ★★ R?\n\n:::{admonition} Answers\n:class: dropdown\n"
     "1. A.\n:::", "2 questions but answers numbered [1]"),
    ("## Exercises\n\n" + PREAMBLE + "\n\n1. ★ Q?\n\n:::{admonition} Answer\n:class: dropdown\nA.\n:::\n\n"
     "2. ★★ R?\n\n:::{admonition} Answer\n:class: dropdown\nB.\n:::", "admonitions"),
    ("## Exercises\n\nDifficulty: ★ easy.\n\n1. ★ Q?\n\n:::{admonition} Answers\n:class: dropdown\n1. A.\n:::",
     "verbatim preamble"),
])
def test_exercise_check_can_fail(tmp_path, text, problem):
    """The checker on hand-written sections: the one format passes, each kind of deviation is named."""
    path = tmp_path / "99_x.py"
    path.write_text("# %% [markdown]\n" + "\n".join("# " + ln if ln else "#" for ln in text.split("\n")) + "\n")
    found = exercise_problem(path)
    assert (found is None) if problem is None else (found is not None and problem in found), found


def test_figure_check_can_fail(tmp_path):
    """A code cell before the first figure is reported; a figure first passes."""
    path = tmp_path / "99_x.py"
    path.write_text("# %% [markdown]\n# # 99. X\n\n# %%\nx = 1\n\n# %% [markdown]\n# ![a](b.svg)\n")
    assert "first code cell" in figure_problem(path)
    path.write_text("# %% [markdown]\n# # 99. X\n#\n# :::{figure} b.svg\n# :::\n\n# %%\nx = 1\n")
    assert figure_problem(path) is None
