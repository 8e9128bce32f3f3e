"""`naiad demo images` end to end, in a subprocess, on a small built-in image folder."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from naiad.cli import main
from naiad.cli.demo_images import check_coverage
from tests.helpers import demo_table_rows, run_naiad_demo

pytestmark = pytest.mark.timeout(300)

LOADERS = (
    "torch.utils.data.DataLoader",
    "naiad.DataLoader",
    "naiad from the folder",
    "naiad from tar shards",
    "naiad from decoded Parquet",
)


@pytest.mark.parametrize("workers", [0, 2])
def test_demo_images_trains_every_loader_on_each_image_once_per_epoch(tmp_path: Path, workers: int) -> None:
    out = run_naiad_demo("demo", "images", "--images", "400", "--epochs", "2", "--batch-size", "32",
                    "--workers", str(workers), cache=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"num_workers={workers}" in out.stdout
    for expected in ("images/s", "wait/step", "total", "test loss", "accuracy", "speed-up of naiad from tar shards"):
        assert expected in out.stdout
    rows = demo_table_rows(out.stdout, LOADERS)
    assert sorted(rows) == sorted(LOADERS), out.stdout
    # The demo checks each run's delivered keys against the folder's (check_coverage below).
    assert "Every loader delivered each of the 400 images exactly once per epoch." in out.stdout
    assert "error:" not in out.stdout
    # Learning: every loader's mean training loss falls from the first epoch to the second, and
    # every model ends better on the test images than the same model before training.
    before = float(re.search(r"before training: test loss ([0-9.]+)", out.stdout).group(1))  # type: ignore[union-attr]
    for name in LOADERS:
        first, last = map(float, re.search(rf"  {re.escape(name)}: [0-9.]+s, epoch losses ([0-9.]+) -> ([0-9.]+)",
                                           out.stdout).groups())  # type: ignore[union-attr]
        assert last < first, (name, first, last)
        test_loss = float(rows[name][-2])
        assert test_loss < before, (name, test_loss, before)
    # torch and naiad over the same dataset and sampler: the same batches, the same final loss.
    assert rows["torch.utils.data.DataLoader"][-3] == rows["naiad.DataLoader"][-3]
    # The data and its conversions were made once, in the cache, and are reused.
    root = tmp_path / "fashion-400-100-0"
    assert len(list((root / "train").rglob("*.png"))) == 400 and len(list((root / "test").rglob("*.png"))) == 100
    assert (root / "shards" / "train.manifest.json").exists() and (root / "pixels" / "train.manifest.json").exists()


def test_demo_images_reuses_the_cached_data(tmp_path: Path) -> None:
    first = run_naiad_demo("demo", "images", "--images", "100", "--epochs", "1", cache=tmp_path)
    assert first.returncode == 0, first.stderr
    made = {p: p.stat().st_mtime_ns for p in (tmp_path / "fashion-100-100-0").rglob("*") if p.is_file()}
    second = run_naiad_demo("demo", "images", "--images", "100", "--epochs", "1", cache=tmp_path)
    assert second.returncode == 0, second.stderr
    assert {p: p.stat().st_mtime_ns for p in made} == made


def test_demo_modes_refuse_each_others_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--images", "100"]) == 1
    assert "`--images`" in capsys.readouterr().err
    assert main(["demo", "images", "--csv", "x.csv"]) == 1
    assert "`--csv`" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["demo", "pictures"])  # not a mode: argparse's usage error
    assert "invalid choice" in capsys.readouterr().err


def test_coverage_check_names_missing_repeated_and_unknown_samples() -> None:
    keys = ["a", "b", "c"]
    assert check_coverage([["c", "a", "b"], ["b", "c", "a"]], keys) == ""
    assert check_coverage([["a", "b", "c"], ["a", "a", "b"]], keys) == "epoch 1: 1 missing, 1 repeated, 0 unknown"
    assert check_coverage([["a", "b", "c", "z"]], keys) == "epoch 0: 0 missing, 0 repeated, 1 unknown"
