"""``naiad bench`` end to end, on small data and a short step."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from naiad.cli import main
from naiad.cli.bench import measure, resolve_source
from naiad.errors import ConfigError
from tests.helpers import run_to_end

SMALL = [
    "--rows",
    "2000",
    "--batch-size",
    "64",
    "--batches",
    "12",
    "--warmup",
    "2",
    "--step-ms",
    "1",
]


def run_cli(*argv: str) -> subprocess.CompletedProcess[str]:
    """Run the ``naiad`` command in a fresh interpreter, as a user does (its workers killed with
    it whatever happens)."""
    return run_to_end([sys.executable, "-m", "naiad", *argv], timeout_s=90)


@pytest.mark.timeout(120)
def test_bench_demo_prints_the_serial_against_naiad_table():
    proc = run_cli("bench", "demo", *SMALL, "--device", "cpu")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for label in ("total s", "per step ms", "data loading ms/step", "exposed wait ms/step"):
        assert label in out
    assert "serial" in out and "naiad" in out and "serial/naiad" in out


@pytest.mark.timeout(120)
def test_bench_json_has_both_runs_with_every_step(capsys, tmp_path):
    trace = tmp_path / "run.json"
    argv = [
        "bench",
        "demo",
        *SMALL,
        "--device",
        "cpu",
        "--json",
        "--load-ms",
        "1",
        "--trace",
        str(trace),
    ]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    events = json.loads(trace.read_text())["traceEvents"]
    assert sum(e["name"] == "wait" for e in events) >= 12
    serial, ours = doc["runs"]
    assert (serial["name"], ours["name"]) == ("serial", "naiad")
    assert serial["steps"] == ours["steps"] == 12
    assert len(ours["waits_ms"]) == 12
    assert ours["loader_stats"]["batches"] >= 12
    # The 1 ms of loading latency is exposed in the serial loop, every step.
    assert serial["wait_ms_per_step"] >= 1.0


@pytest.mark.timeout(60)
def test_bench_plot_without_matplotlib_is_a_clear_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what an install without it looks like
    assert main(["bench", "demo", *SMALL, "--plot", str(tmp_path / "w.png")]) == 2
    assert "pip install 'naiad[plot]'" in capsys.readouterr().err
    assert not (tmp_path / "w.png").exists()


@pytest.mark.timeout(120)
def test_bench_plot_draws_a_png(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    png = tmp_path / "wait.png"
    assert main(["bench", "demo", *SMALL, "--device", "cpu", "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "drawn to" in capsys.readouterr().out


@pytest.mark.timeout(120)
def test_bench_reads_a_csv_file(tmp_path, capsys):
    path = tmp_path / "data.csv"
    rng = np.random.default_rng(0)
    rows = ["a,b,name"] + [
        f"{x:.3f},{y},r{i}" for i, (x, y) in enumerate(zip(rng.random(500), range(500), strict=True))
    ]
    path.write_text("\n".join(rows) + "\n")
    assert main(["bench", str(path), *SMALL, "--device", "cpu", "--train"]) == 0
    assert "real MLP" in capsys.readouterr().out


@pytest.mark.timeout(60)
def test_bench_missing_source_is_a_clear_error(tmp_path, capsys):
    assert main(["bench", str(tmp_path / "nothing-*.parquet"), *SMALL]) == 2
    assert "`source` must be 'demo', a file or a glob" in capsys.readouterr().err


@pytest.mark.timeout(60)
def test_bench_bad_batch_size_is_a_clear_error(capsys):
    assert main(["bench", "demo", "--batch-size", "0"]) == 2
    assert "`--batch-size` must be >= 1, got 0" in capsys.readouterr().err


def test_resolve_source_streams_files_with_naiads_readers(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"x": [1.0, 2.0, 3.0], "y": [1, 2, 3], "s": ["a", "b", "c"]})
    pq.write_table(table, tmp_path / "t.parquet")
    source, words = resolve_source(str(tmp_path / "*.parquet"))
    assert "naiad.read_parquet" in words


def test_load_latency_is_for_the_demo_only(tmp_path):
    (tmp_path / "a.csv").write_text("a\n1\n")
    with pytest.raises(ConfigError, match="--load-ms"):
        resolve_source(str(tmp_path / "a.csv"), load_ms=1.0)


@pytest.mark.timeout(120)
def test_bench_streams_a_parquet_file_with_workers(tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    n = 3000
    pq.write_table(
        pa.table({"x": np.arange(n, dtype=np.float32), "y": np.arange(n) % 2}),
        tmp_path / "d.parquet",
    )
    argv = [
        "bench",
        str(tmp_path / "d.parquet"),
        *SMALL,
        "--device",
        "cpu",
        "--num-workers",
        "1",
        "--json",
    ]
    assert main(argv) == 0
    serial, ours = json.loads(capsys.readouterr().out)["runs"]
    assert serial["steps"] == ours["steps"] == 12
    assert ours["loader_stats"]["batches"] >= 12


def test_resolve_source_rejects_unknown_formats(tmp_path):
    (tmp_path / "x.bin").write_bytes(b"\0")
    with pytest.raises(ConfigError, match="cannot read"):
        resolve_source(str(tmp_path / "x.bin"))


def test_measure_restarts_the_source_when_it_runs_out():
    calls = []
    r = measure("x", [1, 2], calls.append, steps=5, warmup=1)
    assert r.steps == 5 and calls == [1, 2, 1, 2, 1, 2]
    assert all(w >= 0 for w in r.waits_s)


@pytest.mark.timeout(60)
def test_bench_is_listed_by_the_naiad_command(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "bench" in capsys.readouterr().out
