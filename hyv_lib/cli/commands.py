"""The command line's parser and dispatch: ``python -m hyv_lib COMMAND`` (flag names of the gpu-tpu-pedia scripts)."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
from typing import Callable, Iterator

from ..base.errors import (
    EXIT_BAD_INPUT,
    EXIT_FAULT,
    HyvFaultError,
    HyvInputError,
    one_line,
)
from ..base.files import ensure_output_dir, make_folder, new_folder, umask_modes
from ..base.lock import FolderInUseError
from ..models.components import quiet_loading, save_tiny_pipeline
from ..models.families import DEFAULT_PRESET, PRESETS, get_preset
from ..parallel.jax_env import enable_compile_cache
from ..parallel.sharding import DEFAULT_STRATEGY
from ..pipeline.batch import BatchRunner, parse_shard, read_prompts_file, run_lock, run_prompts_file
from ..pipeline.calibration import calibrate
from ..pipeline.image import load_image
from ..pipeline.settings import STAGE2_SETTINGS
from ..pipeline.stages import generate, stage1, stage2, stage3
from ..planning.planner import format_plan, plan_step
from ..planning.tpu_compile import compile_step, format_report
from ..planning.train_compile import RECIPE_LORA_ALPHA, RECIPE_LORA_RANK, compile_train_step, format_train_report
from ..runtimes.names import runtime_name
from .attention_flags import ssta_overrides
from .error_lines import error_line, flag_text
from .official_flags import official_overrides, preset_from_flags
from .stage_flags import add_calibration_arguments, add_stage1_arguments, add_stage2_arguments, add_stage3_arguments
from .training import (
    add_extract_features_arguments,
    add_merge_lora_arguments,
    add_prior_clips_arguments,
    add_train_arguments,
    extract_features_command,
    merge_lora_command,
    prior_clips_command,
    train_command,
)


def _calibrate_cache(args: argparse.Namespace) -> None:
    """``calibrate_cache``: the curve of one uncached run, written atomically to ``--output``."""
    if not args.output.endswith(".json"):
        raise HyvInputError("--output", f"must be a .json file, got {args.output!r}")
    ensure_output_dir(os.path.dirname(os.path.abspath(args.output)), "--output")  # before the run, not after
    calibration = calibrate(args.preset, args.model_path, prompt=args.prompt, negative_prompt=args.negative_prompt,
                            image_path=args.image_path, seed=args.seed, num_inference_steps=args.num_inference_steps,
                            flow_shift=args.flow_shift, guidance_scale=args.guidance_scale,
                            aspect_ratio=args.aspect_ratio, height=args.height, width=args.width,
                            video_length=args.video_length, no_cache_blocks=args.no_cache_blocks,
                            runtime=args.runtime, mesh=args.mesh, sharding=args.sharding, attention=args.attention,
                            dtype=args.dtype, progress=not args.quiet)
    calibration.save(args.output)
    if not args.quiet:
        print(f"calibrate_cache: done, {calibration.preset} at {calibration.num_inference_steps} steps, flow shift "
              f"{calibration.flow_shift}: curve {list(calibration.curve)} in {os.path.abspath(args.output)}",
              file=sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hyv_lib",
        description="HunyuanVideo-1.5 (and CogVideoX1.5: --preset cogvideox1.5_5b | cogvideox_tiny) in three stages: "
                    "text encoders -> DiT denoising -> VAE decode.",
        epilog="exit codes: 0 done; 1 generate --prompts_file or extract_features ran but some entries or lines "
               "failed; 2 bad input (a "
               "flag, or a model folder, stage file, image or prompts file that is missing or corrupt), refused "
               "before any work; 3 a fault while running (disk full, read-only or forbidden folder, I/O error, NaN "
               "latents). 2 and 3 print one 'error: ...' line and leave no partial file.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    info = sub.add_parser("info", help="print a preset")
    info.add_argument("--preset", default=DEFAULT_PRESET, help=f"{' | '.join(PRESETS)} (default: {DEFAULT_PRESET})")
    info.add_argument("--json", action="store_true", help="machine-readable JSON")
    info.add_argument("--list", action="store_true", help="every preset: name, model and description, one a line")
    stages = {
        "stage1": (sub.add_parser("stage1", help="text -> stage1_embeddings.safetensors"), add_stage1_arguments),
        "stage2": (sub.add_parser("stage2", help="embeddings -> stage2_latents.safetensors"), add_stage2_arguments),
        "stage3": (sub.add_parser("stage3", help="latents -> output_video.mp4"), add_stage3_arguments),
    }
    for stage_parser, add in stages.values():
        add(stage_parser)
    comp = sub.add_parser("compile", help="compile the DiT step for a TPU slice here (no TPU needed): memory, "
                                          "collectives, FLOPs per device")
    comp.add_argument("--preset", default="720p_t2v", help="a preset of `info` (default 720p_t2v)")
    comp.add_argument("--topology", default="v6e:2x4",
                      help="TPU slice in chips: v5e:2x4, v5p:2x2x1, v6e:2x4, tpu7x:2x2x1 (v7x-8), v6e:4x4 "
                           "(multi-host), ... (default v6e:2x4)")
    comp.add_argument("--mesh", default=None,
                      help="e.g. data=2,tensor=4 or sequence=2,tensor=4; must use every device "
                           "(default: data=2 for the CFG batch, tensor = the rest, as far as the heads split: "
                           "the jax runtime's default without --mesh)")
    comp.add_argument("--sharding", default=None, help="tp | tp_replicated_out | fsdp (default tp_replicated_out; "
                                                       "--train: fsdp, the only one)")
    comp.add_argument("--height", type=int, default=None, help="pixels (default: the preset's 16:9 bucket)")
    comp.add_argument("--width", type=int, default=None, help="pixels (default: the preset's 16:9 bucket)")
    comp.add_argument("--video_length", type=int, default=None, help="frames, 4n+1 (default: the preset's)")
    comp.add_argument("--attention", default=None,
                      help="splash (dense, exact) | ssta (SSTA's block-sparse Pallas kernel, the official options) "
                           "(default: the preset's: ssta for *_distilled_sparse, else splash)")
    comp.add_argument("--enable_cache", action="store_true",
                      help="compile DeepCache's full and cached programs instead of the plain step")
    comp.add_argument("--no_cache_blocks", type=int, default=1,
                      help="trailing blocks of the cached step, 0..num_layers (default 1)")
    comp.add_argument("--train", default=None, help="lora | full: compile the train step instead (forward, backward "
                                                    "and AdamW; FSDP, bf16 weights, fp32 optimizer state, remat)")
    comp.add_argument("--lora_rank", type=int, default=RECIPE_LORA_RANK,
                      help=f"--train lora: the rank (default {RECIPE_LORA_RANK}, the official train.py's)")
    comp.add_argument("--lora_alpha", type=float, default=RECIPE_LORA_ALPHA,
                      help=f"--train lora: alpha (default {RECIPE_LORA_ALPHA:g}, the official train.py's)")
    comp.add_argument("--lora_targets", default=None,
                      help="--train lora: the layer groups the LoRA adapts, comma-separated, as `train` takes them "
                           "(default: the attention projections)")
    comp.add_argument("--batch_size", type=int, default=1, help="--train: samples per step (default 1)")
    comp.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    pl = sub.add_parser("plan", help="the analytic planner: FLOPs, per-device memory, collectives and lower bounds "
                                     "of one denoising step on a slice (instant; `compile` asks the TPU compiler)")
    pl.add_argument("--preset", default="720p_t2v", help="a preset of `info` (default 720p_t2v)")
    pl.add_argument("--chip", default="v6e", help="v4 | v5e | v5p | v6e | v7x | H100 | H200 (default v6e)")
    pl.add_argument("--n_chips", type=int, default=8, help="chips (default 8)")
    pl.add_argument("--mesh", default=None, help="TPU: e.g. data=2,tensor=4 (default: data=2 for the CFG batch, "
                                                 "tensor = the rest, as far as the heads split); GPUs: Ulysses over "
                                                 "all of them")
    pl.add_argument("--sharding", default=DEFAULT_STRATEGY, help="TPU: tp | tp_replicated_out | fsdp")
    pl.add_argument("--height", type=int, default=None, help="pixels (default: the preset's 16:9 bucket)")
    pl.add_argument("--width", type=int, default=None, help="pixels (default: the preset's 16:9 bucket)")
    pl.add_argument("--video_length", type=int, default=None, help="frames, 4n+1 (default: the preset's)")
    pl.add_argument("--attention", default="auto", help="auto (the preset's: ssta for the *_sparse presets, else "
                                                        "dense) | dense | ssta (default auto)")
    pl.add_argument("--json", action="store_true", help="one JSON object instead of the lines")
    cal = sub.add_parser("calibrate_cache", help="magcache: one uncached run that writes the per-step curve "
                                                 "(--cache_calibration) for a preset and step count")
    cal.add_argument("--output", required=True, help="the JSON file to write")
    add_calibration_arguments(cal)
    tiny = sub.add_parser("save_tiny", help="write a tiny diffusers-format model folder: with a real preset, that "
                                            "preset's layout (text lengths, channels, VAE) at tiny widths, loadable "
                                            "with --model_path like the real weights")
    tiny.add_argument("--preset", default="720p_t2v", help="720p_t2v | 480p_t2v | tiny (default 720p_t2v)")
    tiny.add_argument("--output_dir", required=True, help="the folder to write (must not exist or be empty)")
    tiny.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0)")
    add_train_arguments(sub.add_parser("train", help="fine-tune the DiT on a feature folder (extract_features): a LoRA "
                                            "(--lora_rank) or every weight (--full), resumable"))
    add_extract_features_arguments(sub.add_parser(
        "extract_features", help="encode a MindSpeed-MM data.json's clips once for training: VAE latents, text "
                                 "embeddings (and first frames for i2v) into sharded safetensors; resumable"))
    add_prior_clips_arguments(sub.add_parser(
        "prior_clips", help="prior preservation for a new concept: the model draws each caption of a data.json with "
                            "a known word in place of the new one; a data.json of your clips and those"))
    add_merge_lora_arguments(sub.add_parser("merge_lora", help="merge a LoRA into a model for good: a whole model "
                                                              "folder (run it with generate --model_path)"))
    gen = sub.add_parser("generate", help="run all three stages")
    gen.add_argument("--prompts_file", default=None,
                     help="many videos in one process: a prompt per line, or JSON lines with prompt / negative_prompt "
                          "/ seed / image_path; each into OUTPUT_DIR/NNNN (NNNN: the entry's number among the prompt "
                          "lines); models load and the step compiles once; a rerun skips the folders complete for the "
                          "same prompt, seed, image and settings and redoes the rest; exit code 1 if any prompt or line "
                          "failed")
    gen.add_argument("--shard", default=None,
                     help="with --prompts_file: I/N, run the entries whose number is I modulo N (worker I of N), into "
                          "the same OUTPUT_DIR/NNNN folders; N workers (processes or machines sharing the folder) "
                          "split one file with no coordination (default: every entry)")
    add_stage1_arguments(gen)
    add_stage2_arguments(gen, dirs=False)
    add_stage3_arguments(gen, input_dir=False)
    for p in [gen, tiny, cal, *(sp for sp, _ in stages.values())]:
        p.add_argument("--quiet", action="store_true", help="no progress bar or summary line")
    for p in [parser, *sub.choices.values()]:  # a flag is spelled out: --num_inf is an error, not --num_inference_steps
        p.allow_abbrev = False
    return parser


def _stage2_kwargs(args: argparse.Namespace) -> dict:
    kwargs = {n: getattr(args, n) for n in (*STAGE2_SETTINGS, "quiet") if n != "ssta"}  # flags named as settings
    # SSTA's options come from the --ssta_* flags; the official scripts' flags (--attn_mode, ...) set what they alias
    return {**kwargs, "ssta": ssta_overrides(args), **official_overrides(args)}


def _save_tiny(args: argparse.Namespace) -> None:
    """``save_tiny``: the folder is written whole or not at all (built in a sibling temporary folder, then renamed),
    its files and folders with the modes the umask gives (0644 and 0755 under umask 022)."""
    import shutil

    preset = get_preset(args.preset)
    target = os.path.abspath(args.output_dir)
    if os.path.exists(target) and (not os.path.isdir(target) or os.listdir(target)):
        raise HyvInputError("--output_dir", f"{args.output_dir!r} exists and is not an empty folder")
    parent = os.path.dirname(target)
    try:
        os.makedirs(parent, exist_ok=True)
        tmp = new_folder(parent, ".save_tiny-")
    except OSError as err:
        raise HyvInputError("--output_dir", f"cannot write in {parent!r}: {err.strerror}") from None
    try:
        save_tiny_pipeline(tmp, seed=args.seed, preset=preset)
        umask_modes(tmp)  # safetensors writes 0600 files
        if os.path.isdir(target):
            os.rmdir(target)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if not args.quiet:
        print(f"save_tiny: done, {preset.name} layout in {target}", file=sys.stderr)


def _generate_many(args: argparse.Namespace) -> int:
    """``generate --prompts_file``: one :class:`hyv_lib.pipeline.batch.BatchRunner` for every prompt of the file."""
    if args.prompt:
        raise HyvInputError("--prompts_file", "give --prompt or --prompts_file, not both")
    shard = parse_shard(args.shard)
    read_prompts_file(args.prompts_file)  # a missing, binary or non-UTF-8 file is bad input: before any model loads
    if args.image_path is not None:
        load_image(args.image_path)
    stage2 = {k: v for k, v in _stage2_kwargs(args).items() if k != "seed"}
    stage3 = dict(fps=args.fps, disable_tiling=args.disable_tiling, save_frames=args.save_frames,
                  vae_dtype=args.vae_dtype, vae_memory_gb=args.vae_memory_gb)
    if args.output_video:
        raise HyvInputError("--output_video", "with --prompts_file each video goes to OUTPUT_DIR/NNNN/output_video.mp4")
    created = make_folder(args.output_dir)  # mkdir is atomic: of two runs racing to make the folder, one made it
    ensure_output_dir(args.output_dir)
    try:  # a second run of this folder (or of this shard) stops here, before any model loads
        with run_lock(args.output_dir, shard):
            pipe = BatchRunner(preset_from_flags(args), args.model_path, args.dtype, stage2=stage2, stage3=stage3,
                               text_device=args.text_device)
            report = run_prompts_file(args.prompts_file, args.output_dir, pipe, seed=args.seed,
                                      progress=not args.quiet, image_path=args.image_path, shard=shard)
    except HyvInputError as err:  # bad settings, refused before any model loaded: leave no new empty folder
        if created and not isinstance(err, FolderInUseError):  # (one another run holds is theirs: left alone)
            with contextlib.suppress(OSError):
                os.rmdir(args.output_dir)
        raise
    for bad in report.bad_lines:
        print(f"error: --prompts_file: line {bad['line']}: {flag_text(bad['error'], args)} (skipped)", file=sys.stderr)
    for entry in report.entries:
        if entry["status"] == "failed":
            print(f"error: --prompts_file: line {entry['line']} ({entry['folder']}): {flag_text(entry['error'], args)}",
                  file=sys.stderr)
    counts = {status: sum(e["status"] == status for e in report.entries) for status in ("done", "skipped", "failed")}
    if not args.quiet:
        compiled = "" if pipe.compilations is None else f"; the step compiled {pipe.compilations} time(s)"
        part = "" if shard is None else f"shard {shard[0]}/{shard[1]}: "
        print(f"generate: {part}{counts['done']} done, {counts['skipped']} already complete, {counts['failed']} failed, "
              f"{len(report.bad_lines)} bad line(s){compiled}; files in {os.path.abspath(args.output_dir)}",
              file=sys.stderr)
    return 1 if report.failed else 0


@contextlib.contextmanager
def library_messages(quiet: bool) -> Iterator[None]:
    """While a command runs, hyv_lib's log messages (stage summaries, weight loading, compilations) go to stderr, one
    line each; ``--quiet`` keeps only warnings. The logger is left as found (the CLI also runs in-process)."""
    logger = logging.getLogger("hyv_lib")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING if quiet else logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def run(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run one command; returns the exit code (bad input: 2)."""
    args = build_parser().parse_args(argv)
    quiet = getattr(args, "quiet", False)
    with contextlib.ExitStack() as stack:
        stack.enter_context(library_messages(quiet))
        if quiet:  # --quiet: no weight-loading or shard-writing bars either
            stack.enter_context(quiet_loading())
        return _run_command(args)


