"""Issue 45's sweep: LoRA recipes on hyv-tiny's new-colour or new-motion data, trained per seed, held-out captions read.

Each run: the dataset's features (extracted once through the CLI's ``extract_features``, cached in ``--work``),
``hyv_lib.training.loop.train`` with the recipe and seed, the LoRA merged (``load_pipeline(lora=...)``), and the
held-out new-colour and known-colour captions generated and read (:mod:`hyv_lib.tiny.finetune_gate`; ``--gate
motion``: new-direction and known-direction captions, :mod:`hyv_lib.tiny.motion_gate`), and what the empty prompt
draws (CFG's negative half). A recipe is ``train``'s keyword arguments (``--set learning_rate=5e-3``,
``--set lora_targets=attn,mlp``; what is not set takes ``train``'s defaults, recorded as resolved at run time; the
features hold hyv-tiny's prior captions, extract_features' default, kept at ``prior_weight`` 1 unless ``--set
prior_weight=0``: runs recorded before 2026-12-02 had none) plus
what only this sweep can set, by patching the loop for the run:

- ``schedule``: constant; cosine0, linear0 (to zero: ``train``'s ``lr_schedule`` cosine and linear); cosine (to 5%
  of the peak after warmup, this sweep's own).
- ``ema``: the saved LoRA is an exponential moving average of the trained weights with this decay (0: none).
- ``uncond_target``: data (a caption-dropped clip is trained towards its data velocity, the loop's own) or base
  (towards the frozen model's prediction, the adapter off: the unconditional model kept).
- ``guided_target``: w > 0 trains a captioned clip towards ``u + (v - u) / w``, u the model's own prediction for the
  empty prompt, so that CFG at scale w gives the data velocity v.

Every run is appended to ``--results`` (JSON) as it finishes, failures included.

    python tools/finetune_sweep.py --name defaults --dataset issue --seeds 0 1 2 3 --set lora_rank=8 --set steps=500
    python tools/finetune_sweep.py --gate motion --name defaults --set lora_rank=8 --set steps=500 \
        --results benchmarks/results/finetune_motion_2026-11-28_cpu.json
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import inspect
import json
import math
import os
import platform
import sys
import tempfile
import time

import torch

import hyv_lib
from hyv_lib.cli.commands import run as cli
from hyv_lib.models import lora as lora_module
from hyv_lib.models.families import get_preset
from hyv_lib.models.hunyuan_video15.training import TEXT_KEYS
from hyv_lib.tiny import finetune_gate, motion_gate
from hyv_lib.training import loop
from hyv_lib.runtimes.torch_train import LinearWarmup, TorchTrainStep

PRESET = "tiny_trained"
#: ``--gate``: the module that writes the data and reads the videos, and its reader (colour or direction).
GATES = {"colour": (finetune_gate, finetune_gate.read_colors), "motion": (motion_gate, motion_gate.read_directions)}
gate, read = GATES["colour"]  # main() sets the chosen one
#: ``--prior_captions``: the text file extract_features encodes as the features' prior captions (None: the preset's).
prior_captions = None


#: ``--dataset drawn``: the gate's 12 clips (``issue``) and a prior clip of each caption drawn by hyv-tiny itself with
#: one of these known words for the new one (``prior_clips --known``), taking turns.
DRAWN_KNOWN = {finetune_gate.__name__: "red,green,blue,yellow", motion_gate.__name__: motion_gate.PRIOR_KNOWN}
#: The sweep's ``schedule`` names that are ``train``'s ``lr_schedule`` (the others: constant, and cosine to 5%).
LR_SCHEDULE = {"constant": "constant", "cosine0": "cosine", "linear0": "linear"}


class CosineToFloor(LinearWarmup):
    """Linear warmup to the peak, then a cosine over the rest of ``total`` updates to 5% of the peak (the sweep's
    ``schedule`` cosine; ``train``'s own cosine goes to zero)."""

    total = 1

    def __call__(self, count):
        if count < self.warmup_steps:
            return self.peak * (count + 1) / self.warmup_steps
        progress = min(1.0, (count - self.warmup_steps) / max(1, self.total - self.warmup_steps))
        return self.peak * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress)))


