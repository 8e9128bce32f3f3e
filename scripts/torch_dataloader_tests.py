"""Run torch's own test/test_dataloader.py with naiad.DataLoader in place of torch's.

A documented check, not part of CI (each run takes several minutes): it shows where naiad
behaves as torch's DataLoader and where it does not (docs/ARCHITECTURE.md, "torch's own test
suite", lists the last run's numbers and every test whose outcome differs, with the reason).

Getting the test file
---------------------
torch's test file is not in the wheel and is not naiad's code, so this repository does not
keep a copy (and must not ship one). Get the one for the installed torch: ``python -c "import
torch; print(torch.__version__, torch.version.git_version)"`` names the release and its commit::

    git clone --filter=blob:none --no-checkout https://github.com/pytorch/pytorch /tmp/pytorch
    git -C /tmp/pytorch show v2.13.0:test/test_dataloader.py > /tmp/test_dataloader.py

(docs/ARCHITECTURE.md, "torch's own test suite", names the file the last recorded run used, with
its sha256, where the release's own copy could not be had.)

A file from another torch may import names the installed torch lacks (newer files import
``HardwareClassification`` from ``torch.testing._internal.common_utils``, which torch 2.13
does not have). The script then stops before running anything and says which name and why;
it never skips such a test file silently. A file from another torch may also test behaviour
the installed torch does not have: the ``--loader torch`` baseline shows those, since they
fail with torch's own DataLoader too.

The test helpers need ``expecttest`` (``torch.testing._internal.common_utils`` imports it) and
``psutil`` (without it ``test_proper_exit`` is skipped; the script says so)::

    .venv/bin/pip install expecttest psutil
    .venv/bin/python scripts/torch_dataloader_tests.py /tmp/test_dataloader.py --loader both

What a run does
---------------
Each loader gets its own temporary directory with a copy of the test file, a ``sitecustomize``
module and a small pytest plugin (``conftest.py``); the repository's pytest configuration is
not used. The ``sitecustomize`` module, on ``PYTHONPATH``, replaces
``torch.utils.data.DataLoader`` with ``naiad.DataLoader`` as every Python process starts, before
the test module imports it, so the test's own subprocesses (its spawned loader processes and
``python -c`` snippets) use naiad too; ``--loader torch`` leaves torch's DataLoader in place, the
baseline. This checkout's ``src`` comes first on ``PYTHONPATH``, so the naiad under test is this
tree's, whatever is installed.

- Slow tests run: ``PYTORCH_TEST_WITH_SLOW=1`` (what ``common_utils.TEST_WITH_SLOW`` reads), so
  ``test_proper_exit`` runs; ``--no-slow`` leaves them skipped.
- Before the run, a check imports the test module in the run's environment and reads what
  torch's helpers see (torch's version, the DataLoader class in use, ``TEST_WITH_SLOW``,
  psutil); a collection error stops the script with the error printed and exit status 1.
- Time limits: ``--timeout`` seconds per test (pytest-timeout), ``--run-timeout`` seconds per
  loader's whole run, after which the run is killed and reported as incomplete (exit status 1).
- Every process a run starts is ended: pytest runs in its own session and process group, and
  every process started under it carries a marker in its environment. After the run the script
  lists the processes that outlived it (by pid and command line; a leak worth knowing), then
  kills the process group and every process with the marker.
- The plugin writes each test's outcome as it finishes, so a run killed at its time limit still
  reports what it ran.

``--loader both`` runs torch's DataLoader, then naiad's, and lists every test whose outcome
differs; ``--loader naiad --baseline RESULTS.json`` compares with the torch run saved by an
earlier ``--json`` instead of running it again. Exit status: 0 when every run collected the
file and ran to the end (test failures are results, listed, not errors of the script); 1 when
a run could not (collection or import error, a missing helper package, its time limit, a run
that ended early), printed as ``FAILED: ...`` with the reason; a run that was cut short still
lists the outcomes of the tests it ran.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO_SRC = Path(__file__).resolve().parents[1] / "src"
MARKER = "NAIAD_TORCH_TESTS_RUN"

SITECUSTOMIZE = '''\
import os

if os.environ.get("NAIAD_TORCH_TESTS_LOADER") == "naiad":
    import torch.utils.data

    import naiad  # binds naiad's own base class to torch's DataLoader first

    torch.utils.data.DataLoader = naiad.DataLoader
'''

# A pytest plugin that appends one JSON line per finished test phase and per failed collection,
# flushed at once, so the outcomes survive a run that is killed at its time limit.
CONFTEST = '''\
import json
import os

_out = open(os.environ["NAIAD_TORCH_TESTS_OUTCOMES"], "a", buffering=1)


def _message(report):
    if report.skipped and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2])
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return crash.message
    return str(report.longrepr or "")


def pytest_collectreport(report):
    if report.failed:
        _out.write(json.dumps({"collect_error": report.nodeid, "message": str(report.longrepr)}) + "\\n")


def pytest_collection_finish(session):
    _out.write(json.dumps({"collected": len(session.items)}) + "\\n")


def pytest_runtest_logreport(report):
    _out.write(json.dumps({
        "nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
        "xfail": hasattr(report, "wasxfail"), "message": _message(report),
        "duration": report.duration,
    }) + "\\n")
'''

# Run in the run's environment before the tests: what torch's helpers see, and whether the test
# module imports at all (the import error, with its traceback, is what a collection error is).
PREFLIGHT = '''\
import importlib, json, sys, traceback
info = {}
try:
    import torch, torch.utils.data
    info["torch"] = torch.__version__
    info["torch_git"] = torch.version.git_version
    dl = torch.utils.data.DataLoader
    info["dataloader"] = f"{dl.__module__}.{dl.__qualname__}"
    if dl.__module__.startswith("naiad"):
        import naiad
        info["naiad"] = naiad.__file__
    try:
        import psutil  # noqa: F401
        info["psutil"] = True
    except ImportError:
        info["psutil"] = False
    from torch.testing._internal import common_utils
    info["test_with_slow"] = bool(common_utils.TEST_WITH_SLOW)
    importlib.import_module("test_dataloader")
    info["imported"] = True
except BaseException as exc:
    info["error"] = f"{type(exc).__name__}: {exc}"
    info["traceback"] = traceback.format_exc()
print(json.dumps(info))
'''

OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")


class RunError(Exception):
    """A run that could not collect the test file or did not run to its end, with what it ran."""

    def __init__(self, message: str, results: dict[str, dict[str, str]] | None = None) -> None:
        super().__init__(message)
        self.results = results or {}


def explain_import_error(error: str, torch_version: str) -> str:
    """Why an import of the test file failed, in words, with the fix."""
    m = re.search(r"cannot import name '(\w+)' from '([\w.]+)'", error)
    if m:
        name, module = m.groups()
        return (
            f"the test file imports `{name}` from `{module}`, which the installed torch "
            f"{torch_version} does not have: the file is from another torch release. Use "
            f"test/test_dataloader.py at the installed release's tag (v{torch_version.split('+')[0]}); "
            "see this script's docstring."
        )
    if "expecttest" in error:
        return "torch's test helpers import `expecttest`: pip install expecttest."
    if "No module named 'naiad'" in error:
        return f"naiad does not import: put its source on PYTHONPATH (expected {REPO_SRC})."
    return "the test file does not import in this environment; the traceback above says why."


def marked_processes(token: str) -> list[tuple[int, str]]:
    """Live processes whose environment carries this run's marker: (pid, command line)."""
    needle = f"{MARKER}={token}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            if needle not in environ.split(b"\0"):
                continue
            status = (entry / "status").read_text()
            if re.search(r"^State:\s+Z", status, re.M):
                continue  # a zombie has ended; its parent has not reaped it yet
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # ended meanwhile, or not ours to read
        found.append((int(entry.name), cmdline.strip()))
    return found


