"""LoRA files in diffusers' format for the video transformers: choose its layers, add an adapter, save, read, merge."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from ..base.checks import as_number
from ..base.errors import HyvInputError
from ..base.files import atomic_path
from .registry import adapter_for, get_adapter

#: The file name diffusers' LoRA savers and loaders use (``LORA_WEIGHT_NAME_SAFE``); ``train`` writes it.
LORA_FILE = "pytorch_lora_weights.safetensors"
#: The prefix of the transformer's keys in a pipeline-level LoRA file (``transformer.<module>.lora_A.weight``).
PREFIX = "transformer"
#: The safetensors metadata keys: diffusers' LoraConfig fields (prefixed, as ``LoraBaseMixin.write_lora_layers``
#: writes them; ``load_lora_adapter`` reads them back) and hyv_lib's own record (rank, alpha, targets, model).
DIFFUSERS_METADATA_KEY = "lora_adapter_metadata"
HYV_METADATA_KEY = "hyv_lib_lora"
FORMAT = "hyv_lib.lora/1"
#: The default targets: the attention projections (q, k, v, out) of both streams in each transformer block, the
#: layers diffusers' LoRA trainers adapt.
DEFAULT_TARGETS = ("to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out")
#: The target groups ``train --lora_targets`` adapts by default: the attention projections (the model adapter's
#: ``lora_targets`` says which layers each group is, :func:`lora_target_names`).
DEFAULT_LORA_TARGETS = "attn"
#: The group that adapts every ``nn.Linear`` (it holds the others: it is given alone).
ALL_TARGETS = "all"
#: generation_config.json's fields of a merged LoRA (:meth:`LoraWeights.record`).
RECORD_FIELDS = ("lora", "lora_sha256", "lora_scale", "lora_rank")
#: The attribute :func:`merge_lora` keeps on a transformer: the LoRAs merged into its weights (path, sha256, scale).
MERGED_ATTRIBUTE = "hyv_merged_loras"
_BLOCK = re.compile(r"^transformer_blocks\.\d+\.attn\.")
_KEY = re.compile(r"^(?P<module>.+)\.(?P<part>lora_A\.weight|lora_B\.weight|lora_B\.bias)$")


def config_digest(transformer: torch.nn.Module) -> str:
    """SHA-256 of the transformer's config (its public fields, as JSON): which model and shapes a LoRA was made for."""
    config = {k: v for k, v in dict(transformer.config).items() if not k.startswith("_")}
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()


def parse_lora_targets(targets: Any, groups: Any, argument: str = "lora_targets") -> str:
    """``targets`` (``"attn,mlp"``, or a list of group names) checked against a model's ``groups`` (its adapter's
    :attr:`~hyv_lib.models.adapter.ModelAdapter.lora_targets`) and written canonically: each group once, in the
    adapter's order, comma-separated (``"mlp, attn"`` -> ``"attn,mlp"``); ``all`` stands alone."""
    groups = list(groups)
    if isinstance(targets, str):
        asked = [t.strip() for t in targets.split(",")]
    elif isinstance(targets, (list, tuple)) and all(isinstance(t, str) for t in targets):
        asked = [t.strip() for t in targets]
    else:
        raise HyvInputError(argument, f"must be comma-separated group names ({', '.join(groups)}), got {targets!r}")
    unknown = [t for t in asked if t not in groups]
    if not asked or unknown:
        raise HyvInputError(argument, f"must be one or more of {', '.join(groups)} (comma-separated, e.g. attn,mlp), "
                                      f"got {targets!r}")
    if ALL_TARGETS in asked and len(set(asked)) > 1:
        raise HyvInputError(argument, f"{ALL_TARGETS} adapts every nn.Linear already: give it alone, got {targets!r}")
    return ",".join(g for g in groups if g in asked)


def lora_target_names(transformer: torch.nn.Module, targets: Any = DEFAULT_LORA_TARGETS,
                      argument: str = "lora_targets") -> list[str]:
    """The full names of the ``nn.Linear`` layers of ``transformer`` that the target groups ``targets`` adapt
    (:func:`parse_lora_targets`): those whose name matches one group's regex of the model adapter's
    :attr:`~hyv_lib.models.adapter.ModelAdapter.lora_targets` whole (HunyuanVideo-1.5:
    :data:`hyv_lib.models.hunyuan_video15.adapter.LORA_TARGETS`; CogVideoX: :data:`hyv_lib.models.cogvideox.adapter.LORA_TARGETS`)."""
    adapter = adapter_for(transformer)
    groups = adapter.lora_targets
    if not groups:
        raise HyvInputError(argument, f"the {adapter.name} model adapter names no LoRA target groups "
                                      "(ModelAdapter.lora_targets)")
    chosen = parse_lora_targets(targets, groups, argument).split(",")
    patterns = [re.compile(groups[g]) for g in chosen]
    names = [name for name, module in transformer.named_modules()
             if isinstance(module, torch.nn.Linear) and any(p.fullmatch(name) for p in patterns)]
    if not names:
        raise HyvInputError(argument, f"no nn.Linear of {type(transformer).__name__} is in {','.join(chosen)}")
    return names


