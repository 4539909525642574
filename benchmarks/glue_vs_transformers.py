"""Every GLUE task here, and one task the defaults never saw: `attnlab finetune TASK` with its defaults against
transformers' Trainer with its run_glue recipe, on the same model (all-MiniLM-L6-v2), side by side. CoNLL-2003
NER (task conll2003, valid.txt as the report set) runs the same way against the Trainer with run_ner's recipe.

attnlab: `attnlab finetune TASK --model minilm --train TRAIN --output DIR --seed S --no-progress` (nothing else:
its defaults choose the schedule, and it holds its own validation part out of TRAIN), then `attnlab evaluate
TASK --model DIR --data REPORT`. Wall time: the finetune process, launch to exit.
Trainer: benchmarks/_glue_trainer.py (lr 2e-5, batch 32, 3 epochs, max length 128, weight decay 0, no warmup,
linear decay, no evaluation during training, no checkpoints) on all of TRAIN, then predictions on REPORT. Wall
time: its process, launch to the end of training (its report-set predictions are not counted).
run_glue pads every input to 128 tokens; --trainer-padding dynamic (default) pads to each batch's longest, the
faster peer. Both sides get the same threads (--threads) and take turns (per seed: attnlab first, then the
Trainer first, ...). The report sets (GLUE dev; SST-2: 872 sentences carved out of train.tsv, see _glue_data.py;
the unseen task: the test blocks of five books) are scored once per run and never used to choose anything.

Every finished run appends a JSON line to --results (default WORK/results.jsonl); --resume skips runs already
there, so a killed run loses nothing; --rerun attnlab runs attnlab's side again (after its defaults changed) and
keeps the Trainer's runs, the newest run of each counting; --sides attnlab runs that side alone (the table then
needs the other side's runs in --results). Each run holds a lock (RUN.lock beside its
directory) while it runs, and the data files are replaced whole, so two instances with the same --work and
--resume share the runs (a core each) instead of running one twice. The table: per task and metric, mean +-
standard error over the seeds for each side, the difference and whether it exceeds two standard errors of the
difference, mean wall and CPU time and their ratios attnlab / Trainer. Goal: attnlab at least the Trainer's
quality in <= 0.5x its wall time.

    python benchmarks/glue_vs_transformers.py --work runs/glue --seeds 1 2 3 --threads 2 --resume
    python benchmarks/glue_vs_transformers.py --tasks rte,book --limit 64,32 --seeds 1   # a quick smoke run
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import resource
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

try:
    import fcntl
except ImportError:  # not POSIX: no locks, one instance at a time
    fcntl = None

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import data_root, table  # noqa: E402
from _glue_data import BOOK_TASK, GLUE, prepare  # noqa: E402

TASKS = ("rte", "mrpc", "stsb", "cola", "sst2", BOOK_TASK, "conll2003")  # the small ones first
TRAINER = Path(__file__).resolve().parent / "_glue_trainer.py"
MODEL = "minilm"
SIDES = ("attnlab", "trainer")


# ------------------------------------------------------------------------------------------ the arithmetic
def mean_se(values: list[float]) -> tuple[float, float | None]:
    """(mean, standard error of the mean); the error is None for a single value."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, None
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var / n)


def compare(ours: list[float], theirs: list[float]) -> dict:
    """Both sides' mean and error, the difference (attnlab - Trainer), its standard error, and the verdict:
    a difference counts only beyond two standard errors of the difference."""
    (m_a, se_a), (m_b, se_b) = mean_se(ours), mean_se(theirs)
    diff = m_a - m_b
    se = None if se_a is None or se_b is None else math.sqrt(se_a ** 2 + se_b ** 2)
    if se is None:
        verdict = "n/a (one seed)"
    elif abs(diff) > 2 * se:
        verdict = "attnlab better" if diff > 0 else "attnlab worse"
    else:
        verdict = "within 2 SE"
    return {"attnlab": (m_a, se_a), "trainer": (m_b, se_b), "diff": diff, "se": se, "verdict": verdict,
            "n": (len(ours), len(theirs))}


def fmt(mean: float, se: float | None, digits: int = 2) -> str:
    return f"{mean:.{digits}f}" + ("" if se is None else f" ± {se:.{digits}f}")


