"""The API pages document every module of hyv_lib (generated from their docstrings at build time), one page per layer."""

import importlib
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _modules() -> set[str]:
    package = ROOT / "hyv_lib"
    found = set()
    for path in package.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if not parts[-1].startswith("_"):
            found.add(".".join(parts))
    return found


def test_every_module_has_a_section_on_the_api_pages():
    pages = [ROOT / "book" / "api.md", *sorted((ROOT / "book" / "api").glob("*.md"))]
    documented = set()
    for page in pages:
        documented |= set(re.findall(r"automodule:: (hyv_lib(?:\.\w+)*)", page.read_text()))
    modules = _modules()
    assert "hyv_lib.pipeline.stages" in modules and "hyv_lib.cli" in modules  # the walk sees subpackages
    assert modules - documented == set(), "modules missing from the API pages (book/api.md, book/api/*.md)"
    assert documented - modules == set(), "the API pages name modules that do not exist"


def test_each_layer_has_its_own_page_linked_and_in_the_toc():
    index = (ROOT / "book" / "api.md").read_text()
    toc = (ROOT / "_toc.yml").read_text()
    for layer in sorted(p.name for p in (ROOT / "hyv_lib").iterdir() if (p / "__init__.py").exists()):
        assert (ROOT / "book" / "api" / f"{layer}.md").exists(), layer
        assert f"(api/{layer}.md)" in index, f"book/api.md does not link api/{layer}"
        assert f"- file: book/api/{layer}\n" in toc, f"_toc.yml does not list book/api/{layer}"


def test_the_index_lists_every_public_name_where_it_is_defined():
    import hyv_lib

    index = (ROOT / "book" / "api.md").read_text()
    listed = dict(re.findall(r"\| `hyv_lib\.(\w+)` \| \{py:obj\}`hyv_lib\.([\w.]+)\.\1` \|", index))
    public = [name for name in hyv_lib.__all__ if name != "__version__"]
    assert sorted(listed) == sorted(public)
    for name, module in listed.items():
        value = getattr(hyv_lib, name)
        assert value is getattr(importlib.import_module(f"hyv_lib.{module}"), name), name
        if callable(value) and hasattr(value, "__module__"):
            assert value.__module__ == f"hyv_lib.{module}", name  # defined there, not re-exported
