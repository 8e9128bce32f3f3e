"""`naiad demo` end to end, in a subprocess, on small data."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers import run_to_end

pytestmark = pytest.mark.timeout(180)


def run_naiad(*args: str, cache: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NAIAD_CACHE_DIR": cache}
    return run_to_end([sys.executable, "-m", "naiad", *args], timeout_s=170, env=env)


def test_demo_on_builtin_data_prints_the_comparison(tmp_path: os.PathLike[str]) -> None:
    out = run_naiad("demo", "--rows", "20000", "--epochs", "1", cache=str(tmp_path))
    assert out.returncode == 0, out.stderr
    for expected in ("torch.utils.data.DataLoader", "naiad.DataLoader", "naiad streaming the CSV", "rows/s", "wait/step", "speed-up"):
        assert expected in out.stdout
    assert (tmp_path / "diabetes-20000-0.csv").exists()  # made once, in the cache
    lines = [line for line in out.stdout.splitlines() if line.startswith(("torch.utils", "naiad.DataLoader "))]
    losses = {line.split()[-1] for line in lines}
    assert len(lines) == 2 and len(losses) == 1  # same batches, same model: the same final loss


def test_demo_on_a_user_csv_with_named_columns(tmp_path: os.PathLike[str]) -> None:
    import numpy as np

    path = os.path.join(str(tmp_path), "mine.csv")
    rng = np.random.default_rng(0)
    with open(path, "w") as f:
        f.write("a,b,target,c\n")
        for row in rng.random((500, 4)):
            f.write(f"{row[0]:.4f},{row[1]:.4f},{int(row[2] > 0.5)},{row[3]:.4f}\n")
    out = run_naiad("demo", "--csv", path, "--label", "target", "--features", "a,b", "--epochs", "1", cache=str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "2 features -> 'target'" in out.stdout


def test_demo_names_a_missing_file_and_column(tmp_path: os.PathLike[str]) -> None:
    out = run_naiad("demo", "--csv", os.path.join(str(tmp_path), "nope.csv"), cache=str(tmp_path))
    assert out.returncode == 1 and "nope.csv" in out.stderr and "no such file" in out.stderr
    assert "Traceback" not in out.stderr
    path = os.path.join(str(tmp_path), "x.csv")
    with open(path, "w") as f:
        f.write("a,b\n1,0\n2,1\n")
    out = run_naiad("demo", "--csv", path, "--label", "zzz", cache=str(tmp_path))
    assert out.returncode != 0 and "zzz" in out.stderr