def summarize(records: list[dict], tasks: list[str], metrics: dict[str, tuple[str, ...]]) -> list[list[str]]:
    """The table's rows: one per task and metric, wall and CPU time on each task's first row."""
    rows = []
    for task in tasks:
        runs = {side: [r for r in records if r["task"] == task and r["side"] == side]
                for side in ("attnlab", "trainer")}
        if not runs["attnlab"] or not runs["trainer"]:
            continue
        for i, metric in enumerate(metrics[task]):
            c = compare(*([r["metrics"][metric] for r in runs[side]] for side in ("attnlab", "trainer")))
            name = f"{task} (unseen task)" if task == BOOK_TASK else task
            row = [name if i == 0 else "", metric, fmt(*c["attnlab"]), fmt(*c["trainer"]), f"{c['diff']:+.2f}",
                   fmt(2 * c["se"], None) if c["se"] is not None else "-", c["verdict"], f"{c['n'][0]}/{c['n'][1]}"]
            if i == 0:
                for key in ("wall_s", "cpu_s"):
                    ours, theirs = (mean_se([r[key] for r in runs[side]]) for side in ("attnlab", "trainer"))
                    row += [fmt(*ours, 0), fmt(*theirs, 0), f"{ours[0] / theirs[0]:.2f}x"]
            else:
                row += [""] * 6
            rows.append(row)
    return rows


HEADER = ["task", "metric", "attnlab", "Trainer", "diff", "2 SE", "verdict", "seeds", "attnlab wall s",
          "Trainer wall s", "wall ratio", "attnlab CPU s", "Trainer CPU s", "CPU ratio"]


def markdown(rows: list[list[str]], header: list[str] = HEADER) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows])


# ------------------------------------------------------------------------------------------ the machine
def machine() -> dict:
    """CPU model, the vector extensions that matter to these kernels, cores and the software."""
    model, flags = platform.processor() or "unknown", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model in ("unknown", ""):
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    import torch
    import transformers
    wanted = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "amx_int8")
    return {"cpu": model, "flags": " ".join(f for f in wanted if f in flags) or "none of " + ", ".join(wanted),
            "cores": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__}


def load() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


# ------------------------------------------------------------------------------------------ the runs
def attnlab_command() -> list[str]:
    script = Path(sys.executable).parent / "attnlab"
    return [str(script)] if script.exists() else [sys.executable, "-m", "attnlab"]


def child_env(threads: int) -> dict:
    return dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false")


def cpu_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_logged(cmd: list[str], log: Path, env: dict) -> subprocess.CompletedProcess:
    """Run cmd with stderr to `log` (its stdout returned); a failure raises with the command and the log's tail."""
    with open(log, "w") as err:
        done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
    if done.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
        raise RuntimeError(f"exit status {done.returncode}: {shlex.join(cmd)}\n{tail}")
    return done


def last_json(stdout: str) -> dict:
    return json.loads([line for line in stdout.splitlines() if line.startswith("{")][-1])


def run_attnlab(p, seed: int, out: Path, threads: int, keep: bool) -> dict:
    env = child_env(threads)
    cmd = attnlab_command() + ["finetune", p.attnlab_task, "--model", MODEL, "--train", str(p.train),
                               "--output", str(out), "--seed", str(seed), "--no-progress"]
    cpu0, start = cpu_children(), time.perf_counter()
    summary = last_json(run_logged(cmd, out.parent / f"{out.name}.finetune.log", env).stdout)
    wall, cpu = time.perf_counter() - start, cpu_children() - cpu0
    evaluate = attnlab_command() + ["evaluate", p.attnlab_task, "--model", str(out), "--data", str(p.report)]
    scores = last_json(run_logged(evaluate, out.parent / f"{out.name}.evaluate.log", env).stdout)
    if not keep:  # the weights are ~90 MB a run; the metrics stay
        for f in out.glob("*.safetensors"):
            f.unlink()
    return {"metrics": {k: v for k, v in scores.items() if isinstance(v, (int, float)) and k != "examples"},
            "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "command": shlex.join(cmd),
            "details": {k: summary.get(k) for k in ("train_examples", "valid_examples", "epochs", "lr", "batch_size",
                                                    "max_length", "steps", "best_step", "pooling", "setfit_steps")}}