def target_names(transformer: torch.nn.Module, target_modules: list[str] | None = None) -> list[str]:
    """The full names of the ``nn.Linear`` layers a LoRA adapts: by default :data:`DEFAULT_TARGETS` in the transformer
    blocks' attention; else every Linear whose name is one of ``target_modules`` or ends in ``.`` and one of them
    (peft's rule)."""
    if target_modules is not None and (isinstance(target_modules, str) or not all(
            isinstance(t, str) and t for t in target_modules)):
        raise HyvInputError("target_modules", f"must be a list of module names, got {target_modules!r}")
    names = []
    for name, module in transformer.named_modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        if target_modules is None:
            hit = bool(_BLOCK.match(name)) and name[_BLOCK.match(name).end():] in DEFAULT_TARGETS
        else:
            hit = any(name == t or name.endswith("." + t) for t in target_modules)
        if hit:
            names.append(name)
    if not names:
        raise HyvInputError("target_modules", f"no nn.Linear of {type(transformer).__name__} matches "
                                              f"{list(target_modules or DEFAULT_TARGETS)!r}")
    return names


def add_lora(transformer, rank: int, alpha: float | None = None, target_modules: list[str] | None = None, *,
             targets: Any = None) -> list[str]:
    """Attach a trainable LoRA adapter (peft, through diffusers' ``add_adapter``) of ``rank`` and ``alpha`` (default:
    ``rank``, a scaling of 1) to the layers of the target groups ``targets`` (:func:`lora_target_names`: ``"attn"``,
    ``"attn,mlp"``, ``"all"``), or else of :func:`target_names` (``target_modules``; neither: the attention
    projections); its B matrices start at zero, so the output is unchanged. Returns the adapted layers' names."""
    from peft import LoraConfig

    rank = as_number("lora_rank", rank, int, low=1)
    alpha = float(rank) if alpha is None else as_number("lora_alpha", alpha, low=0, low_open=True)
    if targets is not None and target_modules is not None:
        raise HyvInputError("targets", "give target groups (targets) or module names (target_modules), not both")
    names = lora_target_names(transformer, targets) if targets is not None else target_names(transformer,
                                                                                              target_modules)
    transformer.add_adapter(LoraConfig(r=rank, lora_alpha=alpha, target_modules=names, init_lora_weights=True))
    adapted = sorted(n for n, m in transformer.named_modules() if hasattr(m, "lora_A"))  # peft's wrappers
    if adapted != sorted(names):  # peft also takes a module whose name merely ends in ".<a target>"
        extra = sorted(set(adapted) - set(names))
        raise ValueError(f"peft adapted other layers than asked for ({extra[:3]} ...): a target name is the end of "
                         "another module's name")
    return names


def _adapter_name(transformer) -> str:
    """The one adapter attached to ``transformer`` (a HyvInputError when there is none or several)."""
    names = list(getattr(transformer, "peft_config", {}) or {})
    if len(names) != 1:
        raise HyvInputError("transformer", f"needs exactly one LoRA adapter attached (add_lora), has {names or 'none'}")
    return names[0]


def lora_state_dict(transformer) -> dict[str, torch.Tensor]:
    """The adapter's weights under diffusers' pipeline-level keys: ``transformer.<module>.lora_A.weight`` and
    ``...lora_B.weight`` (peft's ``get_peft_model_state_dict``, prefixed as ``LoraBaseMixin.pack_weights`` does)."""
    from peft.utils import get_peft_model_state_dict

    adapter = _adapter_name(transformer)
    tensors = get_peft_model_state_dict(transformer, adapter_name=adapter)
    return {f"{PREFIX}.{k}": v.detach() for k, v in tensors.items()}