def features(work: str, dataset: str, word: str) -> str:
    """The dataset's feature folder in ``work`` (the new colour or direction named ``word``), made once through the
    CLI."""
    folder = os.path.join(work, dataset if word == finetune_gate.NEW_COLOR else f"{dataset}-{word}")
    out = os.path.join(folder, "features")
    flags = []
    if prior_captions:  # another file of prior captions (or none): another features folder
        if prior_captions == "none":
            out += "-no-prior"
        else:
            with open(prior_captions, "rb") as f:
                out += "-prior-" + hashlib.sha256(f.read()).hexdigest()[:12]
        flags = ["--prior_captions", prior_captions]
    if not os.path.exists(os.path.join(out, "features.safetensors.index.json")):
        if dataset == "drawn":  # the 12 clips and hyv-tiny's own clips of their captions with a known word
            data_json = os.path.join(folder, "prior", "data.json")
            assert cli(["prior_clips", "--data_json", gate.write_dataset(folder, "issue", word=word), "--word", word,
                        "--known", DRAWN_KNOWN[gate.__name__], "--preset", PRESET, "--output_dir",
                        os.path.dirname(data_json), "--quiet"]) == 0
        else:
            data_json = gate.write_dataset(folder, dataset, word=word)
        assert cli(["extract_features", "--data_json", data_json, "--preset", PRESET, "--output_dir", out,
                    *flags, "--quiet"]) == 0
    return out


def resolved(recipe: dict) -> dict:
    """The recipe with every ``train`` keyword it leaves out at its current default (so a later change of the
    defaults does not change what a recorded run means)."""
    params = inspect.signature(loop.train).parameters
    keys = ("lora_rank", "lora_alpha", "caption_dropout", "warmup_steps", "weight_decay", "shift", "sampling")
    out = {k: params[k].default for k in keys}
    chosen = loop.train_defaults(get_preset(PRESET))  # the preset's own where train's signature says None
    out.update({k: chosen[k] for k in ("learning_rate", "batch_size", "lora_targets", "prior_weight",
                                       "dropout_target")})
    out.update(schedule={v: k for k, v in LR_SCHEDULE.items()}[chosen["lr_schedule"]], uncond_target="data",
               ema=0.0, guided_target=0.0, gradient_checkpointing=False)
    out.update(recipe)
    if out["lora_alpha"] is None:
        out["lora_alpha"] = out["lora_rank"]
    if out["lora_targets"] is None:
        out["lora_targets"] = lora_module.DEFAULT_LORA_TARGETS
    return out


