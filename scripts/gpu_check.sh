#!/usr/bin/env bash
# The device check: naiad's GPU tests and GPU benchmarks in one run of under 8 minutes, on a
# machine with one CUDA GPU, naiad taken from this source tree (nothing is installed).
#
#   bash scripts/gpu_check.sh             # on the GPU machine
#   bash scripts/gpu_check.sh --dry-run   # anywhere: checks what it can without a GPU
#   bash scripts/gpu_check.sh --wheels DIR  # first installs DIR's wheels (e.g. simplejpeg) offline
#
# Steps, each under its own time limit, each run even when an earlier one failed:
#   1. pytest tests/gpu                  (DevicePrefetcher's stream protocol, the loader on CUDA)
#   2. bench/bench_h2d.py                (host-to-device copies: the ceiling, the prefetcher)
#   3. bench/bench_gpu_decode.py         (torchvision's decode_jpeg on the GPU against naiad's
#                                         CPU decode of the same JPEGs)
# Results: $GPU_CHECK_OUT, else $OUT, else ./gpu_check_results: gpu_check.md (the environment,
# a table of the steps, the benchmarks' output) and one log per step.
# Environment: PYTHON (default python3), NAIAD_GIT_SHA (the commit, where the tree has no .git).
# Exit status: 0 when every step passed (or was skipped for a missing package, as the report says),
# 1 when one failed or ran out of time, 2 for bad usage or (without --dry-run) no CUDA device.
set -u
set -o pipefail

usage() { sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; }

