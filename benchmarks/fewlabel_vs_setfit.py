"""Few labels: attnlab's defaults against the setfit library's own recipe, same model, same draws.

TASK is sst2, cola, or book: the task the defaults never saw (which of five Gutenberg books a passage is from;
attnlab trains it as `text-classification`). For each TASK:N and draw, both sides train all-MiniLM-L6-v2 (packaged `minilm`, a sentence-transformers
directory) on the same N labeled sentences and are scored once on the same report set:
  attnlab   `attnlab finetune TASK --model minilm --train DRAW.tsv --output DIR --seed S --no-progress`
            (nothing else: the defaults choose the rest), then `attnlab evaluate TASK --data REPORT` once.
  setfit    SetFitModel.from_pretrained(the same directory) + setfit.Trainer with TrainingArguments'
            defaults, in a separate venv (scripts/setfit-venv.sh; setfit is a peer here, never a dependency).
            Its default draws every sentence pair (oversampled): where that is more pairs than the
            SetFit paper's num_iterations=20 (40 pairs per sentence), num_iterations=20 is used instead.
The two sides take turns per draw (which goes first alternates) with the same --threads. Every run is one
JSON line in WORK/results.jsonl; --resume skips runs already there. The table: mean +- standard error over
draws, the difference paired by draw (real only beyond two of its standard errors), training wall and CPU
seconds of each side (model loading included, scoring the report set not), the machine and the load.

    python benchmarks/fewlabel_vs_setfit.py --work runs/fewlabel --threads 1 --resume --markdown table.md
        (default --sizes sst2:64,sst2:250,cola:250,book:250,sst2:1000,cola:1000,book:1000 --draws 0,1,2)
    python benchmarks/fewlabel_vs_setfit.py --work runs/fewlabel --table-only     # the table of what ran
    ... --limit 64      # a smoke run: score on the first 64 report sentences only (rows are marked)
    ... --sides attnlab # one side alone (the other's rows already in results.jsonl, or not wanted)
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, data_root, table  # noqa: E402
from _fewlabel_data import ATTNLAB_TASK, draw, split_for, write_plain, write_task_file  # noqa: E402
from _fewlabel_table import HEADER, machine, markdown, scores, summarize, table_rows  # noqa: E402

PAPER_ITERATIONS = 20   # the SetFit paper's (and setfit's pre-1.0 quickstart's) num_iterations


def setfit_pairs(labels: list, num_iterations: int | None) -> int:
    """How many sentence pairs setfit's ContrastiveDataset makes (single-label): num_iterations x 2 per
    sentence, or by default (oversampling) twice the larger of the positive pairs (same label, a sentence
    with itself included) and the negative pairs."""
    if num_iterations:
        return 2 * num_iterations * len(labels)
    counts: dict = {}
    for label in labels:
        counts[label] = counts.get(label, 0) + 1
    pos = sum(c * (c + 1) // 2 for c in counts.values())
    neg = (len(labels) ** 2 - sum(c * c for c in counts.values())) // 2
    return 2 * max(pos, neg)


def setfit_iterations(labels: list) -> tuple[int | None, str]:
    """(num_iterations to pass, why): setfit's default unless it makes more pairs than the paper's 20."""
    default, paper = setfit_pairs(labels, None), setfit_pairs(labels, PAPER_ITERATIONS)
    if default <= paper:
        return None, f"setfit's default (oversampling: {default} pairs)"
    return PAPER_ITERATIONS, (f"num_iterations={PAPER_ITERATIONS} ({paper} pairs; setfit's default would draw "
                              f"{default} pairs, {default / paper:.1f}x as many)")


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def measured(cmd: list[str], env: dict, log: Path) -> tuple[subprocess.CompletedProcess, float, float]:
    """Run `cmd` (its stderr to `log`); (result, wall s, the child's CPU s)."""
    cpu0, t0 = _children_cpu(), time.perf_counter()
    with open(log, "w") as err:
        done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
    return done, time.perf_counter() - t0, _children_cpu() - cpu0


def _fail(what: str, done: subprocess.CompletedProcess, log: Path) -> None:
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
    raise RuntimeError(f"{what} exited with status {done.returncode}; the end of {log}:\n{tail}")


def run_attnlab(name: str, files: dict, run_dir: Path, a, env: dict) -> dict:
    task = ATTNLAB_TASK[name]
    ft = ["finetune", task, "--model", a.model, "--train", str(files["train"]), "--output", str(run_dir / "model"),
          "--seed", str(a.seed), "--no-progress"]
    done, wall, cpu = measured([sys.executable, "-m", "attnlab", *ft], env, run_dir / "finetune.log")
    if done.returncode:
        _fail("attnlab finetune", done, run_dir / "finetune.log")
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    ev = ["evaluate", task, "--model", str(run_dir / "model"), "--data", str(files["report"])]
    done_ev, ev_wall, _ = measured([sys.executable, "-m", "attnlab", *ev], env, run_dir / "evaluate.log")
    if done_ev.returncode:
        _fail("attnlab evaluate", done_ev, run_dir / "evaluate.log")
    result = json.loads(done_ev.stdout.strip().splitlines()[-1])
    chose = [line for line in (run_dir / "finetune.log").read_text(errors="replace").splitlines()
             if line.startswith(f"finetune {task}:")]
    return {"score": {k: result[k] for k in ("accuracy", "mcc") if k in result}, "train_wall_s": round(wall, 1),
            "train_cpu_s": round(cpu, 1), "score_wall_s": round(ev_wall, 1),
            "recipe": {k: summary.get(k) for k in ("steps", "epochs", "lr", "batch_size", "pooling", "train_examples",
                                                  "valid_examples")}, "defaults_said": chose,
            "command": "attnlab " + " ".join(ft) + " && attnlab " + " ".join(ev)}


def run_setfit(task: str, files: dict, run_dir: Path, a, env: dict, labels: list, gold: list[int]) -> dict:
    iterations, why = setfit_iterations(labels)
    cmd = [a.setfit_python, str(Path(__file__).resolve().parent / "_fewlabel_setfit_side.py"),
           "--model", a.model_dir, "--train", str(files["train_plain"]), "--report", str(files["report_plain"]),
           "--seed", str(a.seed), "--threads", str(a.threads), "--output", str(run_dir / "out")]
    if iterations:
        cmd += ["--num-iterations", str(iterations)]
    done, wall, cpu = measured(cmd, {**env, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
                               run_dir / "setfit.log")
    if done.returncode:
        _fail("the setfit side", done, run_dir / "setfit.log")
    info = json.loads(done.stdout.strip().splitlines()[-1])
    predictions = json.loads((run_dir / "out" / "predictions.json").read_text())
    return {"score": scores(predictions, gold), "train_wall_s": round(wall - info["predict_wall_s"], 1),
            "train_cpu_s": round(cpu - info["predict_cpu_s"], 1), "score_wall_s": info["predict_wall_s"],
            "recipe": {**info["recipe"], "pairs": info.get("pairs"), "choice": why}, "versions": info["versions"],
            "command": " ".join(["setfit-python", *cmd[1:]])}


def prepare(task: str, size: int, draws: list[int], work: Path, limit: int | None, cache: dict) -> dict:
    """Write the report set and each draw (task format for attnlab, plain JSON lines for setfit) once."""
    suffix = ".csv" if task == "book" else ".tsv"  # (the file type attnlab reads it as)
    if task not in cache:
        split = split_for(task, data_root())
        report = split["report"][:limit] if limit else split["report"]
        base = work / "data"
        base.mkdir(parents=True, exist_ok=True)
        name = f"{task}-report{f'-limit{limit}' if limit else ''}"
        write_task_file(base / f"{name}{suffix}", task, report)
        write_plain(base / f"{name}.jsonl", report)
        cache[task] = {**split, "report_files": (base / f"{name}{suffix}", base / f"{name}.jsonl"),
                       "gold": [int(e["label"]) for e in report]}
        print(split["note"] + (f"; smoke run: scored on the first {limit} report sentences" if limit else ""),
              flush=True)
    out = {}
    for d in draws:
        train = draw(cache[task]["pool"], size, d)
        stem = work / "data" / f"{task}-{size}-draw{d}"
        write_task_file(stem.with_suffix(suffix), task, train)
        write_plain(stem.with_suffix(".jsonl"), train)
        out[d] = {"train": stem.with_suffix(suffix), "train_plain": stem.with_suffix(".jsonl"),
                  "report": cache[task]["report_files"][0], "report_plain": cache[task]["report_files"][1],
                  "labels": [e["label"] for e in train]}
    return out


def load_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.open()] if path.exists() else []


def key(row: dict) -> tuple:
    return row["task"], row["size"], row["draw"], row["side"], row["seed"], row.get("limit")


def parse_sizes(text: str) -> list[tuple[str, int]]:
    out = []
    for part in text.split(","):
        task, _, n = part.partition(":")
        if task not in ATTNLAB_TASK or not n.isdigit() or int(n) < 2:
            raise SystemExit(f"--sizes: {part!r} is not TASK:N with TASK sst2, cola or book and N >= 2")
        out.append((task, int(n)))
    return out


def notes(rows: list[dict], a, load_before, load_after) -> list[str]:
    """What the table needs beside it: machine, threads, load, date, versions, command."""
    m = machine()
    versions = next((r["versions"] for r in rows if r.get("versions")), {})
    threads = sorted({r["threads"] for r in rows}) or [a.threads]
    data = dict.fromkeys(r["data_note"] for r in rows if r.get("data_note"))
    recipes = {f"{r['task']} {r['size']}": r["recipe"]["choice"] for r in rows if r["side"] == "setfit"}
    return [*data, "setfit recipe: SetFitModel.from_pretrained(the same local directory) + setfit.Trainer, "
            "TrainingArguments defaults (batch 16, 1 epoch, body lr 2e-5, logistic-regression head) with "
            + "; ".join(f"{k}: {v}" for k, v in recipes.items()),
            f"machine: {m['cpu']} ({', '.join(m['flags']) or 'no avx2/avx512/amx'}), {m['cores']} cores, "
            f"{m['platform']}; threads per run: {', '.join(map(str, threads))}",
            f"load (1/5/15 min) before: {' '.join(f'{x:.2f}' for x in load_before)}; "
            f"after: {' '.join(f'{x:.2f}' for x in load_after)} (each run's own is in results.jsonl)",
            f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; setfit side: "
            + (", ".join(f"{k} {v}" for k, v in versions.items()) or "not run yet"),
            "wall/CPU s: training of one run (model loading included; scoring the report set excluded); "
            "setfit/attnlab wall > 1: attnlab is faster; differences are paired by draw",
            "command: python " + " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]])]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, required=True, help="directory of the draws, runs and results.jsonl")
    ap.add_argument("--sizes", default="sst2:64,sst2:250,cola:250,book:250,sst2:1000,cola:1000,book:1000",
                    help="TASK:N,... in the order to run (TASK: sst2, cola or book, the task the defaults never saw)")
    ap.add_argument("--draws", default="0,1,2", help="draw seeds (the same draws for both sides)")
    ap.add_argument("--seed", type=int, default=42, help="training seed of every run, both sides (default 42)")
    ap.add_argument("--threads", type=int, default=1, help="threads of each run, both sides (default 1)")
    ap.add_argument("--model", default="minilm", help="attnlab's name or directory of the model (default minilm)")
    ap.add_argument("--setfit-python", help="python of the setfit venv (default: scripts/setfit-venv.sh's)")
    ap.add_argument("--sides", default="attnlab,setfit",
                    help="which sides run, comma-separated (default attnlab,setfit; the table shows what ran)")
    ap.add_argument("--limit", type=int, help="score on the first N report sentences only (a smoke run)")
    ap.add_argument("--resume", action="store_true", help="skip runs already in WORK/results.jsonl")
    ap.add_argument("--keep-models", action="store_true", help="keep each run's trained model (about 90 MB each)")
    ap.add_argument("--table-only", action="store_true", help="print the table of WORK/results.jsonl and stop")
    ap.add_argument("--markdown", type=Path, help="also write the table and its notes to this Markdown file")
    a = ap.parse_args()
    a.sides = [s.strip() for s in a.sides.split(",") if s.strip()]
    unknown = [s for s in a.sides if s not in ("attnlab", "setfit")]
    if unknown or not a.sides:
        ap.error(f"--sides: {', '.join(unknown) or 'nothing given'}: each side is attnlab or setfit")
    a.work.mkdir(parents=True, exist_ok=True)
    results = a.work / "results.jsonl"
    load_before = os.getloadavg()
    failed = 0 if a.table_only else run_all(a, results)
    rows = [r for r in load_rows(results) if r.get("limit") == a.limit]
    cells, said = table_rows(summarize(rows)), notes(rows, a, load_before, os.getloadavg())
    print("\n".join([table(cells, HEADER), "", *said]))
    if a.markdown:
        a.markdown.write_text(markdown(cells) + "\n\n" + "".join(f"- {line}\n" for line in said))
    if failed:
        print(f"{failed} run(s) failed (above); --resume runs them again", file=sys.stderr)
    return 1 if failed else 0


def code_state() -> str:
    """The commit the attnlab side ran from, and whether attnlab/ had uncommitted changes then (a queue of runs
    takes hours; the defaults it measures are whatever the tree holds when each run starts)."""
    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""
    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    return commit + (" + uncommitted changes in attnlab/" if git("status", "--porcelain", "--", "attnlab") else "")


def run_all(a, results: Path) -> int:
    from attnlab.interop.local import resolve
    a.model_dir = str(resolve(a.model))
    if "setfit" in a.sides and not a.setfit_python:
        a.setfit_python = subprocess.run(["sh", str(REPO / "scripts" / "setfit-venv.sh")], check=True,
                                         stdout=subprocess.PIPE, text=True).stdout.strip().splitlines()[-1]
    done = {key(r) for r in load_rows(results)} if a.resume else set()
    env = {**os.environ, "OMP_NUM_THREADS": str(a.threads), "MKL_NUM_THREADS": str(a.threads),
           "TOKENIZERS_PARALLELISM": "false"}
    draws, cache, turn, failed = [int(d) for d in a.draws.split(",")], {}, 0, 0
    for task, size in parse_sizes(a.sizes):
        files = prepare(task, size, draws, a.work, a.limit, cache)
        for d in draws:
            sides = ("attnlab", "setfit") if turn % 2 == 0 else ("setfit", "attnlab")
            turn += 1
            for side in (s for s in sides if s in a.sides):
                row = {"task": task, "size": size, "draw": d, "side": side, "seed": a.seed, "limit": a.limit}
                if key(row) in done:
                    continue
                run_dir = a.work / "runs" / f"{task}-{size}-draw{d}-{side}"
                shutil.rmtree(run_dir, ignore_errors=True)
                run_dir.mkdir(parents=True)
                print(f"{time.strftime('%H:%M:%S')} {task} {size} draw {d}: {side} ...", flush=True)
                load, code, f = os.getloadavg(), code_state(), files[d]
                try:
                    out = (run_attnlab(task, f, run_dir, a, env) if side == "attnlab"
                           else run_setfit(task, f, run_dir, a, env, f["labels"], cache[task]["gold"]))
                except (RuntimeError, ValueError, KeyError) as err:  # one broken run must not stop a night's queue
                    print(f"    FAILED ({side}): {err}", flush=True)
                    failed += 1
                    continue
                out["attnlab_code"] = code
                row.update(out, threads=a.threads, data_note=cache[task]["note"],
                           load_before=[round(x, 2) for x in load], load_after=[round(x, 2) for x in os.getloadavg()],
                           date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
                with open(results, "a") as fh:
                    fh.write(json.dumps(row) + "\n")
                print(f"    {json.dumps({k: row[k] for k in ('score', 'train_wall_s', 'train_cpu_s')})}", flush=True)
                if not a.keep_models:
                    for model_dir in (run_dir / "model", run_dir / "out" / "checkpoints"):
                        shutil.rmtree(model_dir, ignore_errors=True)
    return failed


if __name__ == "__main__":
    sys.exit(main())
