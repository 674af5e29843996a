"""Issue 45's criterion, measured: does a LoRA teach hyv-tiny a new colour (or motion) for every training seed?

    .venv/bin/python benchmarks/finetune_gate.py [--gate colour|motion] [--recipe gate|issue|taught]
        [--seeds 0 1 2 3] [--output results.json]

Runs :func:`hyv_lib.tiny.finetune_gate.cli_gate` once per training seed, through the command line as a user would
(data.json of mp4 clips -> ``extract_features`` -> ``train`` -> ``generate --lora``): ``gate`` is chapter 9's recipe
on its 48 clips (rank 16, 500 steps of 8 clips at 5e-3, the test's), ``issue`` the issue's command (``train
--lora_rank 8 --steps 500``, defaults otherwise) on its 12 new-colour clips. The probe: the 8 held-out orange
captions and 8 known-colour captions hyv-tiny never trained on, read with hyv-tiny's colour reader. The criterion:
the new colour in at least 6 of 8 held-out captions for every seed, and the known colours kept (no fewer right
than before the LoRA). Not a unit test: minutes on a 2-core CPU (tests/test_finetune_gate.py is the one-seed twin).

``--gate motion`` (:func:`hyv_lib.tiny.motion_gate.cli_gate`): the new direction "up-right" on its 12 clips, read
with the direction reader; ``issue`` the issue's command again, ``taught`` the recipe that teaches it: the 12
clips with their twins (``motion_gate.TWINS``: each caption again with a known direction, a clip of hyv-tiny's
training data) and ``motion_gate.TAUGHT_TRAIN_ARGS`` (``--lora_targets text --lr_schedule cosine``, batches of 8 at
3e-3, 1,000 steps); ``defaults`` the 12 clips alone and ``train --lora_rank 8 --steps 1000``, hyv-tiny's defaults
otherwise (``motion_gate.DEFAULT_TRAIN_ARGS``: those settings, and its prior captions, which extract_features
encodes by default). Its criterion: at least 6 of 8 up-right and at least 6 of 8 known directions kept, for every
seed (tests/test_finetune_motion.py is the one-seed twin).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time

MIN_NEW = 6  #: of the 8 held-out new-colour captions, for every seed
MIN_KNOWN_MOTION = 6  #: of the 8 known-direction captions, for every seed (the motion gate)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gate", default="colour", choices=("colour", "motion"))
    parser.add_argument("--recipe", default="gate", choices=("gate", "issue", "taught", "defaults"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    parser.add_argument("--output", default=None, help="write (or add this recipe to) a results JSON here")
    args = parser.parse_args(argv)
    if args.output and not os.path.isdir(os.path.dirname(os.path.abspath(args.output))):
        parser.error(f"the folder of {args.output!r} does not exist")

    import torch

    import hyv_lib
    from hyv_lib.cli.commands import run
    from hyv_lib.tiny import finetune_gate, motion_gate

    torch.set_num_threads(1)  # tiny models: one thread is steadier on a shared CPU
    gate = motion_gate if args.gate == "motion" else finetune_gate
    recipes = {("colour", "gate"): ("chapter9", finetune_gate.GATE_TRAIN_ARGS),
               ("colour", "issue"): ("issue", finetune_gate.ISSUE_TRAIN_ARGS),
               ("motion", "issue"): ("issue", motion_gate.ISSUE_TRAIN_ARGS),
               ("motion", "taught"): ("twins", motion_gate.TAUGHT_TRAIN_ARGS),
               ("colour", "defaults"): ("issue", motion_gate.DEFAULT_TRAIN_ARGS),
               ("motion", "defaults"): ("issue", motion_gate.DEFAULT_TRAIN_ARGS)}
    if (args.gate, args.recipe) not in recipes:
        parser.error(f"--recipe {args.recipe}: the {args.gate} gate has "
                     f"{', '.join(r for g, r in recipes if g == args.gate)}")
    dataset, train_args = recipes[args.gate, args.recipe]
    rows, before = [], None
    for seed in args.seeds:
        start = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="hyv_finetune_gate_") as folder:
            result = gate.cli_gate(folder, run, seed=seed, train_args=train_args, dataset=dataset,
                                   before=before is None)
        before = before or result["before"]
        after = result["after"]
        row = {"seed": seed, "new": after["new"], "new_total": after["new_total"], "known": after["known"],
               "known_total": after["known_total"], "reads": after["reads"],
               "seconds": round(time.perf_counter() - start, 1)}
        rows.append(row)
        print(f"{args.gate} {args.recipe} seed {seed}: new {row['new']}/{row['new_total']}, known "
              f"{row['known']}/{row['known_total']} (before the LoRA: {before['new']}/{before['new_total']}, "
              f"{before['known']}/{before['known_total']}); {row['seconds']} s", flush=True)
    if args.gate == "motion":
        passed = all(r["new"] >= MIN_NEW and r["known"] >= MIN_KNOWN_MOTION for r in rows)
        criterion = f"up-right >= {MIN_NEW}/8 and known directions >= {MIN_KNOWN_MOTION}/8 for every seed"
    else:
        passed = all(r["new"] >= MIN_NEW for r in rows) and all(r["known"] >= before["known"] for r in rows)
        criterion = f"new colour >= {MIN_NEW}/8 for every seed, known colours no fewer than before"
    print(f"criterion ({criterion}): {'met' if passed else 'NOT met'}")
    if args.output:
        results = {"format": "hyv_lib.finetune_gate/1", "recipes": {}}
        if os.path.exists(args.output):
            with open(args.output) as f:
                results = json.load(f)
        results["machine"] = f"{platform.machine()}, {os.cpu_count()} cores (shared), torch {torch.__version__}"
        results["hyv_lib"] = getattr(hyv_lib, "__version__", None)
        key = args.recipe if args.gate == "colour" else f"{args.gate}-{args.recipe}"
        results["recipes"][key] = {
            "gate": args.gate, "dataset": dataset,
            "train_args": list(train_args), "seeds": rows, "before": before,
            "new_per_seed": [r["new"] for r in rows], "known_per_seed": [r["known"] for r in rows],
            "criterion": criterion, "met": passed}
        with open(args.output, "w") as f:
            json.dump(results, f, indent=1)
        print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