def end_processes(pgid: int | None, token: str) -> None:
    """Kill the run's process group and every process that carries its marker, by pid."""
    if pgid is not None:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for _ in range(3):
        left = marked_processes(token)
        if not left:
            return
        for pid, _cmd in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.5)


def aggregate(lines: list[dict]) -> tuple[dict[str, dict[str, str]], int | None, list[dict]]:
    """Per-test outcomes from the plugin's phase reports; the collected count; collection errors."""
    phases: dict[str, list[dict]] = {}
    collected, collect_errors = None, []
    for rec in lines:
        if "collected" in rec:
            collected = rec["collected"]
        elif "collect_error" in rec:
            collect_errors.append(rec)
        else:
            phases.setdefault(rec["nodeid"], []).append(rec)
    results: dict[str, dict[str, str]] = {}
    for nodeid, reps in phases.items():
        name = ".".join(nodeid.split("::")[1:]) or nodeid
        outcome, message = "passed", ""
        by_when = {r["when"]: r for r in reps}
        call = by_when.get("call")
        for when in ("setup", "call", "teardown"):
            r = by_when.get(when)
            if r is None:
                continue
            if r["outcome"] == "failed":
                outcome = "failed" if when == "call" else "error"
                message = r["message"]
                break
            if r["outcome"] == "skipped":
                outcome = "xfailed" if r["xfail"] else "skipped"
                message = r["message"]
                break
        else:
            if call is not None and call["xfail"]:
                outcome = "xpassed"
            elif call is None:
                outcome, message = "error", "no call phase reported (the run ended during this test)"
        results[name] = {"outcome": outcome, "message": " ".join(message.split())[:400]}
    return results, collected, collect_errors


