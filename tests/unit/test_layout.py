"""The package's layout holds: the folders are the pipeline's layers, imports only go down (or
stay inside their layer), there are no import circles, and ``import naiad`` exposes the same
names as before.

Layers, lowest first (docs/ARCHITECTURE.md, "The layers"): a module may import its own layer and
the ones below it, never one above; the two pipelines (``dataset``, ``stream``) never import each
other.
"""

from __future__ import annotations

import ast
import pathlib
from collections import defaultdict

import naiad

SRC = pathlib.Path(naiad.__file__).parent

LAYERS: list[tuple[str, ...]] = [
    ("_version", "errors", "stats", "trust", "transforms", "process_state"),
    ("parallel", "telemetry", "device", "media"),
    ("sources",),
    ("order",),
    ("pipeline", "dataset", "stream"),
    ("tokens",),
    ("epoch", "checkpoint", "arguments", "pools", "trainers", "loader"),
    ("testing", "tools"),
    ("cli", "__main__", "__init__"),
]
SIBLINGS_APART = {("dataset", "stream"), ("stream", "dataset")}


def _modules() -> dict[str, pathlib.Path]:
    mods = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = ("naiad", *path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__" and len(parts) > 2:
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def _imports(mods: dict[str, pathlib.Path]) -> dict[str, set[str]]:
    """Each module's naiad imports, lazy ones (inside functions) included; ``from naiad.sources
    import storage`` is an import of the submodule."""
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "naiad":
                subs = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in mods]
                targets = subs if len(subs) == len(node.names) else [node.module, *subs]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.split(".")[0] == "naiad"]
            # The package's root is its top layer (naiad/__init__.py): importing it from below is
            # as upward as importing the loader.
            targets = ["naiad.__init__" if t == "naiad" else t for t in targets]
            graph[name].update(t for t in targets if t in mods and t != name)
    return graph


def _layer(module: str) -> tuple[int, str]:
    top = module.split(".")[1] if "." in module else "__init__"
    for i, names in enumerate(LAYERS):
        if top in names:
            return i, top
    raise AssertionError(f"{module} is in no layer: add its folder to LAYERS and docs/ARCHITECTURE.md")


def test_imports_only_go_down() -> None:
    mods = _modules()
    upward = []
    for module, targets in _imports(mods).items():
        (lo, top) = _layer(module)
        for target in targets:
            (hi, target_top) = _layer(target)
            if hi > lo or (top, target_top) in SIBLINGS_APART:
                upward.append(f"{module} -> {target}")
    assert upward == []


def test_no_import_circles() -> None:
    graph = _imports(_modules())
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*path[path.index(nxt):], nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert cycles == []


def test_top_of_the_package_stays_small() -> None:
    top = [p.name for p in SRC.glob("*.py") if p.name != "__init__.py"]
    assert len(top) <= 20, sorted(top)


def test_public_names_unchanged() -> None:
    assert sorted(naiad.__all__) == sorted([
        "ArrayDataset", "AutoTuner", "ConfigError", "CsvFormat", "DataLoader", "DevicePrefetcher", "LoaderStats",
        "MediaAccess", "NaiadError", "Placement", "SkipBadRows", "Source", "SourceError", "StateError", "Storage",
        "Telemetry", "Transform", "WorkerError",
        "WorkerLocal", "__version__", "batch_uniforms", "columnar", "decode_audio", "decode_images", "decode_video", "images", "mix", "pack_xy", "read",
        "read_arrow", "read_csv", "read_hf", "read_images", "read_jsonl", "read_npy", "read_parquet", "read_text", "read_tokens", "read_videos",
        "read_webdataset", "testing", "to_tuple", "tokenize", "worker_rng",
    ])
    for name in naiad.__all__:
        assert getattr(naiad, name) is not None, name