def _info(args: argparse.Namespace) -> None:
    """``info``: one preset (``--preset``), or every preset (``--list``), as text or JSON."""
    if args.list:
        print(json.dumps({name: p.to_json() for name, p in PRESETS.items()}, indent=2) if args.json else
              "\n".join(f"{name}  [{p.model}]  {p.description}" for name, p in PRESETS.items()))
        return
    preset = get_preset(args.preset)
    data = preset.to_json()
    print(json.dumps(data, indent=2) if args.json else
          "\n".join(f"{k}: {v}" for k, v in data.items() if not isinstance(v, dict)))
    if not args.json:  # every preset by name and model, after the one printed (info --list: descriptions)
        print("presets: " + ", ".join(f"{name} [{p.model}]" for name, p in PRESETS.items()))


def _compile(args: argparse.Namespace) -> None:
    """``compile``: the denoising step (or with ``--train`` the train step) for a TPU topology, without a TPU."""
    if args.lora_targets is not None and args.train != "lora":
        raise HyvInputError("--lora_targets", "chooses a LoRA's layers: it needs --train lora")
    if args.train is not None:
        if args.sharding not in (None, "fsdp") or args.enable_cache:
            raise HyvInputError("--sharding" if args.sharding not in (None, "fsdp") else "--enable_cache",
                                "a train step (--train) is FSDP over the mesh, without DeepCache")
        if args.attention not in (None, "splash"):
            raise HyvInputError("--attention", "a train step (--train) compiles with splash: SSTA's TPU kernel has "
                                               "no backward yet (train SSTA on --runtime torch)")
        report = compile_train_step(args.preset, args.topology, train=args.train, lora_rank=args.lora_rank,
                                    lora_alpha=args.lora_alpha, height=args.height, width=args.width,
                                    video_length=args.video_length, batch_size=args.batch_size, mesh=args.mesh,
                                    lora_targets=args.lora_targets)
        print(json.dumps(report, indent=2) if args.json else format_train_report(report))
        return
    report = compile_step(args.preset, args.topology, mesh=args.mesh, sharding=args.sharding or DEFAULT_STRATEGY,
                          height=args.height, width=args.width, video_length=args.video_length,
                          enable_cache=args.enable_cache, no_cache_blocks=args.no_cache_blocks,
                          attention=args.attention)
    print(json.dumps(report, indent=2) if args.json else format_report(report))


