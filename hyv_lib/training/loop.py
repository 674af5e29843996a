"""Fine-tuning on a feature folder: seeded batches, the flow-matching inputs, checkpoints and exact resume, outputs."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Any, Iterator

import torch
from tqdm.auto import tqdm

from ..base.errors import HyvFaultError, HyvInputError
from ..base.files import atomic_path, clean_partials, ensure_output_dir
from ..base.lock import folder_lock
from ..base.presets import Preset
from ..kernels.registry import BACKENDS
from ..models.components import load_components
from ..models.families import family_for
from ..models.flow_matching import sample_sigmas
from ..models.folder import choose_preset
from ..models.lora import DEFAULT_LORA_TARGETS, LORA_FILE, add_lora, config_digest, parse_lora_targets, save_lora
from ..models.registry import adapter_for, get_adapter
from ..parallel.distributed import rank as process_rank
from ..runtimes.jax_train import JaxTrainStep
from ..runtimes.names import runtime_name
from ..runtimes.torch_train import TorchTrainStep, lr_schedule
from .checkpoint import checkpoint_path, load_checkpoint, read_info, save_checkpoint
from .feature_set import FeatureSet
from .features import model_config_digest
from .run_settings import (
    DEFAULTS,
    RunSettings,
    check_settings,
    resolve_dropout_target,
    resolve_prior_weight,
    step_lr,
    train_defaults,
)

logger = logging.getLogger(__name__)

LOG_FILE = "train_log.jsonl"
TRANSFORMER_DIR = "transformer"
TMP_PREFIX = ".transformer-"  #: temporary folders of _save_transformer (a killed run's are removed by the next)
@dataclass
class TrainResult:
    """What :func:`train` did: the records of the steps run now, where it started, the files it wrote."""

    output_dir: str
    steps: int
    resumed_from: int
    records: list[dict[str, Any]]
    output: str | None  #: the LoRA file or the transformer folder (rank 0; None on the others)


# ------------------------------------------------------------------------------------------------ batches
def _squeeze_to(tensor: torch.Tensor, ndim: int) -> torch.Tensor:
    """``tensor`` without leading size-1 axes beyond ``ndim`` (a feature stored as [1, L, D] or [L, D])."""
    while tensor.ndim > ndim and tensor.shape[0] == 1:
        tensor = tensor[0]
    return tensor


def pick_clips(shapes: list[tuple], batch_size: int, generator: torch.Generator) -> list[int]:
    """A batch of clip indices of one latent shape: an anchor drawn uniformly from every clip (so each shape comes
    up as often as it has clips), then ``batch_size - 1`` more drawn uniformly, with replacement, from the clips of
    the anchor's shape. Two ``torch.randint`` draws of ``generator``."""
    anchor = int(torch.randint(len(shapes), (1,), generator=generator))
    group = [i for i, s in enumerate(shapes) if tuple(s) == tuple(shapes[anchor])]
    more = torch.randint(len(group), (batch_size - 1,), generator=generator).tolist()
    return [anchor] + [group[j] for j in more]


def draw_dropout(size: int, caption_dropout: float, generator: torch.Generator) -> torch.Tensor:
    """Which of ``size`` clips train on the empty prompt (bool [size]): one ``torch.rand`` draw, the first of
    :func:`build_batch`'s."""
    return torch.rand(size, generator=generator) < caption_dropout