def run(test_file: Path, loader: str, args: argparse.Namespace, workdir: Path) -> dict[str, dict[str, str]]:
    """Run the test file under pytest with ``loader``; every test's outcome and its message."""
    run_dir = workdir / loader
    run_dir.mkdir()
    shutil.copy(test_file, run_dir / "test_dataloader.py")
    (run_dir / "sitecustomize.py").write_text(SITECUSTOMIZE)
    (run_dir / "conftest.py").write_text(CONFTEST)
    (run_dir / "pytest.ini").write_text("[pytest]\n")  # not the repository's configuration
    outcomes, log = run_dir / "outcomes.jsonl", run_dir / "pytest.log"
    token = uuid.uuid4().hex
    env = dict(os.environ, NAIAD_TORCH_TESTS_LOADER=loader, NAIAD_TORCH_TESTS_OUTCOMES=str(outcomes))
    env[MARKER] = token
    path = [str(run_dir), *([str(REPO_SRC)] if REPO_SRC.is_dir() else []), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in path if p)
    if args.slow:
        env["PYTORCH_TEST_WITH_SLOW"] = "1"
    else:
        env.pop("PYTORCH_TEST_WITH_SLOW", None)

    try:
        pre = subprocess.run(
            [sys.executable, "-c", PREFLIGHT], cwd=run_dir, env=env, capture_output=True,
            text=True, timeout=300, check=False,
        )
    finally:
        end_processes(None, token)
    try:
        info = json.loads(pre.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        raise RunError(f"{loader}: the environment check printed nothing usable:\n{pre.stdout}\n{pre.stderr}") from None
    if "error" in info:
        raise RunError(
            f"{loader}: the test file does not import ({info['error']}):\n{info['traceback']}\n"
            + explain_import_error(info["error"], info.get("torch", "?"))
        )
    print(
        f"{loader}: torch {info['torch']} ({info['torch_git'][:12]}), DataLoader = {info['dataloader']}"
        + (f" from {info['naiad']}" if "naiad" in info else "")
        + f", TEST_WITH_SLOW={info['test_with_slow']}, psutil={info['psutil']}",
        file=sys.stderr,
    )
    if args.slow and not info["test_with_slow"]:
        raise RunError(f"{loader}: PYTORCH_TEST_WITH_SLOW=1 is set but common_utils.TEST_WITH_SLOW is False.")
    if not info["psutil"]:
        print(f"{loader}: WARNING: psutil is missing, so test_proper_exit is skipped.", file=sys.stderr)

    command = [
        sys.executable, "-m", "pytest", "test_dataloader.py", "-q", "-p", "no:cacheprovider",
        f"--timeout={args.timeout}", "--timeout-method=signal", "-rfE",
    ]
    if args.select:
        command += ["-k", args.select]
    t0 = time.monotonic()
    timed_out = False
    with open(log, "w") as log_f:
        proc = subprocess.Popen(
            command, cwd=run_dir, env=env, stdout=log_f, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )
        try:
            rc = proc.wait(timeout=args.run_timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            end_processes(proc.pid, token)
            rc = proc.wait()
        finally:
            if proc.poll() is None:  # interrupted here: end the run before leaving
                end_processes(proc.pid, token)
                proc.wait()
    elapsed = time.monotonic() - t0
    # A process on its way out (multiprocessing's helpers end when their pipes close) gets a
    # moment before it counts as left behind.
    deadline = time.monotonic() + 10
    while (leftover := marked_processes(token)) and time.monotonic() < deadline:
        time.sleep(0.5)
    end_processes(proc.pid, token)

    lines = [json.loads(x) for x in outcomes.read_text().splitlines() if x.strip()] if outcomes.exists() else []
    results, collected, collect_errors = aggregate(lines)
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
    print(f"{loader}: {elapsed:.0f} s, pytest exit status {rc}, {summary(results)}", file=sys.stderr)
    if leftover:
        print(f"{loader}: {len(leftover)} process(es) outlived the run (killed now):", file=sys.stderr)
        for pid, cmd in leftover:
            print(f"    pid {pid}: {cmd[:160]}", file=sys.stderr)
    if args.keep is not None:
        dest = args.keep / loader
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(run_dir, dest, ignore=shutil.ignore_patterns("__pycache__"))
        print(f"{loader}: log and outcomes kept in {dest}", file=sys.stderr)
    if collect_errors:
        raise RunError(
            f"{loader}: collection failed:\n"
            + "\n".join(f"{e['collect_error']}: {e['message']}" for e in collect_errors)
        )
    if timed_out:
        raise RunError(
            f"{loader}: the run passed its time limit of {args.run_timeout} s after "
            f"{len(results)} of {collected} tests and was killed. Log tail:\n{tail}", results
        )
    if rc not in (0, 1) or collected is None or len(results) < collected:
        raise RunError(
            f"{loader}: the run did not end normally (pytest exit status {rc}, "
            f"{len(results)} of {collected} tests reported). Log tail:\n{tail}", results
        )
    return results


def summary(results: dict[str, dict[str, str]]) -> str:
    counts = {k: sum(r["outcome"] == k for r in results.values()) for k in OUTCOMES}
    return ", ".join(f"{v} {k}" for k, v in counts.items() if v) or "no tests ran"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("test_file", type=Path, help="torch's test/test_dataloader.py")
    parser.add_argument("--loader", choices=("naiad", "torch", "both"), default="both")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per test (pytest-timeout)")
    parser.add_argument("--run-timeout", type=int, default=3600, help="seconds per loader's whole run")
    parser.add_argument("--no-slow", dest="slow", action="store_false", help="leave slow tests skipped")
    parser.add_argument("-k", dest="select", help="pytest -k expression")
    parser.add_argument("--json", type=Path, help="write every test's outcome here (after each run)")
    parser.add_argument("--keep", type=Path, help="copy each run's directory (log, outcomes) here")
    parser.add_argument(
        "--baseline", type=Path,
        help="with --loader naiad: compare with the torch run in this --json file instead of rerunning it",
    )
    args = parser.parse_args(argv)
    if not args.test_file.is_file():
        parser.error(f"no file {args.test_file}; see this script's docstring for how to get it.")
    loaders = ("torch", "naiad") if args.loader == "both" else (args.loader,)
    results: dict[str, dict[str, dict[str, str]]] = {}
    if args.baseline is not None:
        if args.loader != "naiad":
            parser.error("--baseline goes with --loader naiad")
        results["torch"] = json.loads(args.baseline.read_text())["torch"]
        loaders = ("torch", "naiad")
    problems = []
    with tempfile.TemporaryDirectory(prefix="naiad-torch-tests-") as tmp:
        for loader in loaders:
            if loader in results:
                continue
            try:
                results[loader] = run(args.test_file, loader, args, Path(tmp))
            except RunError as exc:
                # Loud, and the exit status says so; what the run did get through is still listed.
                print(f"\nFAILED: {exc}", file=sys.stderr)
                problems.append(str(exc).splitlines()[0])
                if not exc.results:
                    return 1  # nothing ran: a collection or environment error
                results[loader] = exc.results
            if args.json is not None:
                args.json.write_text(json.dumps(results, indent=1, sort_keys=True))
    for loader in loaders:
        print(f"{loader}: {summary(results[loader])}")
    if len(loaders) == 2:
        torch_results, naiad_results = results["torch"], results["naiad"]
        both = set(torch_results) & set(naiad_results)
        only = sorted(set(torch_results) ^ set(naiad_results))
        if only:  # a run cut short, or a baseline run with another -k
            print(f"{len(only)} test(s) ran with one loader only; not compared: {', '.join(only[:5])}"
                  + (" ..." if len(only) > 5 else ""))
        differ = sorted(n for n in both if torch_results[n]["outcome"] != naiad_results[n]["outcome"])
        print(f"\n{len(differ)} test(s) with another outcome under naiad:")
        for name in differ:
            t, n = torch_results.get(name, {}), naiad_results.get(name, {})
            print(f"  {name}: torch {t.get('outcome', 'absent')}, naiad {n.get('outcome', 'absent')}")
            for who, r in (("torch", t), ("naiad", n)):
                if r.get("outcome") in ("failed", "error") and r.get("message"):
                    print(f"      {who}: {r['message'][:300]}")
    for loader in loaders:
        failing = sorted((n, r) for n, r in results[loader].items() if r["outcome"] in ("failed", "error", "xpassed"))
        if failing:
            print(f"\nnot passing with {loader}'s DataLoader ({len(failing)}):")
            for name, r in failing:
                print(f"  {name}: {r['outcome']}: {r['message'][:300]}")
    if problems:
        print("\nFAILED (the lists above are of what ran):\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
