"""The memory runner of the sample fuzzers, run in a child process.

NOTE [ Memory runner ]
A process's peak resident memory (``ru_maxrss``) never goes down, so the memory a batch of damaged
files costs is measured in a child: ``python -m tests.fuzz.samples.runner KINDS CASES SEED`` warms
every reader up, then reads CASES cases of each kind (``tests.fuzz.samples.CASES``, or ``all``)
and prints, as JSON, its peak before and after (``growth_mb``), the kind that raised it, and every
rule broken; ``python -m tests.fuzz.samples.runner --images ROWS FILE...`` decodes each image in
every mode (ROWS copies a batch) and prints the same for them.
"""

from __future__ import annotations

import json
import os
import random
import resource
import sys
import tempfile
from collections.abc import Sequence
from contextlib import suppress
from typing import Any

from tests.fuzz.samples import CASES
from tests.fuzz.samples.media import decode_image, image_seed
from tests.fuzz.samples.rules import within_case_time


def peak_mb() -> float:
    """This process's peak resident memory so far, in MB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_cases(kinds: Sequence[str], count: int, seed: int) -> dict[str, Any]:
    """``count`` cases of each kind drawn from ``random.Random(seed)``: the peak resident memory
    before and after, the kind that raised it last, and the rules broken."""
    with tempfile.TemporaryDirectory() as warm:  # every reader's first use allocates for good
        for kind in kinds:
            for k in range(3):
                with suppress(Exception):  # the run reports what fails
                    os.makedirs(os.path.join(warm, f"{kind}{k}"))
                    CASES[kind](random.Random(k), os.path.join(warm, f"{kind}{k}"))
    start = peak_mb()
    report: dict[str, Any] = {"start_mb": start, "by_kind": {}, "failures": [], "cases": 0}
    rng = random.Random(seed)
    for kind in kinds:
        before = peak_mb()
        for k in range(count):
            with tempfile.TemporaryDirectory() as folder:
                try:
                    CASES[kind](rng, folder)
                    report["cases"] += 1
                except Exception as exc:  # noqa: BLE001 - an assertion, or an exception that is no naiad error
                    report["failures"].append(f"{kind} #{k}: {type(exc).__name__}: {exc}"[:2000])
        report["by_kind"][kind] = round(peak_mb() - before, 1)
    report["growth_mb"] = round(peak_mb() - start, 1)
    return report


def decode_files(paths: Sequence[str], rows: int) -> dict[str, Any]:
    """Each image file decoded with a centre crop, a random crop (``rows`` copies in a batch) and
    at its own size (one): the peak resident memory before and after, and the rules broken."""
    decode_image(image_seed("png"))
    decode_image(image_seed("png"), crop="random")
    decode_image(image_seed("png"), size=None)
    start = peak_mb()
    failures = []
    for path in paths:
        with open(path, "rb") as f:
            data = f.read()
        for crop, size, n in (("center", 32, rows), ("random", 32, rows), (None, None, 1)):
            try:
                with within_case_time(f"{os.path.basename(path)}, crop={crop}"):
                    decode_image(data, crop=crop, size=size, rows=n)
            except AssertionError as exc:
                failures.append(f"{os.path.basename(path)}, crop={crop}: {exc}"[:2000])
    return {"start_mb": start, "growth_mb": round(peak_mb() - start, 1), "failures": failures}


def main(argv: list[str]) -> int:
    if argv[:1] == ["--images"]:
        report = decode_files(argv[2:], int(argv[1]))
    else:
        kinds = list(CASES) if argv[0] == "all" else argv[0].split(",")
        report = run_cases(kinds, int(argv[1]), int(argv[2]))
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