@contextlib.contextmanager
def sweep_only(recipe: dict):
    """Patch in what ``train`` cannot be told: the cosine schedule, the base model's target for dropped captions."""
    schedule, build_batch, step = loop.lr_schedule, loop.build_batch, TorchTrainStep.step
    build_batches = loop.build_batches
    trained = TorchTrainStep.trained_transformer
    if recipe["guided_target"]:
        w = float(recipe["guided_target"])
        negative = {}

        def marked(features, picks, *, caption_dropout, generator, **kwargs):
            state = generator.get_state()
            drop = torch.rand(len(picks), generator=generator) < caption_dropout
            generator.set_state(state)
            batch = build_batch(features, picks, caption_dropout=caption_dropout, generator=generator, **kwargs)
            empty = build_batch(features, picks, caption_dropout=1.0, generator=torch.Generator(), **kwargs)
            for k in TEXT_KEYS:
                batch["empty_" + k] = empty[k]
            batch["caption_dropped"] = drop
            return batch

        def guided_step(self, batch):
            drop = batch.pop("caption_dropped")
            empty = {k: batch.pop("empty_" + k) for k in TEXT_KEYS}
            if not drop.all():
                inputs = self._local({**batch, **empty})
                inputs.pop("target")
                with torch.no_grad():
                    u = self.transformer(**inputs, return_dict=False)[0].float().cpu()
                v = batch["target"]
                guided = u + (v - u) / w  # the conditional output that CFG at scale w turns into v
                batch = dict(batch, target=torch.where(drop.view(-1, 1, 1, 1, 1), v, guided))
            return step(self, batch)

        loop.build_batch, TorchTrainStep.step = marked, guided_step
    if recipe["ema"]:
        decay = float(recipe["ema"])

        def ema_step(self, batch):
            loss = step(self, batch)
            shadow = self.__dict__.setdefault("ema", [p.detach().clone() for p in self.params])
            for e, p in zip(shadow, self.params):
                e.mul_(decay).add_(p.detach(), alpha=1 - decay)
            return loss

        def ema_trained(self):
            for e, p in zip(self.ema, self.params):
                p.data.copy_(e)
            return trained(self)

        TorchTrainStep.step, TorchTrainStep.trained_transformer = ema_step, ema_trained
    if recipe["uncond_target"] == "base":
        def marked_batches(features, picks, prior_picks, *, caption_dropout, generator, **kwargs):
            state = generator.get_state()
            drop = torch.rand(len(picks), generator=generator) < caption_dropout
            generator.set_state(state)  # build_batches draws the same coins first
            batch, prior = build_batches(features, picks, prior_picks, caption_dropout=caption_dropout,
                                         generator=generator, **kwargs)
            batch["caption_dropped"] = drop
            return batch, prior

        def base_target_step(self, batch, **prior):
            drop = batch.pop("caption_dropped")
            if drop.any():
                inputs = self._local(batch)
                inputs.pop("target")
                self.transformer.disable_adapters()
                try:
                    with torch.no_grad():
                        base = self.transformer(**inputs, return_dict=False)[0].float().cpu()
                finally:
                    self.transformer.enable_adapters()
                batch = dict(batch, target=torch.where(drop.view(-1, 1, 1, 1, 1), base, batch["target"]))
            return step(self, batch, **prior)

        loop.build_batches, TorchTrainStep.step = marked_batches, base_target_step
    elif recipe["uncond_target"] != "data":
        raise ValueError(f"uncond_target: {recipe['uncond_target']!r}")
    if recipe["schedule"] == "cosine":
        loop.lr_schedule = lambda name, peak, warmup, total: type("Floor", (CosineToFloor,), {"total": total})(
            peak, warmup)
    elif recipe["schedule"] not in LR_SCHEDULE:
        raise ValueError(f"schedule: {recipe['schedule']!r}")
    try:
        yield
    finally:
        loop.lr_schedule, loop.build_batch, TorchTrainStep.step = schedule, build_batch, step
        loop.build_batches = build_batches
        TorchTrainStep.trained_transformer = trained


def empty_prompt(pipe) -> list:
    """The colours (directions) the unconditional model draws (the empty prompt, guidance 1, seeds 7..14): CFG's
    negative half."""
    return read(pipe.generate("", seed=gate.PROBE_SEED + i, num_inference_steps=gate.PROBE_STEPS,
                              guidance_scale=1.0, progress=False).frames for i in range(8))