def save_lora(transformer, path: str, *, metadata: dict | None = None) -> str:
    """Write the attached adapter as a diffusers LoRA file, atomically; returns the file written. ``path``: a
    ``.safetensors`` file, or a folder (then ``path/pytorch_lora_weights.safetensors``). The safetensors metadata holds
    diffusers' LoraConfig fields (``lora_adapter_metadata``, so ``load_lora_adapter`` rebuilds the same config) and
    hyv_lib's record (``hyv_lib_lora``: rank, alpha, targets, model class, config digest, plus ``metadata``)."""
    from safetensors.torch import save

    path = os.path.expanduser(os.fspath(path))
    if not path.endswith(".safetensors"):
        os.makedirs(path, exist_ok=True)
        path = os.path.join(path, LORA_FILE)
    config = transformer.peft_config[_adapter_name(transformer)]
    fields = {k: sorted(v) if isinstance(v, set) else v for k, v in config.to_dict().items()}
    targets = fields.get("target_modules")
    record = dict(format=FORMAT, rank=config.r, alpha=config.lora_alpha, use_rslora=bool(config.use_rslora),
                  target_modules=targets, model_class=type(transformer).__name__,
                  config_digest=config_digest(transformer), **(metadata or {}))
    header = {"format": "pt",
              DIFFUSERS_METADATA_KEY: json.dumps({f"{PREFIX}.{k}": v for k, v in fields.items()}, indent=2,
                                                 sort_keys=True, default=str),
              HYV_METADATA_KEY: json.dumps(record, sort_keys=True, default=str)}
    tensors = {k: v.cpu().contiguous() for k, v in lora_state_dict(transformer).items()}
    data = save(tensors, metadata=header)
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
    return path


@dataclasses.dataclass
class LoraLayer:
    """One adapted layer: ``W += scale * scaling * up @ down`` (and ``b += scale * scaling * bias``)."""

    down: torch.Tensor  #: lora_A [rank, in]
    up: torch.Tensor  #: lora_B [out, rank]
    scaling: float  #: alpha / rank (alpha / sqrt(rank) with rsLoRA)
    bias: torch.Tensor | None = None  #: lora_B's bias [out] (peft's lora_bias)


@dataclasses.dataclass
class LoraWeights:
    """A LoRA file read by :func:`read_lora`: its layers by module name (without the ``transformer.`` prefix)."""

    layers: dict[str, LoraLayer]
    path: str | None = None
    sha256: str | None = None
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)  #: hyv_lib's record, if the file has one

    @property
    def rank(self) -> int:
        """The largest rank of its layers."""
        return max(layer.down.shape[0] for layer in self.layers.values())

    def record(self, scale: float) -> dict[str, Any]:
        """generation_config.json fields of this LoRA merged at ``scale``."""
        return dict(zip(RECORD_FIELDS, (self.path, self.sha256, scale, self.rank)))


def lora_file(path: str, argument: str = "lora") -> str:
    """The LoRA file ``path`` names (``~`` expanded; a folder: its ``pytorch_lora_weights.safetensors``), absolute; a
    HyvInputError naming ``argument`` when there is none."""
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise HyvInputError(argument, f"must be the path of a LoRA .safetensors file, got {path!r}")
    path = os.path.abspath(os.path.expanduser(os.fspath(path)))
    if os.path.isdir(path):
        path = os.path.join(path, LORA_FILE)
    if not os.path.isfile(path):
        raise HyvInputError(argument, f"{path!r} does not exist (give a LoRA .safetensors file, or the folder "
                                      f"holding {LORA_FILE})")
    return path


