"""Every notebook is committed without outputs and equals what its source script in tools/notebooks builds."""

import importlib.util
import pathlib
import sys

import nbformat
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "tools" / "notebooks").glob("[0-9]*.py"))
sys.path.insert(0, str(ROOT / "tools" / "notebooks"))  # the scripts import their shared _nbtools


def test_every_notebook_has_a_script():
    notebooks = {p.stem for p in (ROOT / "notebooks").glob("*.ipynb")}
    assert notebooks == {p.stem for p in SCRIPTS}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_notebook_matches_its_script_and_has_no_outputs(script):
    spec = importlib.util.spec_from_file_location(f"nb_{script.stem}", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    built = module.build()
    committed = nbformat.read(ROOT / "notebooks" / f"{script.stem}.ipynb", as_version=4)
    assert [c.source for c in committed.cells] == [c.source for c in built.cells], \
        f"run: python {script.relative_to(ROOT)}"
    for cell in committed.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None
    sources = "\n".join(c.source for c in committed.cells)
    assert "## Summary" in sources and "## Exercises" in sources and ":class: dropdown" in sources
    assert any("parameters" in c.metadata.get("tags", []) for c in committed.cells)
    assert "HYV_PRESET" in sources and "HYV_MODEL_PATH" in sources
