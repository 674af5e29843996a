"""The book's deploy workflow is valid for GitHub Actions and calls what this repository has."""

import pathlib
import re
import subprocess
import sys

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / ".github" / "workflows" / "book.yml"


def validate(path) -> subprocess.CompletedProcess:
    """check-jsonschema with GitHub's workflow schema as vendored in the package (SchemaStore's; no network)."""
    return subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows",
                           str(path)], capture_output=True, text=True)


def test_workflow_matches_the_github_schema_and_a_broken_one_does_not(tmp_path):
    result = validate(WORKFLOW)
    assert result.returncode == 0, result.stdout + result.stderr
    broken = tmp_path / "broken.yml"  # a misspelt key: the validator must catch it
    broken.write_text(WORKFLOW.read_text().replace("runs-on:", "run-on:", 1))
    assert validate(broken).returncode != 0


def test_workflow_builds_checks_and_publishes_the_book():
    flow = yaml.safe_load(WORKFLOW.read_text())
    makefile = (ROOT / "Makefile").read_text()
    runs = [s["run"] for job in flow["jobs"].values() for s in job["steps"] if "run" in s]
    targets = [m.group(1) for r in runs for m in re.finditer(r"\bmake (\S+)", r)]
    assert targets == ["book", "check-book"]
    for target in targets:
        assert re.search(rf"^{re.escape(target)}:", makefile, re.M), target
    for variable in re.findall(r"\b([A-Z_]+)=", " ".join(runs)):
        assert re.search(rf"^{variable} \?=", makefile, re.M), variable  # a make variable the Makefile reads
    uploads = [s for s in flow["jobs"]["build"]["steps"] if s.get("uses", "").startswith("actions/upload-pages-artifact")]
    assert uploads and uploads[0]["with"]["path"] == "_build/html"  # where `jupyter-book build .` writes the site
    deploy = flow["jobs"]["deploy"]
    assert deploy["needs"] == "build" and deploy["permissions"] == {"pages": "write", "id-token": "write"}
    assert any(s.get("uses", "").startswith("actions/deploy-pages") for s in deploy["steps"])
    setup = next(s for s in flow["jobs"]["build"]["steps"] if s.get("uses", "").startswith("actions/setup-python"))
    assert setup["with"]["python-version"] == "3.11"  # the Makefile's PYTHON ?= python3.11