def _plan(args: argparse.Namespace) -> None:
    """``plan``: the analytic per-device plan of one step."""
    report = plan_step(args.preset, args.height, args.width, args.video_length, chip=args.chip,
                       n_chips=args.n_chips, mesh=args.mesh, sharding=args.sharding, attention=args.attention)
    print(json.dumps(report, indent=2) if args.json else format_plan(report))


def _stage1(args: argparse.Namespace) -> None:
    stage1(preset=preset_from_flags(args), prompt=args.prompt, negative_prompt=args.negative_prompt,
           output_dir=args.output_dir, model_path=args.model_path, dtype=args.dtype,
           image_path=args.image_path, text_device=args.text_device)


def _stage2(args: argparse.Namespace) -> None:
    stage2(input_dir=args.input_dir, output_dir=args.output_dir, preset=args.preset,
           model_path=args.model_path, **_stage2_kwargs(args))


def _stage3(args: argparse.Namespace) -> None:
    stage3(input_dir=args.input_dir, output_video=args.output_video, fps=args.fps,
           disable_tiling=args.disable_tiling, save_frames=args.save_frames, runtime=args.runtime,
           vae_dtype=args.vae_dtype, vae_memory_gb=args.vae_memory_gb)


def _generate(args: argparse.Namespace) -> int | None:
    """``generate``: one video (``--prompt``), or one per line of a ``--prompts_file``."""
    if args.prompts_file:
        return _generate_many(args)
    if args.shard is not None:
        raise HyvInputError("--shard", "splits a --prompts_file; one --prompt is one video")
    generate(preset=preset_from_flags(args), prompt=args.prompt, negative_prompt=args.negative_prompt,
             output_dir=args.output_dir, model_path=args.model_path, dtype=args.dtype,
             output_video=args.output_video, fps=args.fps, disable_tiling=args.disable_tiling,
             save_frames=args.save_frames, vae_dtype=args.vae_dtype, image_path=args.image_path,
             vae_memory_gb=args.vae_memory_gb, text_device=args.text_device, **_stage2_kwargs(args))
    return None


