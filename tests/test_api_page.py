"""The API page documents every module of hyv_lib (it is generated from their docstrings at build time)."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_every_module_has_a_section_on_the_api_page():
    page = (ROOT / "book" / "api.md").read_text()
    documented = set(re.findall(r"automodule:: (hyv_lib(?:\.\w+)*)", page))
    modules = {"hyv_lib"} | {f"hyv_lib.{p.stem}" for p in (ROOT / "hyv_lib").glob("*.py") if not p.stem.startswith("_")}
    assert modules - documented == set(), "modules missing from book/api.md"
    assert documented - modules == set(), "book/api.md names modules that do not exist"
