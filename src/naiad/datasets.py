"""Built-in data: a diabetes-shaped CSV made on first use and cached.

The columns follow the Pima diabetes table of the classic PyTorch tutorial (8 numeric features
and a 0/1 ``Outcome``); the values are synthetic, drawn with plausible ranges, and the label
depends on the features through a logistic model, so a small network can learn it.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from naiad.sources.cache import user_cache_dir as cache_dir

__all__ = ["DIABETES_COLUMNS", "cache_dir", "diabetes_csv", "make_diabetes_table"]

DIABETES_COLUMNS = (
    "Pregnancies",
    "Glucose",
    "BloodPressure",
    "SkinThickness",
    "Insulin",
    "BMI",
    "DiabetesPedigreeFunction",
    "Age",
    "Outcome",
)


def make_diabetes_table(rows: int, seed: int = 0) -> pa.Table:
    """A diabetes-shaped table of ``rows`` rows: 8 float32 features and an int ``Outcome``."""
    rng = np.random.default_rng(seed)
    f32 = np.float32
    features = {
        "Pregnancies": rng.poisson(3.8, rows).astype(f32),
        "Glucose": np.clip(rng.normal(121, 32, rows), 40, 200).round().astype(f32),
        "BloodPressure": np.clip(rng.normal(69, 19, rows), 20, 122).round().astype(f32),
        "SkinThickness": np.clip(rng.normal(21, 16, rows), 0, 99).round().astype(f32),
        "Insulin": np.clip(rng.exponential(80, rows), 0, 846).round().astype(f32),
        "BMI": np.clip(rng.normal(32, 7.9, rows), 15, 67).round(1).astype(f32),
        "DiabetesPedigreeFunction": np.clip(rng.gamma(2.0, 0.24, rows), 0.08, 2.42).round(3).astype(f32),
        "Age": np.clip(rng.gamma(3.0, 11.0, rows) + 21, 21, 81).round().astype(f32),
    }
    logit = (
        0.035 * (features["Glucose"] - 121)
        + 0.09 * (features["BMI"] - 32)
        + 0.12 * (features["Pregnancies"] - 3.8)
        + 0.9 * (features["DiabetesPedigreeFunction"] - 0.47)
        + 0.015 * (features["Age"] - 33)
        - 0.65
    )
    outcome = (rng.random(rows) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int64)
    return pa.table({**features, "Outcome": outcome})


def diabetes_csv(rows: int = 1_000_000, path: str | os.PathLike[str] | None = None, seed: int = 0) -> Path:
    """Path of a diabetes-shaped CSV of ``rows`` rows, written once into the cache and reused.

    Args:
        rows: number of data rows (a header line comes first).
        path: where to write it; by default ``cache_dir()/diabetes-{rows}-{seed}.csv``.
        seed: the data's random seed.

    Example:
        >>> p = diabetes_csv(rows=1000)  # doctest: +SKIP
        >>> p.read_text().splitlines()[0]  # doctest: +SKIP
        'Pregnancies,Glucose,BloodPressure,SkinThickness,Insulin,BMI,DiabetesPedigreeFunction,Age,Outcome'
    """
    target = Path(path) if path is not None else cache_dir() / f"diabetes-{rows}-{seed}.csv"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # A fresh name (O_EXCL, mode 0600): a predictable one could be a link planted in a shared folder.
    fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    tmp = Path(name)
    try:
        options = pacsv.WriteOptions(include_header=True, quoting_style="none")
        # Write in slices so making a large file stays in bounded memory.
        chunk = 1_000_000
        with os.fdopen(fd, "wb") as f, pacsv.CSVWriter(f, make_diabetes_table(1, seed).schema, write_options=options) as writer:
            for start in range(0, rows, chunk):
                writer.write_table(make_diabetes_table(min(chunk, rows - start), seed + start))
        os.chmod(tmp, 0o644)  # synthetic data: readable like any file once in place
        os.replace(tmp, target)  # atomic: a reader never sees half a file
    finally:
        tmp.unlink(missing_ok=True)
    return target