def _alphas(file_metadata: dict[str, str], path: str, argument: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """hyv_lib's record and the LoraConfig fields (unprefixed) of a file's metadata; either may be empty."""
    try:
        record = json.loads(file_metadata.get(HYV_METADATA_KEY) or "{}")
        config = json.loads(file_metadata.get(DIFFUSERS_METADATA_KEY) or "{}")
    except json.JSONDecodeError as err:
        raise HyvInputError(argument, f"{path!r}: its LoRA metadata is not JSON ({err})") from None
    config = {k.removeprefix(f"{PREFIX}."): v for k, v in config.items() if k.startswith(f"{PREFIX}.")} or config
    return record, config


def _pattern_value(patterns: dict[str, Any], name: str, default: Any) -> Any:
    """peft's ``rank_pattern``/``alpha_pattern`` lookup: the first key matching the end of ``name``."""
    for key, value in (patterns or {}).items():
        if re.match(rf"(.*\.)?({key})$", name):
            return value
    return default


def read_lora(path: str, argument: str = "lora") -> LoraWeights:
    """Read a LoRA file in diffusers' layout (``transformer.<module>.lora_A.weight`` / ``lora_B.weight``, or the same
    keys without the prefix as ``save_lora_adapter`` writes them). Alpha comes from hyv_lib's record, else diffusers'
    ``lora_adapter_metadata``, else it equals the rank (diffusers' rule without metadata). A missing, corrupt or
    non-finite file, or one that is not a LoRA of this layout, is a HyvInputError naming ``argument`` and the file."""
    from safetensors.torch import load

    path = lora_file(path, argument)
    try:
        with open(path, "rb") as f:
            data = f.read()
        tensors = load(data)
        with safe_open(path, "pt") as f:
            file_metadata = f.metadata() or {}
    except (SafetensorError, OSError, ValueError) as err:
        raise HyvInputError(argument, f"{path!r} is not a complete safetensors file ({err}); copy or save it "
                                      "again") from None
    record, config = _alphas(file_metadata, path, argument)
    if any(k.startswith(f"{PREFIX}.") for k in tensors):
        tensors = {k.removeprefix(f"{PREFIX}."): v for k, v in tensors.items() if k.startswith(f"{PREFIX}.")}
    tensors = {k.removeprefix("base_model.model."): v for k, v in tensors.items()}
    parts: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        match = _KEY.match(key)
        if match is None:
            raise HyvInputError(argument, f"{path!r}: key {key!r} is not diffusers' LoRA layout "
                                          "(<module>.lora_A.weight, <module>.lora_B.weight); DoRA, LoKr and other "
                                          "formats are not merged")
        if not torch.isfinite(tensor).all():
            raise HyvInputError(argument, f"{path!r}: {key!r} holds NaN or Inf")
        parts.setdefault(match["module"], {})[match["part"]] = tensor
    if not parts:
        raise HyvInputError(argument, f"{path!r} holds no transformer LoRA weights")
    use_rslora = bool(record.get("use_rslora", config.get("use_rslora", False)))
    layers = {}
    for module, part in sorted(parts.items()):
        down, up = part.get("lora_A.weight"), part.get("lora_B.weight")
        if down is None or up is None or down.ndim != 2 or up.ndim != 2 or down.shape[0] != up.shape[1]:
            raise HyvInputError(argument, f"{path!r}: {module!r} needs lora_A [rank, in] and lora_B [out, rank], got "
                                          f"{None if down is None else tuple(down.shape)} and "
                                          f"{None if up is None else tuple(up.shape)}")
        rank = down.shape[0]
        alpha = record.get("alpha", _pattern_value(config.get("alpha_pattern"), module, config.get("lora_alpha")))
        alpha = float(rank if alpha is None else alpha)
        scaling = alpha / math.sqrt(rank) if use_rslora else alpha / rank
        layers[module] = LoraLayer(down=down, up=up, scaling=scaling, bias=part.get("lora_B.bias"))
    return LoraWeights(layers=layers, path=path, sha256=hashlib.sha256(data).hexdigest(), metadata=record)


def check_lora_fits(transformer, weights: LoraWeights, argument: str = "lora") -> None:
    """A HyvInputError naming ``argument`` when ``weights`` were made for another model class or other shapes: the
    first module it adapts that this transformer lacks (or that is not a Linear), or whose shape differs."""
    where = weights.path or "the LoRA"
    made_for = weights.metadata.get("model_class")
    if made_for and made_for != type(transformer).__name__:
        raise HyvInputError(argument, f"{where!r} was trained for {made_for}, not {type(transformer).__name__}")
    digest = weights.metadata.get("config_digest")
    context = ("" if not digest or digest == config_digest(transformer) else
               "; it was saved from a transformer with another config (config digest "
               f"{digest[:12]} vs {config_digest(transformer)[:12]})")
    modules = dict(transformer.named_modules())
    for name, layer in weights.layers.items():
        module = modules.get(name)
        module = getattr(module, "base_layer", module)  # a layer peft wraps: its base Linear
        if not isinstance(module, torch.nn.Linear):
            what = "has no module" if module is None else f"has a {type(module).__name__}, not a Linear,"
            raise HyvInputError(argument, f"{where!r} adapts {name!r}, but {type(transformer).__name__} {what} "
                                          f"there: a LoRA for another model{context}")
        expected = (module.out_features, module.in_features)
        got = (layer.up.shape[0], layer.down.shape[1])
        if got != expected:
            raise HyvInputError(argument, f"{where!r}: {name!r} is [out, in] = {list(got)} in the LoRA but "
                                          f"{list(expected)} in this transformer: a LoRA for other shapes{context}")
        if layer.bias is not None and (module.bias is None or layer.bias.shape != module.bias.shape):
            raise HyvInputError(argument, f"{where!r}: {name!r} has a LoRA bias but the layer's bias does not fit")


def check_lora_file(path: str, model: str, config: dict[str, Any], model_path: str | None = None,
                    argument: str = "lora") -> LoraWeights:
    """Read the LoRA ``path`` and check it fits the transformer of ``config`` (a preset's; a local ``model_path``
    folder's transformer/config.json when it has one) of the model adapter ``model``, built on the meta device (no
    memory, no weights loaded): a corrupt file or a LoRA for another model fails before any work."""
    weights = read_lora(path, argument)
    folder_config = os.path.join(os.path.expanduser(model_path), "transformer", "config.json") if model_path else ""
    if os.path.isfile(folder_config):
        with open(folder_config) as f:
            config = {k: v for k, v in json.load(f).items() if not k.startswith("_")}
    with torch.device("meta"):
        transformer = get_adapter(model).build(dict(config))
    check_lora_fits(transformer, weights, argument)
    return weights


@torch.no_grad()
def merge_lora(transformer, path_or_weights: str | LoraWeights, scale: float = 1.0, *,
               argument: str = "lora") -> LoraWeights:
    """Merge a LoRA into ``transformer``'s weights in place: ``W += scale * alpha/rank * B @ A`` for each adapted
    Linear, computed in fp32 and rounded once to the weight's dtype. Run it before the transformer is placed or sharded:
    the step then costs what it costs without a LoRA. The whole LoRA is checked (:func:`check_lora_fits`) before any
    weight changes. Returns the :class:`LoraWeights` merged (:meth:`LoraWeights.record` for a config file)."""
    scale = as_number("lora_scale", scale)
    weights = path_or_weights if isinstance(path_or_weights, LoraWeights) else read_lora(path_or_weights, argument)
    check_lora_fits(transformer, weights, argument)
    modules = dict(transformer.named_modules())
    for name, layer in weights.layers.items():
        module = getattr(modules[name], "base_layer", modules[name])
        weight = module.weight
        delta = (layer.up.to(weight.device, torch.float32) @ layer.down.to(weight.device, torch.float32))
        weight.copy_((weight.float() + (scale * layer.scaling) * delta).to(weight.dtype))
        if layer.bias is not None:
            bias = module.bias
            bias.copy_((bias.float() + (scale * layer.scaling) * layer.bias.to(bias.device, torch.float32))
                       .to(bias.dtype))
    merged = list(getattr(transformer, MERGED_ATTRIBUTE, []))
    setattr(transformer, MERGED_ATTRIBUTE, merged + [dict(path=weights.path, sha256=weights.sha256, scale=scale)])
    return weights


def ensure_merged(transformer, path: str | None, scale: float = 1.0, *, can_merge: bool = True,
                  argument: str = "lora") -> LoraWeights | None:
    """Make ``transformer`` hold the LoRA ``path`` merged at ``scale`` (None: no LoRA) and return its weights: a no-op
    for a kept transformer that already holds exactly that merge (same file contents, same scale); a merge when it
    holds none (``can_merge=False``: its step is already built, so a merge would come too late: an error); an error
    when it holds another one (weights cannot be unmerged exactly: load the model again)."""
    merged = list(getattr(transformer, MERGED_ATTRIBUTE, []))
    if path is None:
        if merged:
            raise HyvInputError(argument, f"this transformer has the LoRA {merged[-1]['path']!r} merged into its "
                                          "weights: load the model again for a run without it")
        return None
    weights = read_lora(path, argument)
    scale = as_number("lora_scale", scale)
    if len(merged) == 1 and (merged[0]["sha256"], merged[0]["scale"]) == (weights.sha256, scale):
        return weights
    if merged:
        raise HyvInputError(argument, f"this transformer already has the LoRA {merged[-1]['path']!r} merged at scale "
                                      f"{merged[-1]['scale']:g}: load the model again to merge another LoRA or scale")
    if not can_merge:
        raise HyvInputError(argument, "the transformer step was built before the LoRA could be merged: give the "
                                      "LoRA where the models are loaded (load_pipeline(lora=...), BatchRunner's "
                                      "stage-2 settings)")
    return merge_lora(transformer, weights, scale, argument=argument)