def build_batch(features, picks: list[int], *, preset: Preset, model_config, task: str, caption_dropout: float,
                shift: float, sampling: str, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """The train step's batch for the clips ``picks``, on the host: the transformer's keyword arguments and
    ``target``, as ``preset``'s family makes them (:meth:`hyv_lib.models.family.ModelFamily.training_inputs`;
    ``model_config``: the transformer's config).

    Draws from ``generator``, in this order: the caption-dropout coins (``torch.rand``; a dropped caption's text
    tensors, the family's ``text_names``, become the empty prompt's, ``features.negative``), the noise
    (``torch.randn`` of the latents' shape), the noise levels (:func:`hyv_lib.models.flow_matching.sample_sigmas`).
    Each tensor is stacked as the folder stores it (stage 1's without its batch axis); i2v adds each clip's
    first-frame conditions (the family's ``image_names``, never dropped, as at sampling time)."""
    return build_batches(features, picks, None, preset=preset, model_config=model_config, task=task,
                         caption_dropout=caption_dropout, shift=shift, sampling=sampling, generator=generator)[0]


def build_batches(features, picks: list[int], prior_picks: list[int] | None, *, preset: Preset, model_config,
                  task: str, caption_dropout: float, shift: float, sampling: str, generator: torch.Generator,
                  drop: torch.Tensor | None = None) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor] | None]:
    """:func:`build_batch`'s batch, and with ``prior_picks`` (one per clip) its prior half: the same noisy latents,
    noise levels (and first-frame conditions) with the text of the features' prior captions ``prior_picks``
    (``features.prior(i)``) in place of the clips' (its ``target`` is not used: the step trains it towards the
    frozen model's prediction). The same draws as :func:`build_batch`; ``drop``: the caption-dropout coins already
    drawn (:func:`draw_dropout`, the first draw), not drawn again."""
    family = family_for(preset)
    clips = [features[i] for i in picks]
    x0 = torch.stack([_squeeze_to(c["latents"], 4).float() for c in clips])
    size = len(picks)
    drop = draw_dropout(size, caption_dropout, generator) if drop is None else drop
    negative = features.negative
    texts = {name: torch.stack([negative[name] if d else c[name] for c, d in zip(clips, drop.tolist())])
             for name in family.text_names}
    noise = torch.randn(x0.shape, generator=generator)
    sigma = sample_sigmas(size, shift=shift, sampling=sampling, generator=generator)
    images = None
    if task == "i2v":
        images = {name: torch.stack([c[name].float() for c in clips]) for name in family.image_names}
    batch = family.training_inputs(preset, model_config, x0, noise, sigma, texts, images)
    if prior_picks is None:
        return batch, None
    priors = [features.prior(i) for i in prior_picks]
    prior_texts = {name: torch.stack([p[name] for p in priors]) for name in family.text_names}
    return batch, family.training_inputs(preset, model_config, x0, noise, sigma, prior_texts, images)


# ------------------------------------------------------------------------------------------------ checks
def features_digest(preset: Preset, model_path: str | None) -> str:
    """The ``model_config_digest`` features extracted with this preset and model carry
    (:func:`hyv_lib.training.features.model_config_digest`: the VAE's config and the preset's conditioning layout).
    A model folder's VAE is built on the meta device from its config (no weights read)."""
    import diffusers

    vae_class = getattr(diffusers, get_adapter(preset.model).vae_class)
    path = os.path.expanduser(model_path) if model_path else preset.bundled_path
    if path is None:
        vae = load_components(preset, None, ["vae"])["vae"]
    else:
        try:
            subfolder = "vae" if model_path else preset.bundled_subfolder("vae")
            config = vae_class.load_config(path, subfolder=subfolder)
        except (OSError, ValueError) as err:
            raise HyvInputError("model_path", f"cannot read the VAE config of {path!r}: {err}") from None
        with torch.device("meta"):
            vae = vae_class.from_config(config)
    return model_config_digest(vae, preset)


