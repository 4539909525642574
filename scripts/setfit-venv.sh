#!/bin/sh
# A separate virtualenv with the `setfit` library, for benchmarks/fewlabel_vs_setfit.py only: setfit is a
# benchmark peer, never a dependency of attnlab, and its own transformers/sentence-transformers pins must not
# reach the project's environment. torch is the same version as attnlab's (a constraints file holds it there),
# so the two sides of the benchmark differ in recipe, not in kernels.
#
# Usage: scripts/setfit-venv.sh            prints the venv's python (creates the venv first if needed)
#   SETFIT_VENV     where the venv lives (default ~/.cache/attnlab-bench/setfit-venv)
#   PYTHON          the interpreter that creates it (default python3.11, else python3)
#   TORCH_VERSION   the torch it pins (default 2.13.0, attnlab's)
# Cached: a venv whose python imports setfit is reused as it is. Progress and pip's output go to stderr;
# the only stdout line is the venv's python, so `PY=$(scripts/setfit-venv.sh)` works.
set -eu
VENV=${SETFIT_VENV:-$HOME/.cache/attnlab-bench/setfit-venv}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
PY=${PYTHON:-$(command -v python3.11 || command -v python3)}
BIN="$VENV/bin/python"

versions() {
    "$BIN" -c 'import importlib.metadata as m
print(", ".join(f"{p} {m.version(p)}" for p in ("setfit", "sentence-transformers", "transformers", "torch")))'
}

if [ -x "$BIN" ] && "$BIN" -c "import setfit" 2>/dev/null; then
    echo "setfit-venv: cached at $VENV ($(versions))" >&2
    echo "$BIN"
    exit 0
fi
echo "setfit-venv: creating $VENV with $PY" >&2
mkdir -p "$(dirname "$VENV")"
"$PY" -m venv "$VENV"
"$BIN" -m pip install --quiet --upgrade pip >&2
CONSTRAINTS="$VENV/constraints.txt"
echo "torch==$TORCH_VERSION" > "$CONSTRAINTS"
# torch first, on its own: its CPU wheel is found locally; setfit's resolver then sees it as satisfied.
"$BIN" -m pip install --quiet "torch==$TORCH_VERSION" >&2
"$BIN" -m pip install --quiet -c "$CONSTRAINTS" setfit >&2
got=$("$BIN" -c 'import torch; print(torch.__version__.split("+")[0])')
if [ "$got" != "$TORCH_VERSION" ]; then
    echo "setfit-venv: $VENV got torch $got, expected $TORCH_VERSION" >&2
    exit 1
fi
"$BIN" -c "import setfit" || { echo "setfit-venv: setfit installed but does not import (above)" >&2; exit 1; }
echo "setfit-venv: ready ($(versions))" >&2
echo "$BIN"
