"""Run torch's own test/test_dataloader.py with naiad.DataLoader in place of torch's.

A documented check, not part of CI (it takes several minutes): it shows where naiad behaves
as torch's DataLoader and where it deliberately does not (docs/ARCHITECTURE.md, "Deliberate
differences from torch", lists every remaining failure and why).

torch's test file is not in the wheel and is not naiad's code, so it is not in this
repository. Get the one that matches the installed torch (``python -c "import torch;
print(torch.version.git_version)"`` names the commit) from the pytorch repository::

    git clone --filter=blob:none --no-checkout https://github.com/pytorch/pytorch /tmp/pytorch
    git -C /tmp/pytorch show <commit or tag, e.g. v2.13.0>:test/test_dataloader.py > /tmp/test_dataloader.py

then run (it needs ``expecttest``, which torch's test helpers import)::

    .venv/bin/pip install expecttest
    .venv/bin/python scripts/torch_dataloader_tests.py /tmp/test_dataloader.py --loader both

How the substitution works: a ``sitecustomize`` module on ``PYTHONPATH`` replaces
``torch.utils.data.DataLoader`` with ``naiad.DataLoader`` as every Python process starts, before
the test module imports it, so the test's own subprocesses (its spawned loader processes and
``python -c`` snippets) use naiad too. ``--loader torch`` runs the same file unchanged, the
baseline: a test that fails there fails for reasons of its own (a test file from another torch
version, a missing GPU), not naiad's. ``--loader both`` runs both and lists every test whose
outcome differs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

SITECUSTOMIZE = '''\
import os

if os.environ.get("NAIAD_TORCH_TESTS_LOADER") == "naiad":
    import torch.utils.data

    import naiad  # binds naiad's own base class to torch's DataLoader first

    torch.utils.data.DataLoader = naiad.DataLoader
'''

OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")


def run(test_file: Path, loader: str, timeout_s: int, select: str | None, workdir: Path) -> dict[str, dict[str, str]]:
    """Run the test file under pytest with ``loader``; every test's outcome and its message."""
    run_dir = workdir / loader
    run_dir.mkdir()
    shutil.copy(test_file, run_dir / "test_dataloader.py")
    (run_dir / "sitecustomize.py").write_text(SITECUSTOMIZE)
    (run_dir / "pytest.ini").write_text("[pytest]\n")  # not the repository's configuration
    report = run_dir / "report.xml"
    env = dict(os.environ, NAIAD_TORCH_TESTS_LOADER=loader)
    env["PYTHONPATH"] = os.pathsep.join([str(run_dir), *filter(None, [env.get("PYTHONPATH")])])
    command = [
        sys.executable, "-m", "pytest", "test_dataloader.py", "-q", "-p", "no:cacheprovider",
        f"--timeout={timeout_s}", f"--junitxml={report}", "-o", "junit_family=xunit1",
    ]
    if select:
        command += ["-k", select]
    t0 = time.monotonic()
    subprocess.run(command, cwd=run_dir, env=env, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    print(f"{loader}: {time.monotonic() - t0:.0f} s", file=sys.stderr)
    return parse(report)


def parse(report: Path) -> dict[str, dict[str, str]]:
    """``{"Class.test": {"outcome": ..., "message": ...}}`` from a JUnit XML report."""
    results: dict[str, dict[str, str]] = {}
    if not report.exists():
        return results
    for case in ET.parse(report).getroot().iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}.{case.get('name')}"
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                outcome, message = ("failed" if child.tag == "failure" else "error"), child.get("message", "")
            elif child.tag == "skipped":
                kind = child.get("type", "")
                outcome = "xfailed" if "xfail" in kind else "skipped"
                message = child.get("message", "")
        results[name] = {"outcome": outcome, "message": " ".join(message.split())[:300]}
    return results


def summary(results: dict[str, dict[str, str]]) -> str:
    counts = {k: sum(r["outcome"] == k for r in results.values()) for k in OUTCOMES}
    return ", ".join(f"{v} {k}" for k, v in counts.items() if v) or "no tests ran"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("test_file", type=Path, help="torch's test/test_dataloader.py")
    parser.add_argument("--loader", choices=("naiad", "torch", "both"), default="both")
    parser.add_argument("--timeout", type=int, default=180, help="seconds per test (pytest-timeout)")
    parser.add_argument("-k", dest="select", help="pytest -k expression")
    parser.add_argument("--json", type=Path, help="write every test's outcome here")
    args = parser.parse_args(argv)
    if not args.test_file.is_file():
        parser.error(f"no file {args.test_file}; see this script's docstring for how to get it.")
    loaders = ("torch", "naiad") if args.loader == "both" else (args.loader,)
    with tempfile.TemporaryDirectory(prefix="naiad-torch-tests-") as tmp:
        results = {loader: run(args.test_file, loader, args.timeout, args.select, Path(tmp)) for loader in loaders}
    for loader in loaders:
        print(f"{loader}: {summary(results[loader])}")
    if len(loaders) == 2:
        torch_results, naiad_results = results["torch"], results["naiad"]
        differ = sorted(
            name for name in set(torch_results) | set(naiad_results)
            if torch_results.get(name, {}).get("outcome") != naiad_results.get(name, {}).get("outcome")
        )
        print(f"\n{len(differ)} test(s) with another outcome under naiad:")
        for name in differ:
            t, n = torch_results.get(name, {}), naiad_results.get(name, {})
            print(f"  {name}: torch {t.get('outcome', 'absent')}, naiad {n.get('outcome', 'absent')}")
            if n.get("message"):
                print(f"      {n['message'][:200]}")
    else:
        for name, r in sorted(results[loaders[0]].items()):
            if r["outcome"] in ("failed", "error"):
                print(f"  {name}: {r['outcome']}: {r['message'][:200]}")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
