"""Shared helpers of the notebook source scripts: cell constructors, stable ids, writing."""

import sys

import nbformat as nbf

md, code = nbf.v4.new_markdown_cell, nbf.v4.new_code_cell


def notebook(cells):
    """A notebook of ``cells`` with stable cell ids (regenerating it gives no diff) and the python3 kernel."""
    for i, cell in enumerate(cells):
        cell.id = f"c{i:02d}"
    return nbf.v4.new_notebook(cells=cells, metadata={
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"}})


def main(build, default_path):
    """Write ``build()`` to argv[1] or ``default_path``."""
    nbf.write(build(), sys.argv[1] if len(sys.argv) > 1 else default_path)
