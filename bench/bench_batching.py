"""What handing out batches costs the training loop's thread: the stream's row chunks cut into
batches (``naiad.stream.batching.Batcher``), their columns made tensors (``to_torch``) and counted for
the telemetry (``naiad.device.tree.count_rows``), per batch, with nothing read or shuffled.

The chunks are what a shuffle buffer emits for a 2M-row table of ten columns (an int64 id and
nine float64 features): 36 chunks of 56,000 rows. ``--against REV`` runs the same loop on the
code of a git revision too, loaded beside this tree's, alternating round after round (medians),
and prints the ratio.

    python bench/bench_batching.py --against 7822346 --rounds 15
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from types import ModuleType
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import environment  # noqa: E402

from naiad.device import tree  # noqa: E402
from naiad.stream import batching  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def module_at(rev: str, paths: tuple[str, ...], name: str, folder: str) -> ModuleType:
    """The module at the first of ``paths`` that git revision ``rev`` has, loaded under ``name``
    (the package's layout changed: a module may live at another path in an older revision)."""
    for path in paths:
        shown = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT, capture_output=True, text=True)
        if shown.returncode == 0:
            text = shown.stdout
            break
    else:
        raise SystemExit(f"revision {rev} has none of {paths}")
    file = os.path.join(folder, f"{name}.py")
    with open(file, "w") as f:
        f.write(text)
    spec = importlib.util.spec_from_file_location(name, file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # (its dataclasses look themselves up there)
    spec.loader.exec_module(module)
    return module


def run(batching_mod: Any, tree_mod: Any, chunks: list[dict[str, np.ndarray]], batch: int) -> tuple[float, int]:
    empty = {k: v[:0] for k, v in chunks[0].items()}
    b = batching_mod.Batcher(None, 0, empty, batch)
    t = time.perf_counter()
    rows = batches = 0
    for c in chunks:
        b.add(c)
        for arrays in b.ready():
            rows += tree_mod.count_rows(batching_mod.to_torch(arrays))
            batches += 1
    return time.perf_counter() - t, batches


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--against", default=None, help="a git revision whose batching.py and tree.py run too")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--batch-sizes", default="32,1024")
    args = p.parse_args()
    print(environment())
    print(f"\n`python bench/bench_batching.py {' '.join(sys.argv[1:])}`\n")
    rng = np.random.default_rng(0)
    base = {"id": np.arange(56_000)} | {f"f{i}": rng.random(56_000) for i in range(9)}
    chunks = [dict(base) for _ in range(36)]
    ways: dict[str, tuple[Any, Any]] = {"this tree": (batching, tree)}
    with tempfile.TemporaryDirectory() as folder:
        if args.against:
            ways[args.against] = (module_at(args.against, ("src/naiad/stream/batching.py", "src/naiad/batching.py"), "batching_then", folder),
                                  module_at(args.against, ("src/naiad/device/tree.py", "src/naiad/tree.py"), "tree_then", folder))
        print("| batch | " + " | ".join(f"{w}: ms a 2M-row epoch (us a batch)" for w in ways)
              + (" | this tree / then |" if args.against else " |"))
        print("|---|" + "---|" * (len(ways) + (1 if args.against else 0)))
        for size in [int(s) for s in args.batch_sizes.split(",")]:
            times: dict[str, list[float]] = {w: [] for w in ways}
            count = 0
            for r in range(args.rounds):
                order = list(ways) if r % 2 == 0 else list(reversed(ways))
                for w in order:
                    dt, count = run(*ways[w], chunks, size)
                    times[w].append(dt)
            med = {w: statistics.median(v) for w, v in times.items()}
            cells = " | ".join(f"{1e3 * m:.1f} ({1e6 * m / count:.1f})" for m in med.values())
            ratio = f" | {med['this tree'] / med[args.against]:.2f} |" if args.against else " |"
            print(f"| {size} | {cells}{ratio}")


if __name__ == "__main__":
    main()