def run_trainer(p, seed: int, out: Path, threads: int, padding: str, model_dir: Path) -> dict:
    result = out.parent / f"{out.name}.json"
    cmd = [sys.executable, str(TRAINER), "--task", p.attnlab_task, "--train", str(p.train), "--report", str(p.report),
           "--model-dir", str(model_dir), "--seed", str(seed), "--threads", str(threads), "--padding", padding,
           "--output", str(out), "--result", str(result)]
    launched = time.time()
    run_logged(cmd, out.parent / f"{out.name}.log", child_env(threads))
    got = json.loads(result.read_text())
    shutil.rmtree(out, ignore_errors=True)
    return {"metrics": got.pop("metrics"), "wall_s": round(got["train_end"] - launched, 1), "cpu_s": got.pop("cpu_s"),
            "command": shlex.join(cmd), "details": got}


def read_results(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut short by a kill: that run is simply done again
            continue
    return records


def append_line(path: Path, line: str) -> None:
    """One JSON line, on a line of its own even after a line a kill cut short."""
    cut = path.is_file() and path.stat().st_size > 0 and not path.read_bytes().endswith(b"\n")
    with open(path, "a") as fh:
        fh.write(("\n" if cut else "") + line + "\n")


@contextlib.contextmanager
def claimed(lock: Path):
    """True while this process holds `lock` for a run; False when another process holds it. The kernel drops
    the lock when its process dies, so a killed instance leaves nothing to clean up."""
    with open(lock, "a") as fh:
        if fcntl is not None:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
        yield True


def run_key(task: str, side: str, seed: int, config: dict) -> tuple:
    """What makes two runs the same run: --resume skips one whose key is in the results already."""
    return (task, side, seed, config["threads"], tuple(config["limit"] or ()),
            config["padding"] if side == "trainer" else None)


def finished(results: Path, rerun: tuple[str, ...] = (), since: float = 0.0) -> set[tuple]:
    """The keys of the runs in `results` (another instance may have added some since this one started); a side
    in `rerun` counts only its runs that finished at `since` or later."""
    return {run_key(r["task"], r["side"], r["seed"], r["config"]) for r in read_results(results)
            if r["side"] not in rerun or r.get("date", 0.0) >= since}


def current(records: list[dict], seeds: list[int], config: dict) -> dict:
    """The runs of this configuration and these seeds, by key; a run done twice counts once (its latest)."""
    out = {}
    for r in records:
        key = run_key(r["task"], r["side"], r["seed"], r["config"])
        if r["seed"] in seeds and key == run_key(r["task"], r["side"], r["seed"], config):
            out[key] = r
    return out


def parse_limit(text: str | None) -> list[int] | None:
    """--limit N or N,M: N training examples and M (default N) report examples."""
    if not text:
        return None
    parts = [int(x) for x in text.split(",")]
    if len(parts) not in (1, 2) or min(parts) < 1:
        raise SystemExit(f"--limit {text}: expected N or N,M (training, report examples), each at least 1")
    return parts if len(parts) == 2 else parts * 2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", default=",".join(TASKS),
                    help=f"comma-separated, run in this order (default {','.join(TASKS)})")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="training seeds (default 1 2 3)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads for each side (default 2)")
    ap.add_argument("--trainer-padding", choices=("max", "dynamic"), default="dynamic",
                    help="the Trainer pads to 128 (run_glue's default) or to each batch's longest (default)")
    ap.add_argument("--work", type=Path, help="directory for data, runs and results (default: a new temporary one)")
    ap.add_argument("--results", type=Path, help="JSON lines of finished runs (default WORK/results.jsonl)")
    ap.add_argument("--resume", action="store_true", help="skip runs already in --results")
    ap.add_argument("--rerun", choices=SIDES, action="append", default=[],
                    help="run this side again where --results has it (its defaults changed); the newest run counts")
    ap.add_argument("--sides", default=",".join(SIDES),
                    help="comma-separated sides to run (default both); the table shows tasks with runs of both")
    ap.add_argument("--limit", metavar="N[,M]", help="a smoke test: N training and M report examples per task")
    ap.add_argument("--markdown", type=Path, help="also write the table (with its machine and command) here")
    ap.add_argument("--keep-models", action="store_true", help="keep attnlab's fine-tuned weights")
    args = ap.parse_args()
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    if not sides or set(sides) - set(SIDES):
        raise SystemExit(f"--sides {args.sides}: expected one or both of {', '.join(SIDES)}")
    work = args.work or Path(tempfile.mkdtemp(prefix="glue-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    results = args.results or work / "results.jsonl"
    config = {"threads": args.threads, "limit": parse_limit(args.limit), "padding": args.trainer_padding}
    limit = config["limit"] or [None, None]

    from attnlab.interop.local import resolve
    root, model_dir = data_root(), resolve(MODEL)
    info, load_before, started = machine(), load(), time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    command = shlex.join([Path(sys.executable).name, *sys.argv])
    threads_note = "one thread each" if args.threads == 1 else f"{args.threads} threads each"
    padding_note = args.trainer_padding + (" (run_glue pads to 128)" if args.trainer_padding == "dynamic" else "")
    print(f"{started}; {info['cpu']} ({info['flags']}), {info['cores']} cores; {threads_note}; "
          f"Trainer padding: {padding_note}", flush=True)
    print(f"load before: {load_before}\nwork: {work}\nresults: {results}", flush=True)

    since = time.time()

    def done(key: tuple) -> bool:  # read again each time: another instance may have finished it meanwhile
        return (args.resume or bool(args.rerun)) and key in finished(results, tuple(args.rerun), since)

    prepared = {}
    for task in tasks:
        prepared[task] = p = prepare(task, root, work, *limit)
        print(f"\n== {p.note}", flush=True)
        for k, seed in enumerate(args.seeds):
            for side in SIDES if k % 2 == 0 else SIDES[::-1]:
                if side not in sides:
                    continue
                if done(run_key(task, side, seed, config)):
                    print(f"{task} seed {seed} {side}: in {results} already", flush=True)
                    continue
                out = work / "runs" / task / f"{side}-seed{seed}"
                out.parent.mkdir(parents=True, exist_ok=True)
                with claimed(out.with_name(out.name + ".lock")) as mine:
                    if not mine:
                        print(f"{task} seed {seed} {side}: running in another instance", flush=True)
                        continue
                    if done(run_key(task, side, seed, config)):
                        print(f"{task} seed {seed} {side}: finished by another instance", flush=True)
                        continue
                    try:
                        rec = run_attnlab(p, seed, out, args.threads, args.keep_models) if side == "attnlab" \
                            else run_trainer(p, seed, out, args.threads, args.trainer_padding, model_dir)
                    except RuntimeError as err:  # reported, and the other runs go on; --resume tries it again
                        print(f"{task} seed {seed} {side} FAILED: {err}", flush=True)
                        continue
                    rec = {"task": task, "side": side, "seed": seed, "config": config, "date": time.time(), **rec}
                    append_line(results, json.dumps(rec))
                shown = ", ".join(f"{m} {rec['metrics'][m]:.2f}" for m in p.metrics)
                print(f"{task} seed {seed} {side}: {shown}; wall {rec['wall_s']:.0f} s, CPU {rec['cpu_s']:.0f} s",
                      flush=True)

    records = list(current(read_results(results), args.seeds, config).values())
    metrics = {t: p.metrics for t, p in prepared.items()}
    rows = summarize(records, tasks, metrics)
    load_after = load()
    title = ("attnlab finetune (defaults) vs transformers Trainer (run_glue recipe), all-MiniLM-L6-v2, "
             f"report sets, mean ± standard error over seeds {' '.join(map(str, args.seeds))}")
    context = [f"date: {started}", f"machine: {info['cpu']}, {info['cores']} cores, flags: {info['flags']}",
               f"software: python {info['python']}, torch {info['torch']}, transformers {info['transformers']}",
               f"threads: {threads_note} ({args.threads}); the sides take turns",
               f"Trainer padding: {padding_note}", f"load before: {load_before}", f"load after: {load_after}",
               f"command: {command}",
               "wall: attnlab's finetune process; the Trainer's process to the end of training. "
               "verdict: the difference counts only beyond 2 SE of the difference. Goal: quality not below the "
               "Trainer's, wall ratio <= 0.50x."]
    notes = [prepared[t].note for t in tasks]
    print("\n" + title + "\n" + table(rows, HEADER) if rows else "\nno task has runs of both sides yet")
    print("\n".join(context + notes), flush=True)
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        bullets = "".join(f"- {line}\n" for line in context + notes)
        args.markdown.write_text(f"### {title}\n\n{markdown(rows)}\n\n{bullets}")
        print(f"markdown: {args.markdown}")


if __name__ == "__main__":
    main()
