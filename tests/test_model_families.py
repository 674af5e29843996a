"""One home per model: outside hyv_lib/models/ no code names a model family or branches on a preset's model, and a
family registered from outside (a toy one here) is what the stage functions call."""

import ast
import dataclasses
import os
import pathlib
import re

import pytest
import torch

from hyv_lib.base.errors import HyvInputError
from hyv_lib.models.families import get_preset
from hyv_lib.models import families, registry
from hyv_lib.models.family import ModelFamily
from hyv_lib.pipeline.sampling import sample_latents
from hyv_lib.pipeline.settings import Stage2Settings, resolve_settings
from hyv_lib.pipeline.stage_io import STAGE1_FILE, load_stage1, save_tensors
from hyv_lib.pipeline.text import encode_pair
from toy_adapter import ToyAdapter

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "hyv_lib"

#: The modules outside hyv_lib/models/ that still name a model, and why (each leaves this list when it is moved).
#: The test fails on any other module that does, and on a module here that no longer does.
STILL_NAMING: dict[str, str] = {}


def model_words() -> set[str]:
    """What naming a family looks like in an identifier: each registered name's leading word, lower case without
    punctuation ("hunyuanvideo", "cogvideox")."""
    return {re.sub(r"[^a-z]", "", re.match(r"[A-Za-z]+", name).group(0).lower()) for name in families.FAMILIES}


def naming(path: pathlib.Path) -> list[str]:
    """Where ``path``'s code names a family: identifiers, attributes, imports and definitions containing a family's
    word, a string equal to a family's name, a comparison with a ``.model`` attribute. Docstrings, comments and
    prose strings (help texts, citations) may name models."""
    words, names = model_words(), set(families.FAMILIES)
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        idents = []
        if isinstance(node, ast.Name):
            idents = [node.id]
        elif isinstance(node, ast.Attribute):
            idents = [node.attr]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            idents = [node.name]
        elif isinstance(node, ast.ImportFrom):
            idents = [node.module or "", *(a.name for a in node.names)]
        elif isinstance(node, ast.Import):
            idents = [a.name for a in node.names]
        for ident in idents:
            if any(w in re.sub(r"[^a-z]", "", ident.lower()) for w in words):
                found.append(f"{node.lineno}: {ident}")
        if isinstance(node, ast.Constant) and node.value in names:
            found.append(f"{node.lineno}: {node.value!r}")
        if isinstance(node, ast.Compare) and any(isinstance(x, ast.Attribute) and x.attr == "model"
                                                 for x in (node.left, *node.comparators)):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_scan_finds_what_it_looks_for(tmp_path):
    """The scan itself, on hand-written code: each kind of naming is found, prose is not."""
    source = tmp_path / "m.py"
    source.write_text('"""HunyuanVideo-1.5 and CogVideoX in a docstring."""\n'
                      "from ..models.cogvideox.recipe import make_scheduler\n"
                      "HELP = 'sigma shift (HunyuanVideo-1.5 only)'\n"
                      "def f(preset):\n"
                      "    if preset.model == 'x':\n"
                      "        return COGVIDEOX_MODEL\n"
                      "    return 'hunyuanvideo-1.5'\n")
    assert sorted(hit.split(":")[0] for hit in naming(source)) == ["2", "5", "6", "7"]


def test_no_module_outside_models_names_a_model():
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if not rel.startswith("models/"):
            hits = naming(path)
            if hits:
                found[rel] = hits
    assert {rel: hits for rel, hits in found.items() if rel not in STILL_NAMING} == {}
    assert sorted(set(STILL_NAMING) - set(found)) == [], "these no longer name a model: drop them from STILL_NAMING"


def test_every_preset_runs_a_registered_family():
    from hyv_lib.models.families import PRESETS

    for preset in PRESETS.values():
        family = families.family_for(preset)
        assert family.name == preset.model and registry.get_adapter(preset.model) is family.adapter
    with pytest.raises(HyvInputError, match="runs 'nobody', which no registered model family runs"):
        families.family_for(dataclasses.replace(get_preset("tiny"), model="nobody"))


class ToyFamily(ModelFamily):
    """A text-to-video family whose every stage leaves a trace: the stage functions must come here for it."""

    def __init__(self):
        super().__init__(ToyAdapter())
        self.calls = []

    def encode_texts(self, components, preset, prompts, device=None, release=False):
        self.calls.append(("encode", tuple(prompts)))
        return {"prompt_embeds": torch.stack([torch.full((3, 2), float(len(p))) for p in prompts]),
                "prompt_mask": torch.ones(len(prompts), 3, dtype=torch.int64)}

    def tokens_cut(self, components, preset, prompts):
        return {f"{key}_tokens_dropped": (0, len(text), 3, "the toy encoder") for key, text in prompts.items()}

    def check_stage1(self, tensors, preset, path):
        self.calls.append(("check", sorted(tensors)))

    def sample(self, step, transformer, scheduler_config, preset, embeds, settings, *, warmup=None, progress=True,
               device=None):
        self.calls.append(("sample", warmup(((1, 2), 1, torch.float32, "cpu"))))
        return torch.zeros(1, 2)


@pytest.fixture()
def toy():
    family = ToyFamily()
    families.register_family(family)
    try:
        yield family, dataclasses.replace(get_preset("tiny"), name="toy_tiny", model=family.name)
    finally:
        families.FAMILIES.pop(family.name)
        registry.ADAPTERS.pop(family.name)


def test_a_registered_family_is_what_the_stages_call(toy, tmp_path):
    family, preset = toy
    tensors = encode_pair({}, preset, "a cat", "no", dtype="bf16")
    assert family.calls[-1] == ("encode", ("no", "a cat"))
    assert sorted(tensors) == ["negative_prompt_embeds", "negative_prompt_mask", "prompt_embeds", "prompt_mask"]
    assert tensors["prompt_embeds"].dtype == torch.bfloat16 and tensors["prompt_mask"].dtype == torch.int64
    assert float(tensors["prompt_embeds"][0, 0, 0]) == 5 and float(tensors["negative_prompt_embeds"][0, 0, 0]) == 2
    with pytest.raises(HyvInputError, match="toy_tiny is text-to-video: it takes no image"):
        encode_pair({}, preset, "a cat", image=object())

    save_tensors({"anything": torch.zeros(1)}, os.path.join(tmp_path, STAGE1_FILE))
    assert sorted(load_stage1(str(tmp_path), preset)) == ["anything"]
    assert family.calls[-1] == ("check", ["anything"])

    settings = Stage2Settings(warmup_steps=3)
    assert sample_latents(None, torch.nn.Linear(1, 1), {}, preset, {}, settings).shape == (1, 2)
    assert family.calls[-1] == ("sample", 3)  # the runtime's warmup count reached the family


def test_what_a_model_takes_is_its_adapters_to_say(toy):
    """The settings checks read the adapter's flags: the toy model (no SSTA, no LoRA files, no flow shift) is refused
    each, with the models that do take them named."""
    family, preset = toy
    family.adapter.takes_flow_shift = family.adapter.takes_lora_files = False
    with pytest.raises(HyvInputError, match="attention: SSTA is the sparse attention of hunyuanvideo-1.5 "):
        resolve_settings(preset, attention="ssta")
    with pytest.raises(HyvInputError, match="flow_shift: toy_tiny samples with a v-prediction scheduler"):
        resolve_settings(preset, flow_shift=3.0)
    with pytest.raises(HyvInputError, match="lora: LoRA files here are for the transformers of hunyuanvideo-1.5 and "
                                            "hunyuanvideo, not toy_tiny"):
        resolve_settings(preset, lora="x.safetensors")