def check_features(features, preset: Preset, transformer, task: str, digest: str | None = None) -> None:
    """One HyvInputError naming ``features`` when the feature folder was made for another preset or model (its
    ``preset`` and ``model_config_digest`` metadata against ``preset`` and ``digest``, :func:`features_digest`),
    holds no clips, or lacks the first-frame conditions ``--task i2v`` needs (naming ``task``); the latent channels
    and text widths are checked against the transformer too."""
    meta = features.metadata
    where = getattr(features, "path", "the feature folder")
    made_for = meta.get("preset")
    if made_for is not None and made_for not in (preset.name, json.loads(json.dumps(preset.to_dict()))):
        name = made_for if isinstance(made_for, str) else made_for.get("name", "another preset")
        raise HyvInputError("features", f"{where!r} was extracted for preset {name}, not {preset.name}: train "
                                        f"with `preset` {name}, or extract features with `preset` {preset.name}")
    if digest is not None and meta.get("model_config_digest") not in (None, digest):
        raise HyvInputError("features", f"{where!r} was extracted with another model (config digest "
                                        f"{str(meta['model_config_digest'])[:12]}; this `preset` and `model_path` "
                                        f"give {digest[:12]}): extract features with this model")
    if len(features) == 0:
        raise HyvInputError("features", f"{where!r} holds no clips (every entry failed or none was given)")
    family = family_for(preset)
    first = features[0]
    config = transformer.config
    missing = [name for name in family.text_names if name not in first]
    if missing:
        raise HyvInputError("features", f"{where!r} holds no {', '.join(missing)}: features of another model")
    for name, key in family.text_widths.items():
        if first[name].shape[-1] != config[key]:
            raise HyvInputError("features", f"{where!r}: {name} has width {first[name].shape[-1]}, the transformer "
                                            f"expects {config[key]}: features of another model")
    if task == "i2v" and not all(k in first for k in family.image_names):
        raise HyvInputError("task", f"i2v needs first-frame conditions, and {where!r} was extracted without them "
                                    "(extract features for an i2v preset or task)")
    x0 = _squeeze_to(first["latents"], 4)[None].float()
    texts = {name: first[name][None] for name in family.text_names}
    images = {name: first[name][None] for name in family.image_names} if task == "i2v" else None
    try:  # the batch the family builds from this clip must be what the transformer takes
        channels = family.training_inputs(preset, config, x0, torch.zeros_like(x0), torch.ones(1), texts,
                                          images)["hidden_states"].shape[1]
    except ValueError as err:
        raise HyvInputError("task" if task == "i2v" else "features", str(err)) from None
    if channels != config.in_channels:
        raise HyvInputError("features", f"{where!r}: latents of {x0.shape[1]} channels make {channels} input "
                                        f"channels, the transformer takes {config.in_channels}: features of another "
                                        "model")


# ------------------------------------------------------------------------------------------------ files
@contextlib.contextmanager
def run_lock(output_dir: str) -> Iterator[None]:
    """The output folder's run lock (:func:`hyv_lib.base.lock.folder_lock`), held by rank 0 (the rank that writes),
    and the partial files a killed run left there removed."""
    if process_rank() != 0 or os.environ.get("RANK", "0") != "0":
        yield
        return
    with folder_lock(output_dir, "output_dir", part="train"):
        clean_partials(output_dir)
        for name in os.listdir(output_dir):  # a transformer folder a killed run was writing (_save_transformer)
            if name.startswith(TMP_PREFIX) and os.path.isdir(os.path.join(output_dir, name)):
                shutil.rmtree(os.path.join(output_dir, name), ignore_errors=True)
        yield


def read_log(path: str) -> list[dict[str, Any]]:
    """The records of a ``train_log.jsonl`` ([] if there is none; a torn last line is dropped)."""
    records = []
    try:
        with open(path) as f:
            for line in f:
                with contextlib.suppress(ValueError):
                    records.append(json.loads(line))
    except FileNotFoundError:
        pass
    return records


def _rewrite_log(path: str, records: list[dict[str, Any]]) -> None:
    with atomic_path(path) as tmp:
        with open(tmp, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)


def _save_transformer(module, output_dir: str) -> str:
    """``module.save_pretrained`` into ``output_dir/transformer``: written in a temporary sibling folder, then renamed
    into place (a previous run's folder is moved aside first and removed after)."""
    target = os.path.join(output_dir, TRANSFORMER_DIR)
    tmp = tempfile.mkdtemp(prefix=TMP_PREFIX, suffix=".partial", dir=output_dir)
    old = None
    try:
        module.save_pretrained(tmp, safe_serialization=True)
        if os.path.exists(target):
            old = tempfile.mkdtemp(prefix=f"{TMP_PREFIX}old-", dir=output_dir)
            os.replace(target, os.path.join(old, TRANSFORMER_DIR))
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if old:
            shutil.rmtree(old, ignore_errors=True)
    return target


