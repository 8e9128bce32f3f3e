"""Images end to end: naiad's loaders with ``decode_images`` against what a user runs instead.

Three workloads, made here (nothing is downloaded): ImageNet-shaped JPEGs (about 500x375,
quality 90) and large photos (about 2000x1500, quality 90), both through the classic evaluation
transform (decode, shorter side to 256, centre crop 224); and FashionMNIST-shaped 28x28
grayscale PNGs (decode only). Each is written three ways: a folder of class folders, WebDataset
tar shards (``webdataset.TarWriter``), and Parquet with a binary image column. Side by side in one
run, each loader with the same worker count (process workers), images/s over a whole epoch
(median of the rounds, after a warm-up epoch; persistent workers everywhere), and images per
CPU second of the whole process tree (the loop's process and its workers: on a shared machine
the work per image, which the neighbours' load does not change):

* ``torch folder``: torch's DataLoader over a folder dataset that opens each image with PIL and
  does the resize and centre crop in PIL, as a user without torchvision writes it (torchvision
  does not load beside this machine's CPU build of torch, so ``ImageFolder`` + ``Resize(256)`` +
  ``CenterCrop(224)`` + ``PILToTensor`` is written out: the same calls it makes).
* ``webdataset``: WebDataset's own loader, ``webdataset.WebDataset(urls).decode("pil").map(...)``
  (the same PIL resize and crop) under torch's DataLoader, over the same shards.
* ``ceiling``: the bare decode loop, the fastest decode and resize here (simplejpeg's
  libjpeg-turbo shrunk in the DCT, torch's antialiased resize; Pillow for PNG), one thread of
  one process: per wall second times the usable cores; per CPU second as it is (a CPU second is
  one core's, whatever the loader's process count).
* ``naiad folder`` / ``naiad shards`` / ``naiad parquet``: ``naiad.read_images``,
  ``naiad.read_webdataset``, ``naiad.read_parquet`` with ``transform=naiad.decode_images(...)``
  (decoded on the stream's decode stage: NOTE [ Decode in the workers ] in pipeline.py).
* ``naiad map-style folder``: the folder's bytes as a map-style dataset (``__getitems__``), the
  same transform decoding inside naiad's worker processes: the alternative to the stream's
  decode stage of threads.
* 28x28 only: ``torch folder`` at 0, 1 and 2 workers (its best is the target's reference), and
  ``naiad --decode``: the folder converted once by ``naiad convert --decode`` (uint8 pixels
  stored), read without a decode.

Run: ``python bench/bench_images.py [--imagenet 512 --large 48 --png 60000 --rounds 3]``. The
machines here are shared and noisy: compare the ratios of one run, not absolute rates across runs.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_decode import photo, pillow_png, simplejpeg_eval  # noqa: E402
from harness import environment, markdown_table  # noqa: E402
from harness import epoch_rate as harness_epoch_rate  # noqa: E402

import naiad  # noqa: E402
from naiad.parallel.threads import usable_cores  # noqa: E402

try:
    import webdataset as wds
    from PIL import Image
except ImportError:  # pragma: no cover
    sys.exit("bench_images needs Pillow and webdataset: pip install 'naiad[images,test]'")

CLASSES = 4
SHARDS = 8


# --- data -------------------------------------------------------------------------------------


def encode(image: Image.Image, fmt: str, **kwargs: Any) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **kwargs)
    return out.getvalue()


def make_images(kind: str, count: int, rng: np.random.Generator) -> list[bytes]:
    out = []
    for _ in range(count):
        if kind == "imagenet":
            w, h = (500, 375) if rng.random() < 0.8 else (375, 500)
            w, h = int(w * rng.uniform(0.9, 1.1)), int(h * rng.uniform(0.9, 1.1))
            out.append(encode(photo(rng, w, h), "JPEG", quality=90))
        elif kind == "large":
            out.append(encode(photo(rng, 2000, 1500), "JPEG", quality=90))
        else:
            arr = np.zeros((28, 28), np.uint8)
            arr[4:24, 6:22] = rng.integers(0, 256, (20, 16))
            out.append(encode(Image.fromarray(arr), "PNG"))
    return out


def write_all(root: Path, images: list[bytes], ext: str) -> dict[str, Any]:
    """The images as a class folder tree, tar shards and Parquet; returns where each is."""
    folder = root / "folder"
    for i, data in enumerate(images):
        d = folder / f"class{i % CLASSES}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{i:06d}.{ext}").write_bytes(data)
    shards = root / "shards"
    shards.mkdir()
    per = -(-len(images) // SHARDS)
    with wds.ShardWriter(str(shards / "s-%04d.tar"), maxcount=per, verbose=0) as sink:
        for i, data in enumerate(images):
            sink.write({"__key__": f"{i:06d}", ext: data, "cls": i % CLASSES})
    urls = sorted(str(p) for p in shards.glob("*.tar"))
    table = pa.table({"image": pa.array(images, pa.binary()), "label": np.arange(len(images)) % CLASSES})
    pq.write_table(table, root / "images.parquet", row_group_size=256)
    return {"folder": str(folder), "urls": urls, "pattern": str(shards / "*.tar"), "parquet": str(root / "images.parquet")}


# --- what a user writes without naiad ---------------------------------------------------------


def pil_eval(im: Image.Image) -> torch.Tensor:
    """Resize(256) + CenterCrop(224) + PILToTensor, as torchvision does them, in PIL."""
    im = im.convert("RGB")
    w, h = im.size
    rw, rh = (256, int(256 * h / w)) if w <= h else (int(256 * w / h), 256)
    im = im.resize((rw, rh), Image.BILINEAR)
    left, top = int(round((rw - 224) / 2)), int(round((rh - 224) / 2))
    im = im.crop((left, top, left + 224, top + 224))
    return torch.from_numpy(np.asarray(im).copy()).permute(2, 0, 1)


def pil_gray(im: Image.Image) -> torch.Tensor:
    return torch.from_numpy(np.asarray(im.convert("L")).copy())[None]


class FolderDataset(torch.utils.data.Dataset):
    """ImageFolder written out: sorted class folders, each file opened with PIL per sample."""

    def __init__(self, root: str, transform: Callable[[Image.Image], torch.Tensor]) -> None:
        classes = sorted(os.listdir(root))
        self.samples = [(os.path.join(root, c, f), i) for i, c in enumerate(classes)
                        for f in sorted(os.listdir(os.path.join(root, c)))]
        self.transform = transform

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[index]
        with open(path, "rb") as f:
            image = Image.open(f)
            image.load()
        return self.transform(image), label


class FolderBytes(torch.utils.data.Dataset):
    """A map-style dataset of the folder's files as bytes, a batch at a time (``__getitems__``):
    with ``transform=decode_images(...)`` naiad decodes each batch inside its worker processes
    (the alternative to a stream's decode stage, NOTE [ Decode in the workers ])."""

    def __init__(self, root: str) -> None:
        self.samples = FolderDataset(root, pil_eval).samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.__getitems__([index])

    def __getitems__(self, indices: list[int]) -> dict[str, Any]:
        data = []
        for i in indices:
            with open(self.samples[i][0], "rb") as f:
                data.append(f.read())
        return {"image": data, "label": torch.tensor([self.samples[i][1] for i in indices])}


def keep_batch(batch: Any) -> Any:
    return batch


def wds_sample(transform: Callable[[Image.Image], torch.Tensor], ext: str) -> Callable[[dict[str, Any]], Any]:
    def to_pair(sample: dict[str, Any]) -> tuple[torch.Tensor, int]:
        return transform(sample[ext]), int(sample["cls"])
    return to_pair


# --- measuring --------------------------------------------------------------------------------


def _images_of(batch: Any) -> int:
    x = (batch["image"] if "image" in batch else batch["jpg"] if "jpg" in batch else batch["png"]) \
        if isinstance(batch, dict) else batch[0]
    return len(x)


def epoch_rate(loader: Iterable[Any], images: int) -> tuple[float, float]:
    """Images per wall second and per CPU second of the process tree, over one epoch."""
    return harness_epoch_rate(loader, images, _images_of)


def run_workload(kind: str, count: int, args: argparse.Namespace, root: Path) -> list[list[Any]]:
    rng = np.random.default_rng({"imagenet": 0, "large": 1, "png28": 2}[kind])
    t0 = time.perf_counter()
    images = make_images(kind, count, rng)
    ext = "png" if kind == "png28" else "jpg"
    where = write_all(root / kind, images, ext)
    print(f"  {kind}: {count} images, {sum(map(len, images)) / count / 1024:.1f} KiB mean, made in "
          f"{time.perf_counter() - t0:.0f} s", flush=True)
    workers = args.workers
    batch = {"imagenet": args.batch, "large": args.large_batch, "png28": args.png_batch}[kind]
    pil = pil_gray if kind == "png28" else pil_eval
    if kind == "png28":
        decode = naiad.decode_images("image", mode="L", size=(28, 28), crop="center")
        wds_decode = naiad.decode_images(ext, mode="L", size=(28, 28), crop="center")
    else:
        decode = naiad.decode_images("image", resize=256, crop="center", size=224)
        wds_decode = naiad.decode_images(ext, resize=256, crop="center", size=224)

    def torch_folder(w: int) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(FolderDataset(where["folder"], pil), batch_size=batch, shuffle=True,
                                           num_workers=w, persistent_workers=w > 0)

    loaders: dict[str, Any] = {}
    if kind == "png28":
        for w in sorted({0, 1, workers}):
            loaders[f"torch folder w={w}"] = torch_folder(w)
    else:
        loaders["torch folder"] = torch_folder(workers)
    pipeline = wds.WebDataset(where["urls"], shardshuffle=False, empty_check=False).decode("pil").map(wds_sample(pil, ext))
    loaders["webdataset"] = torch.utils.data.DataLoader(pipeline, batch_size=batch, num_workers=workers,
                                                        persistent_workers=workers > 0)

    def naiad_loader(source: Any, transform: Any) -> naiad.DataLoader:
        return naiad.DataLoader(source, batch_size=batch, shuffle=True, seed=0, num_workers=workers,
                                persistent_workers=workers > 0, transform=transform)

    loaders["naiad folder"] = naiad_loader(naiad.read_images(where["folder"]), decode)
    loaders["naiad map-style folder"] = naiad.DataLoader(
        FolderBytes(where["folder"]), batch_size=batch, shuffle=True, seed=0, num_workers=workers,
        persistent_workers=workers > 0, collate_fn=keep_batch, transform=decode)
    shards = naiad.read_webdataset(where["pattern"], index_dir=str(root / kind / "index"))
    loaders["naiad shards"] = naiad_loader(shards, wds_decode)
    loaders["naiad parquet"] = naiad_loader(naiad.read_parquet(where["parquet"]), decode)
    if kind == "png28":
        converted = root / kind / "decoded.parquet"
        subprocess.run([sys.executable, "-m", "naiad", "convert", where["folder"], str(converted), "--decode"],
                       check=True, capture_output=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        loaders["naiad --decode"] = naiad_loader(naiad.read_parquet(str(converted)), None)

    # The ceiling: the bare loop on one thread, times the cores.
    bare: Callable[[list[bytes]], object] = pillow_png if kind == "png28" else simplejpeg_eval
    bare(images[:8])
    ceiling_wall, ceiling_cpu = [], []
    for _ in range(args.rounds):
        t, c = time.perf_counter(), time.process_time()
        bare(images)
        ceiling_wall.append(count / (time.perf_counter() - t) * usable_cores())
        ceiling_cpu.append(count / max(1e-9, time.process_time() - c))  # per CPU second: one core's work

    rates: dict[str, list[tuple[float, float]]] = {name: [] for name in loaders}
    try:
        for loader in loaders.values():
            epoch_rate(loader, count)  # warm-up: workers start, indexes and listings made, caches
        for _ in range(args.rounds):  # interleaved: a noisy neighbour slows them all alike
            for name, loader in loaders.items():
                rates[name].append(epoch_rate(loader, count))
    finally:
        for loader in loaders.values():
            close = getattr(loader, "close", None)
            if close is not None:
                close()
    # Per wall second, and per CPU second of the process tree: the machines here are shared, so
    # a wall rate is the share of the cores the scheduler gave; the work per image is not.
    # The ceiling: per wall second, the bare loop's rate times the cores (what the cores would do
    # if they were all ours); per CPU second, the bare loop's own (a CPU second is one core's).
    wall = {name: statistics.median(w for w, _ in v) for name, v in rates.items()}
    cpu = {name: statistics.median(c for _, c in v) for name, v in rates.items()}
    wall["ceiling"], cpu["ceiling"] = statistics.median(ceiling_wall), statistics.median(ceiling_cpu)
    rows = []
    for table in (wall, cpu):
        torch_ref = max(v for k, v in table.items() if k.startswith("torch folder"))
        per = "wall s" if table is wall else "CPU s"
        for name, value in table.items():
            rows.append([kind, per, name, f"{value:,.0f}", f"{value / torch_ref:.2f}x",
                         f"{value / table['webdataset']:.2f}x", f"{value / table['ceiling']:.2f}x"])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--imagenet", type=int, default=512, help="ImageNet-shaped JPEGs (0: skip)")
    parser.add_argument("--large", type=int, default=48, help="2000x1500 JPEGs (0: skip)")
    parser.add_argument("--png", type=int, default=60000, help="28x28 PNGs (0: skip; default FashionMNIST's training set)")
    parser.add_argument("--workers", type=int, default=usable_cores(), help="workers of every loader (default: the cores)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--large-batch", type=int, default=16)
    parser.add_argument("--png-batch", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3, help="timed epochs per loader (median)")
    parser.add_argument("--data", default=None, help="where to write the data (default: a temporary folder)")
    args = parser.parse_args()
    # One intra-op thread, as torch's DataLoader workers run and naiad's decode threads do: the
    # bare loop's resize on two OpenMP threads of a shared machine measured a third as fast.
    torch.set_num_threads(1)
    print(environment())
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}; "
          f"{args.workers} workers per loader, {usable_cores()} usable cores", flush=True)
    root = Path(args.data or tempfile.mkdtemp(prefix="naiad-bench-images-"))
    rows: list[list[Any]] = []
    try:
        for kind, count in (("imagenet", args.imagenet), ("large", args.large), ("png28", args.png)):
            if count:
                rows += run_workload(kind, count, args, root)
    finally:
        if args.data is None:
            shutil.rmtree(root, ignore_errors=True)
    print()
    print(markdown_table(["workload", "per", "loader", "images", "vs torch (best)", "vs webdataset", "vs ceiling"], rows))
    print(f"load average after: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")


if __name__ == "__main__":
    main()
