"""Run one peer step in this process: a conversion, or one shuffled epoch.

Started by bench/bench_peers.py with the interpreter of the peer's environment, so a fresh process
pays its own imports and its own time to the first batch.

    python run_one.py convert MODULE OPTS_JSON PATHS_JSON RESULT_JSON
    python run_one.py epoch MODULE OPTS_JSON PATHS_JSON RESULT_JSON IDS_NPZ

An adapter module (bench/peers/peer_*.py) defines:

- ``versions() -> str``: the libraries it measures, with their versions;
- ``convert(paths, opts) -> None`` (optional): write the peer's format under ``paths["out"]``;
- ``open_loader(paths, batch_size, opts) -> Iterable``: a loader for one shuffled epoch;
- ``batch_ids(batch) -> array``: the row ids of a batch;
- ``close() -> None`` (optional): release what ``open_loader`` started.

``epoch`` records the seconds from opening the loader to its first batch and to the end of the
epoch, and writes the ids in delivery order with the batch lengths, for the parent to check.
With ``paths["epoch_budget_s"]``, an epoch still running after that many seconds stops there
(``partial``: its rows/s and quality are those of the part read).
"""

from __future__ import annotations

import importlib
import json
import sys
import time

_T_START = time.perf_counter()


def main(argv: list[str]) -> int:
    step, module_name, opts_json, paths_json, result_json = argv[:5]
    opts = json.loads(opts_json)
    paths = json.loads(paths_json)
    adapter = importlib.import_module(module_name)
    import numpy as np

    result: dict[str, object] = {"versions": adapter.versions(), "import_s": time.perf_counter() - _T_START}
    if step == "convert":
        t0 = time.perf_counter()
        adapter.convert(paths, opts)
        result["convert_s"] = time.perf_counter() - t0
    else:
        batch_size = int(paths["batch_size"])
        ids: list[np.ndarray] = []
        t0 = time.perf_counter()
        loader = adapter.open_loader(paths, batch_size, opts)
        t_first = None
        budget = paths.get("epoch_budget_s")
        partial = False
        for batch in loader:
            ids.append(np.asarray(adapter.batch_ids(batch), dtype=np.int64).reshape(-1))
            if t_first is None:
                t_first = time.perf_counter()
            if budget is not None and time.perf_counter() - t0 > budget:
                partial = True
                break
        t_end = time.perf_counter()
        result["partial"] = partial
        if hasattr(adapter, "close"):
            adapter.close()
        result["first_batch_s"] = (t_first if t_first is not None else t_end) - t0
        result["epoch_s"] = t_end - t0
        result["rows"] = int(sum(len(b) for b in ids))
        result["batches"] = len(ids)
        order = np.concatenate(ids) if ids else np.zeros(0, np.int64)
        np.savez(argv[5], ids=order, lengths=np.array([len(b) for b in ids], np.int64))
    with open(result_json, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
