"""The examples in naiad's docstrings run and show what they print (doctest), module by module.

The modules are found from the package's files, so a module added or moved is covered without a
list to update. One that needs an optional package that is not installed is skipped, not failed.
"""

from __future__ import annotations

import doctest
import importlib
import io
from pathlib import Path

import pytest

import naiad

PACKAGE = Path(naiad.__file__).parent
# naiad's own dependencies: a module that cannot import one of these is broken, not optional.
REQUIRED = {"naiad", "torch", "numpy", "pyarrow", "fsspec"}


def _modules_with_examples() -> list[str]:
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "__main__.py" or ">>>" not in path.read_text(encoding="utf-8"):
            continue
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


MODULES = _modules_with_examples()


def test_the_modules_with_examples_are_found() -> None:
    # A broken search would collect nothing, and nothing would fail.
    assert {"naiad.stream.plan", "naiad.telemetry", "naiad.sources.csv"} <= set(MODULES)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name: str) -> None:
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").partition(".")[0]
        if missing and missing not in REQUIRED:
            pytest.skip(f"{name} needs {missing}, which is not installed")
        raise
    tests = doctest.DocTestFinder(exclude_empty=True).find(module, name)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    report = io.StringIO()
    for test in tests:
        runner.run(test, out=report.write)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, report.getvalue()
    if result.attempted == 0:
        pytest.skip(f"every example in {name} is marked +SKIP")
