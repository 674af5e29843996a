"""hyv_lib's structure: the layers contract holds and can fail, no private name crosses modules, one job per module
(a one-line docstring, at most 500 lines), function-local imports only for heavy optional packages."""

import ast
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "hyv_lib"
LINT_IMPORTS = pathlib.Path(sys.executable).with_name("lint-imports")
#: What a function may import locally: packages that are heavy or optional (and torch's submodules that would slow
#: ``import hyv_lib`` users who never call the function), and hyv_lib modules that import one of them.
HEAVY = ("jax", "jaxlib", "torchax", "libtpu", "flash_attn", "flash_attn_interface", "sageattention", "PIL",
         "matplotlib", "IPython", "diffusers", "transformers", "peft", "imageio", "imageio_ffmpeg", "tqdm")


def _modules() -> dict[str, pathlib.Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _absolute(module: str, path: pathlib.Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = package[: len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def test_no_private_name_is_imported_across_modules():
    modules = _modules()
    crossings = []
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                source = _absolute(module, path, node)
                for alias in node.names:
                    private = alias.name.startswith("_") and not alias.name.startswith("__")
                    if private and source in modules and source != module:
                        crossings.append(f"{module} imports {alias.name} from {source}")
    assert crossings == []


def test_each_module_states_its_job_in_a_one_line_docstring_and_stays_under_500_lines():
    for module, path in _modules().items():
        text = path.read_text()
        docstring = ast.get_docstring(ast.parse(text), clean=False)
        assert docstring, f"{module} has no docstring"
        assert docstring.strip(), module
        assert len(text.splitlines()) <= 500, f"{module} has {len(text.splitlines())} lines: split it by job"


def test_subpackages_say_what_their_layer_is_for():
    for init in PACKAGE.glob("*/__init__.py"):
        tree = ast.parse(init.read_text())
        assert ast.get_docstring(tree), f"{init.parent.name}/__init__.py has no docstring"
        assert not [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))], \
            f"{init.parent.name}/__init__.py imports: a layer's package only describes it"


def test_function_local_imports_are_for_heavy_optional_packages_only():
    """A function-local import of another hyv_lib module hides a dependency (and, before the layers, a cycle): it is
    allowed only where that module itself needs a heavy package at import time."""
    modules = _modules()

    def heavy_at_import(module: str, seen: set) -> bool:
        if module in seen:
            return False
        seen.add(module)
        for node in ast.parse(modules[module].read_text()).body:
            if isinstance(node, ast.Import) and any(a.name.split(".")[0] in HEAVY for a in node.names):
                return True
            if isinstance(node, ast.ImportFrom):
                source = _absolute(module, modules[module], node)
                if source.split(".")[0] in HEAVY:
                    return True
                targets = [f"{source}.{a.name}" if f"{source}.{a.name}" in modules else source for a in node.names]
                if any(t in modules and heavy_at_import(t, seen) for t in targets):
                    return True
        return False

    light = []
    for module, path in modules.items():
        tree = ast.parse(path.read_text())
        top = {id(n) for n in tree.body}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and id(node) not in top and node.level:
                source = _absolute(module, path, node)
                for alias in node.names:
                    target = f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source
                    if target in modules and target != "hyv_lib" and not heavy_at_import(target, set()):
                        light.append(f"{module}:{node.lineno} imports {target} inside a function")
    assert light == []


def test_lint_imports_keeps_the_contracts_and_fails_on_an_upward_import(tmp_path):
    """The contracts in pyproject.toml hold for hyv_lib, and a copy of it where the base layer imports the pipeline
    breaks them (function-local, as the old import ring was)."""
    if not LINT_IMPORTS.exists():
        pytest.skip("import-linter is not installed in this environment (requirements.txt installs it)")
    ok = subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout[-2000:]
    shutil.copytree(PACKAGE, tmp_path / "hyv_lib", ignore=shutil.ignore_patterns("weights", "__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    errors = tmp_path / "hyv_lib" / "base" / "errors.py"
    errors.write_text(errors.read_text() + "\n\ndef _upward():\n    from ..pipeline import stages  # noqa: F401\n")
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}
    broken = subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert broken.returncode != 0
    assert "hyv_lib.base is not allowed to import hyv_lib.pipeline" in broken.stdout