def one_run(work: str, dataset: str, recipe: dict, seed: int, word: str) -> dict:
    """Train the recipe with ``seed`` on ``dataset`` and score the held-out captions."""
    kwargs = {k: v for k, v in recipe.items() if k not in ("schedule", "uncond_target", "ema", "guided_target")}
    kwargs["lr_schedule"] = LR_SCHEDULE.get(recipe["schedule"], "cosine")  # cosine: patched to its 5% floor
    out = tempfile.mkdtemp(prefix="lora-", dir=work)
    start = time.perf_counter()
    with sweep_only(recipe):
        result = loop.train(features(work, dataset, word), preset=PRESET, output_dir=out, seed=seed, progress=False,
                            **kwargs)
    seconds = time.perf_counter() - start
    pipe = hyv_lib.load_pipeline(PRESET, lora=out, progress=False)
    scores = gate.score(gate.probe(pipe, word=word))
    scores["empty_prompt_reads"] = empty_prompt(pipe)
    losses = [r["loss"] for r in result.records]
    head, tail = losses[:max(1, len(losses) // 10)], losses[-max(1, len(losses) // 10):]
    return {"seed": seed, **scores, "lora": out, "train_seconds": round(seconds, 1),
            "loss_first_tenth": round(sum(head) / len(head), 4), "loss_last_tenth": round(sum(tail) / len(tail), 4)}


def value(text: str):
    """``--set`` values: JSON where it parses (numbers, true, null), else the string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--name", required=True, help="the configuration's name in the results file")
    p.add_argument("--gate", default="colour", choices=sorted(GATES), help="teach a new colour or a new motion")
    p.add_argument("--dataset", default="issue", help="a dataset of the gate's module (colour: issue, chapter9, twins; "
                                                       "motion: issue, prior, prior4, twins; both: drawn, the "
                                                       "issue clips and prior_clips of their captions)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a recipe setting (repeatable)")
    p.add_argument("--word", default=None, help="the new colour's (direction's) name in the captions (default orange "
                                                "(up-right); cyan: a word the tokenizer has one token for)")
    p.add_argument("--before", action="store_true", help="also probe the model without a LoRA")
    p.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "hyv_finetune_sweep"))
    p.add_argument("--results", default="benchmarks/results/finetune_sweep_2026-11-27.json")
    p.add_argument("--note", default="")
    p.add_argument("--prior_captions", default=None, help="extract_features' --prior_captions (a text file; none: "
                                                          "none; default: hyv-tiny's 32)")
    args = p.parse_args(argv)
    global gate, read, prior_captions
    gate, read = GATES[args.gate]
    prior_captions = args.prior_captions
    if args.dataset not in (*gate.DATASETS, "drawn"):
        p.error(f"--dataset: the {args.gate} gate has {', '.join(gate.DATASETS)} and drawn")
    args.word = args.word or gate.NEW_WORD
    if args.gate == "motion":
        args.work = os.path.join(args.work, "motion")
    recipe = resolved(dict((k, value(v)) for k, v in (s.split("=", 1) for s in args.set)))
    if "steps" not in recipe:
        p.error("--set steps=N is required")
    os.makedirs(args.work, exist_ok=True)
    torch.set_num_threads(1)  # tiny models: one thread is steadier on a shared CPU
    results = {"format": "hyv_lib.finetune_sweep/1", "runs": []}
    if os.path.exists(args.results):
        with open(args.results) as f:
            results = json.load(f)
    results.setdefault("machine", f"{platform.machine()}, {os.cpu_count()} cores (shared), torch "
                                  f"{torch.__version__}, 1 thread")
    results.setdefault("probe", {f"new_{args.gate}": [c.caption for c in gate.HELD_OUT],
                                 "known": [c.caption for c in gate.KNOWN_PROBE],
                                 "seeds": f"{gate.PROBE_SEED} + caption index", "steps": gate.PROBE_STEPS})
    if args.before:
        base = hyv_lib.load_pipeline(PRESET, progress=False)
        key = "before" if args.word == gate.NEW_WORD else f"before_{args.word}"
        results[key] = dict(gate.score(gate.probe(base, word=args.word)), empty_prompt_reads=empty_prompt(base))
        print(f"{key}:", results[key])
    entry = {"name": args.name, "gate": args.gate, "dataset": args.dataset, "word": args.word, "recipe": recipe,
             "note": args.note, "seeds": []}
    if prior_captions:
        entry["prior_captions"] = prior_captions
    results["runs"].append(entry)
    for seed in args.seeds:
        r = one_run(args.work, args.dataset, recipe, seed, args.word)
        entry["seeds"].append(r)
        print(f"{args.name} [{args.dataset}] seed {seed}: new {r['new']}/{r['new_total']}, known "
              f"{r['known']}/{r['known_total']}, {r['train_seconds']} s, loss {r['loss_first_tenth']} -> "
              f"{r['loss_last_tenth']}; {r['reads']}; empty prompt {r['empty_prompt_reads']}", flush=True)
        entry["new_per_seed"] = [s["new"] for s in entry["seeds"]]
        entry["known_per_seed"] = [s["known"] for s in entry["seeds"]]
        with open(args.results + ".tmp", "w") as f:
            json.dump(results, f, indent=1)
        os.replace(args.results + ".tmp", args.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