DRY_RUN=0
WHEELS=""
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) DRY_RUN=1 ;;
        --wheels)
            [ $# -ge 2 ] || { echo "gpu_check: --wheels needs a folder" >&2; exit 2; }
            WHEELS="$2"; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "gpu_check: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
    esac
    shift
done

CALLER_DIR="$PWD"
cd "$(dirname "$0")/.." || exit 2
ROOT="$PWD"
PY="${PYTHON:-python3}"
RESULTS="${GPU_CHECK_OUT:-${OUT:-$ROOT/gpu_check_results}}"
case "$RESULTS" in /*) ;; *) RESULTS="$CALLER_DIR/$RESULTS" ;; esac  # a relative path: the caller's
case "$WHEELS" in /*|"") ;; *) WHEELS="$CALLER_DIR/$WHEELS" ;; esac
mkdir -p "$RESULTS" || exit 2
REPORT="$RESULTS/gpu_check.md"
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
START=$SECONDS

# Time limits in seconds, 8 minutes in all at most: 20 + 170 + 110 + 110 = 410, the kill grace
# of 10 s for each, and a few seconds of probes between them. A hung step cannot take the
# others' time. Estimated, not yet measured on a GPU: tests/gpu about a minute, each
# benchmark under 40 s.
BUDGET_ENV=20
BUDGET_PYTEST=170
BUDGET_H2D=110
BUDGET_DECODE=110
KILL_AFTER=10

if [ "$DRY_RUN" = 1 ]; then
    MODE="dry run (no GPU needed)"
    # The steps see no GPU even where there is one: a dry run checks the scripts, quickly.
    NO_GPU=(env CUDA_VISIBLE_DEVICES=)
    CMD_PYTEST=("${NO_GPU[@]}" "$PY" -m pytest --collect-only -q -p no:cacheprovider tests/gpu)
    CMD_H2D=("${NO_GPU[@]}" "$PY" bench/bench_h2d.py --batch-mb 64 --batches 24 --repeats 5 --step-ms 20)
    CMD_DECODE=("${NO_GPU[@]}" "$PY" bench/bench_gpu_decode.py --dry-run --json "$RESULTS/bench_gpu_decode.json")
else
    MODE="on the device"
    CMD_PYTEST=("$PY" -m pytest -v -rfEs -p no:cacheprovider tests/gpu)
    CMD_H2D=("$PY" bench/bench_h2d.py --batch-mb 64 --batches 24 --repeats 5 --step-ms 20)
    CMD_DECODE=("$PY" bench/bench_gpu_decode.py --images 512 --unique 128 --batch 128 --rounds 5
                --json "$RESULTS/bench_gpu_decode.json")
fi

if command -v timeout >/dev/null 2>&1; then
    HAVE_TIMEOUT=1
else
    HAVE_TIMEOUT=0
    echo "gpu_check: warning: no 'timeout' command; the steps run without their time limits" >&2
fi

# run_limited BUDGET LOG CMD...: CMD under BUDGET seconds (then TERM, KILL_AFTER s later KILL,
# to its whole process group: a test's worker processes too), output to the terminal and LOG.
run_limited() {
    local budget="$1" log="$2"
    shift 2
    if [ "$HAVE_TIMEOUT" = 1 ]; then
        timeout -k "$KILL_AFTER" "$budget" "$@" 2>&1 | tee "$log"
    else
        "$@" 2>&1 | tee "$log"
    fi
}

STEP_ROWS=()
FAILED=0
SKIPPED=0
NOTE1=""

# step N NAME BUDGET LOG CMD...: one step, its result appended to STEP_ROWS.
step() {
    local n="$1" name="$2" budget="$3" log="$4"
    shift 4
    local t0=$SECONDS rc status note
    echo
    echo "=== step $n: $name (limit ${budget}s): $*"
    run_limited "$budget" "$log" "$@"
    rc=$?
    case "$rc" in
        0) status=PASS ;;
        124|137) status="TIMEOUT (${budget}s)"; FAILED=1 ;;
        *) status="FAIL (exit $rc)"; FAILED=1 ;;
    esac
    # The line a reader wants first: pytest's closing line, or why a part was skipped.
    if [ "$n" = 1 ]; then
        note="$(grep -E '(passed|failed|skipped|error|tests? collected|no tests ran)' "$log" | tail -n 1)$NOTE1"
    else
        note="$(grep -m 1 -E 'skipped|failed' "$log")"
    fi
    echo "=== step $n: $status in $((SECONDS - t0))s"
    STEP_ROWS+=("| $n | $name | $status | $((SECONDS - t0)) | $budget | \`${*#"$ROOT/"}\` | ${note//|/\\|} |")
}

# skip_step N NAME BUDGET WHY CMD...: a step that cannot run here, with the reason.
skip_step() {
    local n="$1" name="$2" budget="$3" why="$4"
    shift 4
    echo
    echo "=== step $n: $name: SKIPPED: $why"
    STEP_ROWS+=("| $n | $name | SKIPPED | 0 | $budget | \`$*\` | $why |")
    SKIPPED=$((SKIPPED + 1))
}

echo "gpu_check: $MODE; naiad from $ROOT/src; results to $RESULTS"
echo "steps (each with its own time limit, all run even if one fails):"
echo "  1. tests/gpu (limit ${BUDGET_PYTEST}s): ${CMD_PYTEST[*]}"
echo "  2. bench_h2d (limit ${BUDGET_H2D}s): ${CMD_H2D[*]}"
echo "  3. bench_gpu_decode (limit ${BUDGET_DECODE}s): ${CMD_DECODE[*]}"

if [ -n "$WHEELS" ]; then
    # Offline: the wheels carried in (simplejpeg for naiad's fast JPEG path, say), into a folder
    # of this run, ahead of the machine's own packages.
    SITE="$(mktemp -d "${TMPDIR:-/tmp}/gpu_check_site.XXXXXX")"
    if "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$WHEELS"/*.whl; then
        export PYTHONPATH="$PYTHONPATH:$SITE"
        echo "gpu_check: installed the wheels of $WHEELS into $SITE:"
        for wheel in "$WHEELS"/*.whl; do echo "  $(basename "$wheel")"; done
    else
        echo "gpu_check: warning: could not install the wheels in $WHEELS; going on without them" >&2
    fi
fi

# --- the environment ---------------------------------------------------------------------------
SHA="$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || true)"
if [ -n "$SHA" ]; then
    [ -n "$(git -C "$ROOT" status --porcelain --untracked-files=no 2>/dev/null)" ] && SHA="$SHA (with uncommitted changes)"
else
    SHA="${NAIAD_GIT_SHA:-unknown (no .git here; pass NAIAD_GIT_SHA)}"
fi
# (read -d '': the whole text; its status is 1 at the end of the input, which is expected.)
read -r -d '' ENV_PY <<'PYEOF'
import importlib, platform, sys
print(f"- Python: {platform.python_version()} ({sys.executable})")
try:
    import torch
    print(f"- torch: {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}")
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        print(f"- GPU: {torch.cuda.get_device_name(0)}, {p.total_memory / 2**30:.0f} GiB, "
              f"{p.multi_processor_count} SMs, {torch.cuda.device_count()} device(s)")
    else:
        print("- GPU: none (torch.cuda.is_available() is False)")
except Exception as exc:
    print(f"- torch: cannot import ({exc!r})")
from importlib import metadata
have = []
# naiad's own needs (numpy, pyarrow, fsspec, torch), then the check's: torchvision for the GPU
# decode, Pillow and simplejpeg for naiad's CPU decode, pytest and pytest-timeout for tests/gpu.
for name, module in [("numpy", "numpy"), ("pyarrow", "pyarrow"), ("fsspec", "fsspec"),
                     ("torchvision", "torchvision"), ("Pillow", "PIL"), ("simplejpeg", "simplejpeg"),
                     ("pytest", "pytest"), ("pytest-timeout", "pytest_timeout")]:
    try:
        importlib.import_module(module)
    except Exception as exc:
        have.append(f"{name} MISSING ({type(exc).__name__})")
        continue
    try:
        have.append(f"{name} {metadata.version(name)}")
    except metadata.PackageNotFoundError:
        have.append(f"{name} (version unknown)")
print("- packages: " + ", ".join(have))
try:
    import naiad
    print(f"- naiad: imports from {naiad.__file__}")
except Exception as exc:
    print(f"- naiad: cannot import ({exc!r})")
PYEOF
echo
echo "=== environment"
ENV_TXT="$( {
    echo "- date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    echo "- naiad commit: $SHA"
    echo "- host: $(uname -srm), $(nproc 2>/dev/null || echo '?') CPUs"
    if command -v nvidia-smi >/dev/null 2>&1; then
        echo "- nvidia-smi: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -n 1)"
    else
        echo "- nvidia-smi: not found"
    fi
    if [ "$HAVE_TIMEOUT" = 1 ]; then timeout -k 5 "$BUDGET_ENV" "$PY" -c "$ENV_PY" 2>&1; else "$PY" -c "$ENV_PY" 2>&1; fi
} )"
echo "$ENV_TXT"

have_module() { "$PY" -c "import $1" >/dev/null 2>&1; }
CUDA_OK=0
"$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1 && CUDA_OK=1

# --- the steps -------------------------------------------------------------------------------
if [ "$DRY_RUN" = 1 ]; then
    # What can go wrong before a GPU is reached: a script that does not parse, an import that
    # fails from the source tree, a test module that does not collect.
    echo
    echo "=== dry run: the scripts compile"
    if bash -n "$0" && "$PY" -m py_compile bench/bench_h2d.py bench/bench_gpu_decode.py tests/gpu/*.py; then
        echo "ok: scripts/gpu_check.sh, bench/bench_h2d.py, bench/bench_gpu_decode.py, tests/gpu/*.py"
    else
        echo "gpu_check: a script does not compile"
        FAILED=1
    fi
fi

if [ "$DRY_RUN" = 0 ] && [ "$CUDA_OK" = 0 ]; then
    echo
    echo "gpu_check: no CUDA device here (see the environment above); on a machine without a GPU run: bash scripts/gpu_check.sh --dry-run"
    {
        echo "# naiad device check: NOT RUN, no CUDA device"
        echo
        echo "$ENV_TXT"
    } > "$REPORT"
    exit 2
fi

if have_module pytest; then
    # Without pytest-timeout the tests' own limits are ignored (a warning); the step's holds.
    have_module pytest_timeout || NOTE1="; pytest-timeout is not installed: only the step's limit bounds a hung test"
    step 1 "tests/gpu" "$BUDGET_PYTEST" "$RESULTS/step1_pytest_gpu.log" "${CMD_PYTEST[@]}"
else
    # The test modules import pytest themselves: there is nothing to run them without it.
    skip_step 1 "tests/gpu" "$BUDGET_PYTEST" "pytest is not installed (the tests import it)" "${CMD_PYTEST[@]}"
fi
step 2 "bench_h2d" "$BUDGET_H2D" "$RESULTS/step2_bench_h2d.log" "${CMD_H2D[@]}"
step 3 "bench_gpu_decode" "$BUDGET_DECODE" "$RESULTS/step3_bench_gpu_decode.log" "${CMD_DECODE[@]}"

# --- the report ------------------------------------------------------------------------------
{
    echo "# naiad device check ($MODE)"
    echo
    echo "$ENV_TXT"
    echo "- total: $((SECONDS - START)) s"
    echo
    echo "| step | what | result | s | limit s | command | note |"
    echo "|---|---|---|---|---|---|---|"
    printf '%s\n' "${STEP_ROWS[@]}"
    for log in "$RESULTS/step2_bench_h2d.log" "$RESULTS/step3_bench_gpu_decode.log"; do
        [ -f "$log" ] || continue
        echo
        echo "## $(basename "$log" .log)"
        echo
        echo '```'
        cat "$log"
        echo '```'
    done
    if [ -f "$RESULTS/step1_pytest_gpu.log" ]; then
        echo
        echo "## step1_pytest_gpu (last 40 lines)"
        echo
        echo '```'
        tail -n 40 "$RESULTS/step1_pytest_gpu.log"
        echo '```'
    fi
} > "$REPORT"

echo
echo "=== summary ($((SECONDS - START)) s)"
printf '%s\n' "${STEP_ROWS[@]}"
echo "report: $REPORT"
if [ "$FAILED" = 1 ]; then
    echo "gpu_check: FAILED"
    exit 1
fi
if [ "$SKIPPED" -gt 0 ]; then
    echo "gpu_check: passed, with $SKIPPED step(s) skipped (see the report)"
else
    echo "gpu_check: all steps passed"
fi
exit 0
