#!/usr/bin/env bash
# Set up naiad in ./.venv from a fresh clone: bash scripts/setup.sh [--test]
#
# The virtual environment sees the system's packages, so a torch that is already installed
# (a CUDA build, say) is used as it is; torch is installed only when it is missing, pinned to a
# release so pip never pulls the newest build and its several GB of CUDA packages unasked.
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH_VERSION="${NAIAD_TORCH_VERSION:-2.13.0}"
PY="${PYTHON:-$(command -v python3 || command -v python)}"
extras=""
[ "${1:-}" = "--test" ] && extras="[test]"

if [ ! -x .venv/bin/python ]; then
    # NAIAD_ISOLATED=1 makes a venv that sees nothing installed: a fresh machine's view.
    if [ "${NAIAD_ISOLATED:-0}" = "1" ]; then
        "$PY" -m venv .venv
    else
        "$PY" -m venv --system-site-packages .venv
    fi
fi
VPY=.venv/bin/python
export PIP_DISABLE_PIP_VERSION_CHECK=1

if ! "$VPY" -c "import torch" >/dev/null 2>&1; then
    echo "setup: torch is missing; installing torch==$TORCH_VERSION"
    "$VPY" -m pip install -q "torch==$TORCH_VERSION"
fi
# Lightning and Accelerate (test extras) depend on torch, and s3fs pins the fsspec torch also
# uses: pin the torch that is there, so pip never replaces it with the newest build.
constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
echo "torch==$("$VPY" -c 'import torch; print(torch.__version__)' 2>/dev/null)" > "$constraints"
"$VPY" -m pip install -q -c "$constraints" -e ".$extras"
echo "setup: naiad $("$VPY" -c 'import naiad; print(naiad.__version__)') ready in .venv (torch $("$VPY" -c 'import torch; print(torch.__version__)'))"
