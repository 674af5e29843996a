"""Every notebook is a jupytext pair: notebooks/NN_name.py (py:percent, the source to edit and review) and the
committed notebooks/NN_name.ipynb (what Jupyter Book executes), kept in sync by
``.venv/bin/jupytext --sync notebooks/*.py``. The .ipynb is committed without outputs."""

import pathlib

import jupytext
import nbformat
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
SOURCES = sorted((ROOT / "notebooks").glob("*.py"))
FORMATS = "ipynb,py:percent"


def _cells(nb):
    """What the pair must agree on: each cell's type, source and tags."""
    return [(c.cell_type, c.source, sorted(c.metadata.get("tags", []))) for c in nb.cells]


def check_pair(ipynb_path, py_path):
    """Assert that ``py_path`` (py:percent) and ``ipynb_path`` hold the same cells and are paired."""
    text = jupytext.read(py_path, fmt="py:percent")
    committed = nbformat.read(ipynb_path, as_version=4)
    fix = f"edit {py_path.name}, then run: .venv/bin/jupytext --sync notebooks/{py_path.name}"
    assert text.metadata.get("jupytext", {}).get("formats") == FORMATS, f"{py_path.name} is not paired; {fix}"
    assert committed.metadata.get("jupytext", {}).get("formats") == FORMATS, \
        f"{ipynb_path.name} is not paired: .venv/bin/jupytext --set-formats {FORMATS} notebooks/{ipynb_path.name}"
    assert _cells(committed) == _cells(text), f"{ipynb_path.name} and {py_path.name} differ; {fix}"


def test_every_notebook_has_its_py_percent_source():
    assert NOTEBOOKS, "no notebooks found"
    assert {p.stem for p in NOTEBOOKS} == {p.stem for p in SOURCES}
    for py in SOURCES:
        header = py.read_text(encoding="utf-8").split("# ---", 2)[1]
        assert "format_name: percent" in header, f"{py.name} is not in py:percent format"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_in_sync_with_its_source(path):
    check_pair(path, path.with_suffix(".py"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_has_no_outputs_and_its_chapter_parts(path):
    committed = nbformat.read(path, as_version=4)
    for i, cell in enumerate(committed.cells):
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, \
                f"cell {i} of {path.name} has outputs or an execution count; clear them (the book executes it)"
    parameters = [c for c in committed.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(parameters) == 1 and parameters[0].cell_type == "code", \
        f"{path.name} needs exactly one code cell tagged 'parameters'"
    sources = "\n".join(c.source for c in committed.cells)
    assert "## Summary" in sources and "## Exercises" in sources and ":class: dropdown" in sources
    from hyv_lib.notebook.display import NOTEBOOK_SETTINGS

    cell = parameters[0].source  # each setting is read there, or named in settings_not_used with its reason
    if "settings_not_used({name:" not in cell or "NOTEBOOK_SETTINGS" not in cell:  # 07: none applies, all named
        missing = [name for name in NOTEBOOK_SETTINGS if f'"{name}"' not in cell]
        assert not missing, f"{path.name}'s parameters cell neither reads nor explains {missing}"


def test_an_unsynced_edit_is_caught(tmp_path):
    """The pair check fails when a .py cell is edited (source or tags) and the .ipynb not synced."""
    ipynb, py = NOTEBOOKS[0], NOTEBOOKS[0].with_suffix(".py")
    (tmp_path / ipynb.name).write_bytes(ipynb.read_bytes())
    text = py.read_text(encoding="utf-8")
    edits = [text.replace("# %% tags=[\"parameters\"]\n", "# %% tags=[\"parameters\"]\nEDITED = 1\n", 1),
             text.replace(" tags=[\"parameters\"]", "", 1)]
    for edited in edits:
        assert edited != text
        (tmp_path / py.name).write_text(edited, encoding="utf-8")
        with pytest.raises(AssertionError, match="differ"):
            check_pair(tmp_path / ipynb.name, tmp_path / py.name)


def scratch_folders_left(source: str) -> list[str]:
    """The ``tempfile.mkdtemp`` folders a chapter makes and never removes: each call's result must be bound to a name
    that a later ``shutil.rmtree(name`` removes (a reader who runs the chapter again should not collect folders)."""
    import ast

    tree, left = ast.parse(source), []
    bound = {id(a.value): ast.unparse(a.targets[0]) for a in ast.walk(tree) if isinstance(a, ast.Assign)}
    lines = source.splitlines()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "tempfile.mkdtemp":
            name = bound.get(id(node))
            after = "\n".join(lines[node.lineno:])  # the lines after the call
            if name is None or f"shutil.rmtree({name}" not in after:
                left.append(name or ast.unparse(node))
    return left


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.stem)
def test_a_chapter_removes_the_scratch_folders_it_makes(path):
    assert scratch_folders_left(path.read_text(encoding="utf-8")) == [], path.name


def test_a_scratch_folder_left_behind_is_caught():
    kept = "import tempfile\nout = tempfile.mkdtemp(prefix='x_')\nprint(out)\n"
    inline = "import os, tempfile\npath = os.path.join(tempfile.mkdtemp(), 'a.mp4')\n"
    removed = "import shutil, tempfile\nout = tempfile.mkdtemp()\nshutil.rmtree(out, ignore_errors=True)\n"
    assert scratch_folders_left(kept) == ["out"]
    assert scratch_folders_left(inline) == ["tempfile.mkdtemp()"]
    assert scratch_folders_left(removed) == []