#: Each command's handler: it runs the parsed arguments and returns its exit code (None: 0).
COMMANDS: dict[str, Callable[[argparse.Namespace], int | None]] = {
    "info": _info, "compile": _compile, "plan": _plan, "save_tiny": _save_tiny, "calibrate_cache": _calibrate_cache,
    "stage1": _stage1, "stage2": _stage2, "stage3": _stage3, "generate": _generate, "train": train_command,
    "extract_features": extract_features_command, "merge_lora": merge_lora_command,
    "prior_clips": prior_clips_command,
}
#: The commands that print no "done, files in ..." line (they write no stage folder, or say where themselves).
QUIET_COMMANDS = ("info", "compile", "plan", "save_tiny", "calibrate_cache")


def _run_command(args: argparse.Namespace) -> int:
    """One parsed command through :data:`COMMANDS`; returns the exit code."""
    if runtime_name(getattr(args, "runtime", None)) == "jax":  # the CLI's policy, not a library side effect
        enable_compile_cache(os.environ.get("HYV_COMPILE_CACHE_DIR"))
    try:
        code = COMMANDS[args.command](args)
    except HyvInputError as err:
        print(error_line(err.argument, err.message, args), file=sys.stderr)  # the library names parameters
        return EXIT_BAD_INPUT
    except HyvFaultError as err:  # a fault while running (NaN latents, ffmpeg): what failed and why
        print(error_line(err.subject, err.message, args), file=sys.stderr)
        return EXIT_FAULT
    except OSError as err:  # a write the OS refused (disk full, read-only, permissions, I/O error): the path and why
        where = f"{err.filename}: " if err.filename is not None else ""
        print(f"error: {where}{one_line(err.strerror or str(err))}", file=sys.stderr)
        return EXIT_FAULT
    if code is not None:  # a command that reports its own outcome (a prompts file's or a data.json's entries)
        return code
    if args.command not in QUIET_COMMANDS and not getattr(args, "quiet", False):
        out = getattr(args, "output_dir", None) or getattr(args, "input_dir", None)
        print(f"{args.command}: done, files in {os.path.abspath(out)}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> None:
    """Console entry point. Once output is flushed, a process that imported JAX exits with os._exit:
    JAX/torchax background threads can otherwise keep interpreter shutdown waiting."""
    code = run(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    if "jax" in sys.modules:
        os._exit(code)
    sys.exit(code)
