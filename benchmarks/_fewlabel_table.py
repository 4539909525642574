"""The few-label benchmark's arithmetic and its table: scores from predictions, mean +- standard error over
draws, the paired difference of two recipes on the same draws, and the machine the numbers came from."""
from __future__ import annotations

import math
import os
import platform
from pathlib import Path

SIDES = ("attnlab", "setfit")
METRICS = {"sst2": ("accuracy",), "cola": ("mcc", "accuracy"), "book": ("accuracy",)}


def scores(predictions: list[int], gold: list[int]) -> dict:
    """{"accuracy", "mcc"} in percent. Two classes: Matthews correlation x 100, 0 when a row or column of the
    confusion matrix is empty (as sklearn and attnlab define it). More classes: accuracy only."""
    if len(predictions) != len(gold):
        raise ValueError(f"{len(predictions)} predictions for {len(gold)} gold labels")
    accuracy = 100.0 * sum(p == g for p, g in zip(predictions, gold)) / len(gold)
    if not set(gold) | set(predictions) <= {0, 1}:
        return {"accuracy": accuracy}
    tp = sum(p == 1 and g == 1 for p, g in zip(predictions, gold))
    tn = sum(p == 0 and g == 0 for p, g in zip(predictions, gold))
    fp = sum(p == 1 and g == 0 for p, g in zip(predictions, gold))
    fn = sum(p == 0 and g == 1 for p, g in zip(predictions, gold))
    denom = math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    return {"accuracy": accuracy, "mcc": 100.0 * (tp * tn - fp * fn) / denom if denom else 0.0}


def mean_se(values: list[float]) -> tuple[float, float]:
    """(mean, standard error of the mean); the error is nan with fewer than two values."""
    n = len(values)
    if not n:
        return math.nan, math.nan
    mean = sum(values) / n
    if n < 2:
        return mean, math.nan
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var / n)


def summarize(rows: list[dict]) -> list[dict]:
    """One line per (task, size, metric) from result rows, in the order the rows first name them. The
    difference attnlab - setfit is paired by draw (both sides trained on the same draws); only draws both
    sides finished count toward it. `real`: the difference is more than two of its standard errors."""
    groups: dict[tuple, dict] = {}
    for r in rows:
        groups.setdefault((r["task"], r["size"]), {s: {} for s in SIDES})[r["side"]][r["draw"]] = r
    out = []
    for (task, size), by_side in groups.items():
        a, s = by_side["attnlab"], by_side["setfit"]
        both = sorted(set(a) & set(s))
        for metric in METRICS[task]:
            line = {"task": task, "size": size, "metric": metric, "draws": {k: sorted(by_side[k]) for k in SIDES}}
            for side in SIDES:
                d = by_side[side]
                line[side] = mean_se([d[k]["score"][metric] for k in sorted(d)])
                line[f"{side}_wall_s"] = mean_se([d[k]["train_wall_s"] for k in sorted(d)])[0]
                line[f"{side}_cpu_s"] = mean_se([d[k]["train_cpu_s"] for k in sorted(d)])[0]
            line["diff"] = mean_se([a[k]["score"][metric] - s[k]["score"][metric] for k in both])
            line["paired_draws"] = len(both)
            mean, se = line["diff"]
            line["real"] = bool(se == se and abs(mean) > 2 * se) if both else False
            wa, ws = line["attnlab_wall_s"], line["setfit_wall_s"]
            line["wall_ratio"] = ws / wa if wa == wa and ws == ws and wa > 0 else math.nan
            out.append(line)
    return out


def _pm(pair: tuple[float, float], digits: int = 1) -> str:
    mean, se = pair
    if mean != mean:
        return "-"
    return f"{mean:.{digits}f}" + (f" +- {se:.{digits}f}" if se == se else " +- ?")


def _num(x: float, fmt: str = ".0f") -> str:
    return "-" if x != x else format(x, fmt)


HEADER = ["labels", "task", "metric", "draws", "attnlab", "setfit", "attnlab - setfit", "> 2 SE", "wall s attnlab",
          "wall s setfit", "setfit/attnlab wall", "CPU s attnlab", "CPU s setfit"]


def table_rows(summary: list[dict]) -> list[list[str]]:
    rows = []
    for line in summary:
        draws = "/".join(str(len(line["draws"][k])) for k in SIDES)
        rows.append([str(line["size"]), line["task"], line["metric"], draws, _pm(line["attnlab"]), _pm(line["setfit"]),
                     _pm(line["diff"]), ("yes" if line["real"] else "no") if line["paired_draws"] > 1 else "-",
                     _num(line["attnlab_wall_s"]), _num(line["setfit_wall_s"]), _num(line["wall_ratio"], ".2f"),
                     _num(line["attnlab_cpu_s"]), _num(line["setfit_cpu_s"])])
    return rows


def markdown(rows: list[list[str]], header: list[str] = HEADER) -> str:
    return "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
                     + ["| " + " | ".join(r) + " |" for r in rows])


def machine() -> dict:
    """CPU model, the vector extensions that matter to torch's CPU kernels, cores, platform."""
    model, flags = platform.processor() or "unknown", set()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model in ("unknown", platform.processor()):
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    wanted = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")
    return {"cpu": model, "flags": [f for f in wanted if f in flags], "cores": os.cpu_count(),
            "platform": platform.platform()}
