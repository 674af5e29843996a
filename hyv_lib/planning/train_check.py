"""The training memory model (:mod:`hyv_lib.planning.train_memory`) beside the TPU compiler's per-device bytes of a
compiled train step (:func:`hyv_lib.planning.train_compile.compile_train_step`)."""

from __future__ import annotations

from typing import Any, Sequence

from .costs import as_preset, model_dims
from .hardware import GIB
from .train_memory import train_step_memory


def model_of_compiled(report: dict[str, Any]) -> dict[str, Any]:
    """This model for the setting of a :func:`hyv_lib.planning.train_compile.compile_train_step` report (a TPU slice:
    FSDP over all its devices, ``data`` x ``sequence`` x ``tensor`` mesh, the ``mixed`` recipe) beside what the TPU
    compiler reported per device: ``arguments`` (weights, master, moments, the batch and the RoPE tables of every video
    token, an argument on each device) against the model's state and inputs; ``temporaries`` against its transient and
    buffers; ``total``; each with its ratio model / compiler."""
    mesh, size, devices = report["mesh"], report["size"], report["devices"]
    split = mesh.get("sequence", 1) * mesh.get("tensor", 1)
    lora = report.get("lora") or {}
    m = train_step_memory(report["preset"], **size, batch_size=max(1, report["batch"] // mesh.get("data", 1)),
                          trainable=report["train"], lora_rank=lora.get("rank", 16), remat=report["remat"],
                          lora_targets=lora["targets"].split(",") if lora.get("targets") else None,
                          fsdp=devices, data_parallel=devices // split, sequence_parallel=split,
                          precision="mixed", device="tpu")
    compiled, rope = report["per_device_bytes"], m["activation_parts"]["rope"]
    whole_rope = 2 * report["tokens"]["video"] * model_dims(as_preset(report["preset"]))["head_dim"] * 4
    out = dict(model_state=m["weights"] + m["master"] + m["optimizer"] + m["inputs"] + whole_rope,
               model_transient=m["transient"] + m["buffers"] - rope, model_total=m["allocated"] - rope + whole_rope,
               compiled_arguments=compiled.get("arguments"), compiled_temporaries=compiled.get("temporaries"),
               compiled_total=compiled["total"], peak_phase=m["peak_phase"])
    for model_key, compiled_key in (("model_state", "compiled_arguments"), ("model_transient", "compiled_temporaries"),
                                    ("model_total", "compiled_total")):
        value = out[compiled_key]
        out[f"{model_key}_ratio"] = out[model_key] / value if value else None
    return out


def compiled_markdown(reports: Sequence[dict[str, Any]]) -> str:
    """Markdown of the TPU compiler's per-device bytes beside :func:`model_of_compiled` (GiB), one row per report."""
    lines = ["| configuration | compiler: arguments / temporaries / total | model: state / transient / total | "
             "model / compiler total |", "|---|---:|---:|---:|"]
    for r in reports:
        m = model_of_compiled(r)
        what = f"{r['train']}{' r' + str(r['lora']['rank']) if r.get('lora') else ''}"
        size = f"{r['size']['height']}x{r['size']['width']}x{r['size']['video_length']}"
        compiled = "/".join("n/a" if m[k] is None else f"{m[k] / GIB:.1f}" for k in (
            "compiled_arguments", "compiled_temporaries", "compiled_total"))
        model = "/".join(f"{m[k] / GIB:.1f}" for k in ("model_state", "model_transient", "model_total"))
        lines.append(f"| {r['topology']} {size} b{r['batch']} {what} | {compiled} | {model} | "
                     f"{m['model_total_ratio']:.2f} |")
    return "\n".join(lines) + "\n"
