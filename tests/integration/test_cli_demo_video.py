"""`naiad demo video` end to end, in a subprocess, on a small built-in folder of videos made with
PyAV; and its message when PyAV is missing."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from naiad.cli import main
from tests.helpers import demo_table_rows, run_naiad_demo

pytest.importorskip("av", reason="the video demo makes and decodes videos with PyAV (pip install 'naiad[test]')")
pytestmark = pytest.mark.timeout(300)

LOADERS = ("torch.utils.data.DataLoader", "naiad.DataLoader", "naiad from the folder", "naiad from tar shards")


@pytest.mark.parametrize("workers", [0, 2])
def test_demo_video_trains_every_loader_on_each_video_once_per_epoch(tmp_path: Path, workers: int) -> None:
    out = run_naiad_demo("demo", "video", "--videos", "16", "--epochs", "2", "--workers", str(workers), cache=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"num_workers={workers}" in out.stdout and "clips of 8 frames every 2 at 64x64" in out.stdout
    for expected in ("clips/s", "wait/step", "total", "test loss", "accuracy", "speed-up of naiad from the folder"):
        assert expected in out.stdout
    rows = demo_table_rows(out.stdout, LOADERS)
    assert sorted(rows) == sorted(LOADERS), out.stdout
    assert "Every loader delivered each of the 16 videos exactly once per epoch." in out.stdout
    assert "error:" not in out.stdout
    if workers == 0:  # the same dataset, sampler and clip draws (Python's random): the same batches and loss
        assert rows["torch.utils.data.DataLoader"][-3] == rows["naiad.DataLoader"][-3]
    # The videos and their shards were made once, in the cache: the command to remake them is shown.
    root = tmp_path / "actions-16-8-0"
    assert len(list((root / "train").rglob("*.mp4"))) == 16 and len(list((root / "test").rglob("*.mp4"))) == 8
    assert (root / "shards" / "train.manifest.json").exists()
    assert f"naiad convert {root / 'train'} {root / 'shards' / 'train.tar'} --keyframe-interval 16" in out.stdout


def test_demo_video_without_pyav_says_how_to_install_it(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NAIAD_CACHE_DIR", str(tmp_path))
    monkeypatch.setitem(sys.modules, "av", None)  # `import av` raises ImportError
    assert main(["demo", "video", "--videos", "8"]) == 1
    err = capsys.readouterr().err
    assert "naiad demo: error: `naiad demo video` needs PyAV, which is not installed: pip install 'naiad[video]'." in err
    assert not list(tmp_path.iterdir())  # nothing made


def test_demo_video_refuses_the_other_demos_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "video", "--images", "100"]) == 1
    assert "`--images` sets the images of `naiad demo images`, not of `naiad demo video`" in capsys.readouterr().err
    assert main(["demo", "--videos", "16"]) == 1
    assert "`--videos` sets the videos of `naiad demo video`" in capsys.readouterr().err
    assert main(["demo", "video", "--rows", "100"]) == 1
    assert "`--rows` is an option of the CSV demo, not of `naiad demo video`" in capsys.readouterr().err