def _rng_state(generator: torch.Generator) -> dict[str, torch.Tensor]:
    state = {"batches": generator.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(generator: torch.Generator, state: dict[str, Any]) -> None:
    generator.set_state(state["batches"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ------------------------------------------------------------------------------------------------ the loop
def make_train_step(runtime: str, transformer, *, trainable: str, learning_rate: float, warmup_steps: int,
                    weight_decay: float, mesh: str | None = None, remat: bool = True, attention: str = "auto",
                    attention_options: dict[str, Any] | None = None, schedule: str = "constant",
                    decay_steps: int | None = None):
    """The runtime's TrainStep: :class:`hyv_lib.runtimes.torch_train.TorchTrainStep` (one device, or FSDP2 under
    torchrun) or :class:`hyv_lib.runtimes.jax_train.JaxTrainStep` (JAX, FSDP over ``mesh``), with the same
    hyper-parameters: AdamW (betas 0.9/0.999, eps 1e-8), clipping to norm 1, a linear warmup to ``learning_rate``
    over ``warmup_steps`` updates, then ``schedule`` (``constant``; ``cosine`` or ``linear`` to zero at update
    ``decay_steps``: :func:`hyv_lib.runtimes.torch_train.lr_schedule`). ``attention``: hyv_lib's masked attention
    backend (``auto``: flash or SDPA on the valid tokens on CUDA, SDPA on the CPU, Splash/XLA on the jax runtime;
    every one has a backward); ``diffusers`` keeps diffusers' own processor on the torch runtime, whose dense
    [B, 1, S, S] mask alone is 12 GiB per sample at 720p/121f. ``attention_options``: the backend's options
    (``{"ssta": hyv_lib.SstaConfig(...)}`` for ``ssta``, whose backward on the CPU is hyv_lib's tile backward); None:
    its defaults."""
    options = dict(attention_options or {})
    if runtime == "torch" and attention != "diffusers":
        adapter_for(transformer).use_attention(transformer, attention, **options)
    rate = lr_schedule(schedule, learning_rate, warmup_steps, decay_steps or 1)
    hyper = dict(trainable=trainable, learning_rate=rate,
                 weight_decay=weight_decay, betas=(0.9, 0.999), eps=1e-8, max_grad_norm=1.0, remat=remat)
    if runtime_name(runtime) == "jax":
        return JaxTrainStep(transformer, mesh=mesh, attention=attention, attention_options=options, **hyper)
    return TorchTrainStep(transformer, **hyper)


@torch.random.fork_rng(devices=[])  # the run seeds torch's global RNG; the caller's is restored afterwards
def train(features: str | Any, *, preset: str | Preset | None, output_dir: str, steps: int,
          model_path: str | None = None,
          lora_rank: int | None = None, lora_alpha: float | None = None, full: bool = False,
          learning_rate: float | None = None, batch_size: int | None = None,
          task: str = "t2v", runtime: str = "torch", mesh: str | None = None, checkpoint_every: int | None = None,
          seed: int = DEFAULTS["seed"], caption_dropout: float = DEFAULTS["caption_dropout"],
          warmup_steps: int = DEFAULTS["warmup_steps"], weight_decay: float = DEFAULTS["weight_decay"],
          shift: float = DEFAULTS["shift"], sampling: str = DEFAULTS["sampling"], dtype: str | None = None,
          gradient_checkpointing: bool = True, attention: str = "auto", progress: bool = True,
          transformer=None, attention_options: dict[str, Any] | None = None,
          lora_targets: str | None = None, lr_schedule: str | None = None,
          prior_weight: float | None = None, dropout_target: str | None = None) -> TrainResult:
    """Fine-tune a HunyuanVideo-1.5 transformer on a feature folder
    (:func:`hyv_lib.training.features.extract_features`) with its flow-matching objective, into ``output_dir``.
    ``learning_rate``, ``batch_size``, ``lr_schedule`` and
    ``lora_targets`` left None take the preset's :func:`train_defaults`.

    A LoRA adapter of ``lora_rank`` (:func:`hyv_lib.models.lora.add_lora`, ``lora_alpha`` default = rank) on the
    layers of the target groups ``lora_targets`` (``attn``, the real presets' default: the attention projections;
    ``attn,mlp`` adds the feed-forward layers; ``all`` every nn.Linear; the model adapter's ``lora_targets`` says
    which) ends as ``output_dir/pytorch_lora_weights.safetensors`` (diffusers' format); ``full`` trains every weight and ends as a
    diffusers-format ``output_dir/transformer`` folder. Each step: :func:`pick_clips` (one latent shape per batch),
    :func:`build_batch` (caption dropout, noise, logit-normal noise levels with the shift, t2v or i2v inputs), one
    update of the runtime's step (:func:`make_train_step`), a record in ``train_log.jsonl`` (step, loss, lr,
    seconds). Every ``checkpoint_every`` steps and at the end, ``checkpoint.safetensors`` holds the trainable weights,
    the optimizer state, the step count and every RNG state, written atomically: rerunning a killed run with the same
    command resumes at its last checkpoint and reproduces the same losses (log records past it are dropped); other
    settings in a folder holding a checkpoint are refused. ``steps`` may grow to train a finished run further,
    except under a decaying ``lr_schedule``. ``lr_schedule``: after the warmup the learning rate stays at
    ``learning_rate`` (``constant``) or decays to zero at step ``steps`` (``cosine``, ``linear``; ``steps`` is then
    part of the run's settings).
    ``prior_weight`` w: with a LoRA on the torch runtime and a features folder holding prior captions
    (``extract_features``' ``prior_captions``), each batch gets a prior half (:func:`build_batches`: the same noisy
    latents, a prior caption's text) trained towards the frozen model's own prediction (the adapter switched off), and
    the loss is (data + w * prior) / (1 + w): what the model drew for those captions is kept without clips of them
    (DreamBooth's prior preservation, with the model's predictions in place of its drawn clips). Default: 1 when the
    folder holds prior captions (0 with ``full`` or the jax runtime), else 0; 0 turns it off.
    ``dropout_target``: what a clip whose caption was dropped (``caption_dropout``) is trained towards: ``data``, its
    own velocity (the official trainer's), or ``frozen``, the frozen model's prediction for the empty prompt (a LoRA
    on the torch runtime), so the unconditional half of guidance stays where it was: trained on clips of one new
    thing, it drifts towards them, and guidance then pushes every other caption away from them. Default: the
    preset's (``frozen`` for hyv-tiny, ``data`` for the real presets; ``data`` with ``full`` or the jax runtime).
    The folder's run lock keeps a second run out. ``transformer``: a module to train instead of loading the preset's
    (``model_path``); ``dtype``: fp32 or bf16 (default: the preset's); ``attention``, ``attention_options``: see
    :func:`make_train_step`.
    """
    runtime = runtime_name(runtime)
    preset = choose_preset(preset, model_path).preset  # None: the folder's (or the default); a misfit is refused
    chosen = train_defaults(preset)  # the preset's measured settings where the caller gives none
    learning_rate = chosen["learning_rate"] if learning_rate is None else learning_rate
    batch_size = chosen["batch_size"] if batch_size is None else batch_size
    lr_schedule = chosen["lr_schedule"] if lr_schedule is None else lr_schedule
    settings = check_settings(steps, learning_rate, batch_size, task, runtime, checkpoint_every, seed,
                              caption_dropout, warmup_steps, weight_decay, shift, sampling, lora_rank, lora_alpha,
                              full, mesh, lr_schedule)
    if attention not in ("auto", "diffusers", *BACKENDS):
        raise HyvInputError("attention", f"must be auto, diffusers or one of {', '.join(BACKENDS)}; got {attention!r}")
    if attention == "diffusers" and runtime != "torch":
        raise HyvInputError("attention", f"diffusers' own processor runs on `runtime` torch only, not {runtime!r}")
    if runtime == "jax" and attention in BACKENDS and "grid" in BACKENDS[attention].options:
        raise HyvInputError("attention", f"{attention} has no backward on `runtime` jax yet (its Pallas kernel is "
                                         "forward-only): train SSTA with `runtime` torch")
    if full and lora_targets is not None:
        raise HyvInputError("lora_targets", "chooses a LoRA adapter's layers: it needs `lora_rank`, not `full`")
    targets = None if full else parse_lora_targets(chosen["lora_targets"] if lora_targets is None else lora_targets,
                                                   get_adapter(preset.model).lora_targets)
    steps, batch_size = settings["steps"], settings["batch_size"]
    checkpoint_every = settings["checkpoint_every"] or steps
    if isinstance(features, (str, os.PathLike)):
        features = FeatureSet(os.fspath(features))
    ensure_output_dir(output_dir)
    with run_lock(output_dir):
        if transformer is None:
            transformer = load_components(preset, model_path, ["transformer"],
                                          dtype or preset.default_dtype)["transformer"]
        check_features(features, preset, transformer, task, features_digest(preset, model_path))
        prior_weight = resolve_prior_weight(prior_weight, chosen["prior_weight"], features, full, runtime)
        dropout_target = resolve_dropout_target(dropout_target, chosen["dropout_target"], full, runtime)
        trainable = "full" if full else "lora"
        lora_alpha = settings["lora_alpha"] if settings["lora_alpha"] is not None else settings["lora_rank"]
        if not full:
            with torch.random.fork_rng(devices=[]):  # peft draws lora_A from the global RNG: seeded by --seed
                torch.manual_seed(settings["seed"])
                add_lora(transformer, settings["lora_rank"], lora_alpha, targets=targets)
        ranks = int(os.environ.get("WORLD_SIZE", "1")) if runtime == "torch" else 1
        if batch_size % ranks:
            raise HyvInputError("batch_size", f"{batch_size} does not split over {ranks} ranks: each rank takes an "
                                              "equal slice of every batch")
        run = RunSettings(
            features=os.path.abspath(getattr(features, "path", "")), preset=preset.name,
            model_digest=config_digest(transformer), trainable=trainable, lora_rank=settings["lora_rank"],
            lora_alpha=None if full else float(lora_alpha), learning_rate=settings["learning_rate"],
            batch_size=batch_size, task=task, seed=settings["seed"], caption_dropout=settings["caption_dropout"],
            warmup_steps=settings["warmup_steps"], weight_decay=settings["weight_decay"], shift=settings["shift"],
            sampling=sampling, runtime=runtime, ranks=ranks, lora_targets=targets, lr_schedule=lr_schedule,
            decay_steps=None if lr_schedule == "constant" else steps, prior_weight=prior_weight,
            dropout_target=dropout_target)
        step = make_train_step(runtime, transformer, trainable=trainable, learning_rate=run.learning_rate,
                               warmup_steps=run.warmup_steps, weight_decay=run.weight_decay, mesh=mesh,
                               remat=gradient_checkpointing, attention=attention,
                               attention_options=attention_options, schedule=run.lr_schedule,
                               decay_steps=run.decay_steps)
        return _run(features, step, run, preset, transformer, output_dir, steps, checkpoint_every, progress)


def _resume(step, run: RunSettings, output_dir: str, generator: torch.Generator, steps: int) -> int:
    """Load the folder's checkpoint into ``step`` and ``generator`` (same settings, at most ``steps`` done); returns
    its step count."""
    path = checkpoint_path(output_dir)
    if not os.path.exists(path):
        return 0
    info = read_info(path)
    if int(info.get("step", 0)) > steps:
        raise HyvInputError("steps", f"{steps}, but {output_dir!r} holds a checkpoint at step {info['step']}: give "
                                     f"`steps` {info['step']} or more, or use another folder")
    saved = dict(info.get("settings", {}))
    if saved.get("trainable") == "lora":  # a checkpoint from before --lora_targets: the attention projections
        saved.setdefault("lora_targets", DEFAULT_LORA_TARGETS)
    saved.setdefault("lr_schedule", "constant")  # a checkpoint from before --lr_schedule
    saved.setdefault("decay_steps", None)
    saved.setdefault("prior_weight", 0.0)  # a checkpoint from before prior captions
    saved.setdefault("dropout_target", "data")  # a checkpoint from before dropout_target
    differ = {k: (saved.get(k), v) for k, v in asdict(run).items() if saved.get(k) != v}
    if set(differ) == {"decay_steps"}:
        raise HyvInputError("steps", f"{steps}, but {output_dir!r} holds a run whose {run.lr_schedule} learning rate "
                                     f"decays to zero at step {saved['decay_steps']}: give `steps` "
                                     f"{saved['decay_steps']} to resume it, or use another folder")
    if differ:
        what = "; ".join(f"{k} {old!r} there, {new!r} now" for k, (old, new) in sorted(differ.items()))
        raise HyvInputError("output_dir", f"{output_dir!r} holds the checkpoint of a run with other settings "
                                          f"({what}): rerun with its settings to resume, or use another folder")
    state, info = load_checkpoint(path)
    step.load_state_dict(state["step"])
    _set_rng_state(generator, state["rng"])
    return int(info["step"])


def _run(features, step, run: RunSettings, preset: Preset, transformer, output_dir: str, steps: int,
         checkpoint_every: int, progress: bool) -> TrainResult:
    writer = process_rank() == 0
    generator = torch.Generator().manual_seed(run.seed)
    torch.manual_seed(run.seed)
    start = _resume(step, run, output_dir, generator, steps)
    log_path = os.path.join(output_dir, LOG_FILE)
    if writer:
        _rewrite_log(log_path, [r for r in read_log(log_path) if r.get("step", 0) <= start])
    shapes = [tuple(s) for s in features.shapes()]
    priors = len(features.prior_captions) if run.prior_weight else 0  # read once, not per step
    records: list[dict[str, Any]] = []
    clock = time.perf_counter()
    bar = tqdm(range(start, steps), desc="train", initial=start, total=steps, disable=not (progress and writer))
    for index in bar:
        picks = pick_clips(shapes, run.batch_size, generator)
        options = dict(preset=preset, model_config=transformer.config, task=run.task,
                       caption_dropout=run.caption_dropout, shift=run.shift, sampling=run.sampling, generator=generator)
        kept = None
        if run.dropout_target == "frozen":  # the coins first, as build_batch draws them
            kept = draw_dropout(len(picks), run.caption_dropout, generator)
            options["drop"] = kept
        if run.prior_weight:
            prior_picks = torch.randint(priors, (run.batch_size,), generator=generator).tolist()
            batch, prior = build_batches(features, picks, prior_picks, **options)
            loss = step.step(batch, prior=prior, prior_weight=run.prior_weight, frozen_rows=kept)
        elif kept is not None:
            loss = step.step(build_batches(features, picks, None, **options)[0], frozen_rows=kept)
        else:
            loss = step.step(build_batch(features, picks, **options))
        if loss != loss or loss in (float("inf"), float("-inf")):
            raise HyvFaultError(f"train step {index + 1}", f"the loss is {loss}; lower `learning_rate`")
        record = {"step": index + 1, "loss": loss, "lr": float(step_lr(run, index)),
                  "shape": list(shapes[picks[0]]), "seconds": round(time.perf_counter() - clock, 3)}
        records.append(record)
        bar.set_postfix(loss=f"{loss:.4f}")
        if writer:
            with open(log_path, "a") as f:
                f.write(json.dumps(record) + "\n")
        if (index + 1) % checkpoint_every == 0 or index + 1 == steps:
            _checkpoint(step, run, output_dir, index + 1, generator, writer)
    if start >= steps and writer:  # nothing left to train: the outputs are (re)written from the checkpoint
        logger.info("train: %s already holds step %d of %d", output_dir, start, steps)
    module = step.trained_transformer()
    output = None
    if writer and module is not None:
        if run.trainable == "lora":
            output = save_lora(module, os.path.join(output_dir, LORA_FILE),
                               metadata=dict(preset=run.preset, steps=steps, task=run.task, features=run.features,
                                             targets=run.lora_targets))
        else:
            output = _save_transformer(module, output_dir)
    return TrainResult(output_dir=os.path.abspath(output_dir), steps=steps, resumed_from=start, records=records,
                       output=output)


def _checkpoint(step, run: RunSettings, output_dir: str, done: int, generator: torch.Generator, writer: bool) -> None:
    state = step.state_dict()  # collective under FSDP
    if writer:
        save_checkpoint(checkpoint_path(output_dir), {"step": state, "rng": _rng_state(generator)},
                        info={"step": done, "settings": asdict(run)})
