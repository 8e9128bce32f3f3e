"""The scripts under examples/ run as their docs say, on the CPU, on data they make."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import run_to_end

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run_example(script: str, *args: str, timeout_s: float = 240) -> subprocess.CompletedProcess[str]:
    """``python examples/<script> ...``, its whole process tree killed whatever happens."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return run_to_end([sys.executable, str(EXAMPLES / script), *args], timeout_s=timeout_s, env=env)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("workers", [0, 2])
def test_detection_example_streams_variable_size_images_with_their_boxes(tmp_path: Path, workers: int) -> None:
    out = run_example("detection.py", "--images", "40", "--batch-size", "4", "--epochs", "2",
                      "--workers", str(workers), "--device", "cpu", "--data", str(tmp_path))
    assert out.returncode == 0, out.stdout + out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["detect-0000.tar"]
    # The first batch: a tuple of 4 uint8 [3, H, W] images of their own sizes, each with its
    # target's boxes [N, 4] and N labels, as seed 003's collate_fn=lambda x: tuple(zip(*x)) gives.
    assert "a batch: 4 images, 4 targets" in out.stdout
    shapes = re.findall(r"torch\.uint8 \[3, (\d+), (\d+)\] on cpu; boxes \[(\d+), 4\], labels \[([0-9, ]+)\]", out.stdout)
    assert len(shapes) == 4
    assert len({(h, w) for h, w, _, _ in shapes}) > 1  # not resized to one size
    for _, _, boxes, labels in shapes:
        assert int(boxes) == len(labels.split(","))
    # Every image once per epoch, and the stand-in model learns.
    epochs = re.findall(r"epoch (\d): 10 batches in [0-9.]+s, mean loss ([0-9.]+), each image once: True", out.stdout)
    assert [e for e, _ in epochs] == ["0", "1"], out.stdout
    assert float(epochs[1][1]) < float(epochs[0][1])
