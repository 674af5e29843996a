"""Errors name Python parameters below the command line, and the command line writes them as its flags."""

import argparse
import ast
import pathlib
import re

import pytest

from hyv_lib.base.errors import HyvInputError
from hyv_lib.cli.commands import run
from hyv_lib.cli.error_lines import error_line, flag_name, flag_text
from hyv_lib.models.families import get_preset
from hyv_lib.pipeline.settings import resolve_settings

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "hyv_lib"
FLAG = re.compile(r"--[a-z]")
COMMAND = re.compile(r"python -m |torchrun |huggingface-cli ")


def flags_named(path: pathlib.Path) -> list[str]:
    """The ``HyvInputError(...)`` calls in ``path`` that name a flag: an argument starting with ``--``, or ``--name``
    in the message (a command to run, quoted from ``python -m``, ``torchrun`` or ``huggingface-cli`` on, may spell its
    flags)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "HyvInputError" and node.args):
            continue
        strings = [[n.value for n in ast.walk(arg) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
                   for arg in node.args]
        if any(s.startswith("--") for s in strings[0]):
            found.append(f"{node.lineno}: argument {ast.unparse(node.args[0])}")
        message = "".join(s for arg in strings[1:] for s in arg)
        if FLAG.search(COMMAND.split(message)[0]):
            found.append(f"{node.lineno}: message {message[:60]!r}")
    return found


def test_the_scan_finds_flags(tmp_path):
    source = tmp_path / "m.py"
    source.write_text('raise HyvInputError("--mesh", "bad")\n'
                      'raise HyvInputError("mesh", f"needs --runtime {x}")\n'
                      'raise HyvInputError("mesh", "needs `runtime` jax")\n'
                      'raise HyvInputError("cache", "run python -m hyv_lib calibrate_cache --preset tiny")\n'
                      'raise HyvInputError(f"--ssta_{name}", "x")\n'
                      'raise HyvInputError("runtime", "launch: torchrun --nproc_per_node=N -m hyv_lib")\n')
    assert [hit.split(":")[0] for hit in flags_named(source)] == ["1", "2", "5"]


def test_no_error_below_the_command_line_names_a_flag():
    found = {str(path.relative_to(PACKAGE)): hits for path in sorted(PACKAGE.rglob("*.py"))
             if "cli" not in path.relative_to(PACKAGE).parts for hits in [flags_named(path)] if hits}
    assert not found, found


def test_the_command_line_writes_its_flags():
    args = argparse.Namespace(command="stage2", runtime="torch", mesh=None, ssta_tile=None)
    assert flag_text("needs `runtime` jax, not `offload` or `mesh`", args) == \
        "needs --runtime jax, not `offload` or --mesh"  # offload: no flag of this command
    assert [flag_name(a, args) for a in ("mesh", "ssta_tile", "/a/path", "command", "--mesh")] == \
        ["--mesh", "--ssta_tile", "/a/path", "command", "--mesh"]
    assert error_line("mesh", "needs `runtime`\njax", args) == "error: --mesh: needs --runtime jax"


def test_both_doors(tiny_run, tmp_path, capsys):
    """From Python the parameter (and the other one in backquotes); from the CLI both as flags, before any work."""
    with pytest.raises(HyvInputError) as err:
        resolve_settings(get_preset("tiny"), mesh="1")
    assert (err.value.argument, err.value.message) == ("mesh", "needs `runtime` jax")
    out = tmp_path / "out"
    assert run(["stage2", "--input_dir", str(tiny_run), "--output_dir", str(out), "--mesh", "1"]) == 2
    assert capsys.readouterr().err.strip() == "error: --mesh: needs --runtime jax" and not out.exists()
