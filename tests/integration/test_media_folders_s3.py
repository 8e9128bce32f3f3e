"""Image and video folders behind s3:// URLs (NOTE [ Remote folder listing ]), against a real S3
server on loopback (moto's server mode, tests/s3server.py) behind the logging proxy: the same
classes, order, labels and bytes as the same tree on local disk; decoded through the loader;
every file once across process workers and ranks; an exact resume; the cache serving a second
epoch with the server stopped; an oversized object skipped unfetched; a hostile listing refused;
video folders, URL globs and lists of URLs."""

from __future__ import annotations

import io
import os
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("moto.server", reason="the object storage tests need moto[server] (pip install 'naiad[test]')")
pytest.importorskip("s3fs", reason="the object storage tests need s3fs (pip install 'naiad[s3]')")
Image = pytest.importorskip("PIL.Image", reason="the image folder tests write images with Pillow")

import naiad  # noqa: E402
from naiad.errors import ConfigError, SourceError  # noqa: E402
from naiad.sources.cache import cache_stats  # noqa: E402
from naiad.sources.remote_listing import FETCH_WINDOW  # noqa: E402
from naiad.sources.retries import RetryPolicy  # noqa: E402
from naiad.testing import check_resume  # noqa: E402
from tests.s3server import BUCKET, S3Server, own_server, stop_server  # noqa: E402

FAST_FAIL = RetryPolicy(attempts=2, base_s=0.01, max_wait_s=0.01)  # a stopped server fails at once
CLASSES = {"dog": 5, "cat": 7, "ant": 3}
TOTAL = sum(CLASSES.values())


@pytest.fixture(scope="module")
def server() -> Iterator[S3Server]:
    """The module's server, behind the proxy that logs every request (``server.proxy``)."""
    yield from own_server()


@pytest.fixture
def own_s3() -> Iterator[S3Server]:
    """A server of the test's own, so the test may stop it."""
    yield from own_server()


def options(s3: S3Server) -> dict[str, Any]:
    """Through the proxy; the client's own retries off, so a stopped server fails fast."""
    return s3.options(s3.proxy.endpoint, config_kwargs={"retries": {"max_attempts": 1}, "connect_timeout": 2})


def storage(s3: S3Server, **kw: Any) -> naiad.Storage:
    return naiad.Storage(options(s3), FAST_FAIL, **kw)


def image_bytes(value: int, fmt: str = "PNG") -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.full((6, 6, 3), value, np.uint8)).save(out, format=fmt)
    return out.getvalue()


def write_tree(root: Path, classes: dict[str, int] = CLASSES) -> None:
    """Class folders of PNG and JPEG files (some in a nested folder, some with upper-case
    extensions) and a file that is no image, as ImageFolder's tests lay them out."""
    for name, count in classes.items():
        for k in range(count):
            sub = root / name / ("nested" if k % 4 == 3 else "")
            sub.mkdir(parents=True, exist_ok=True)
            jpeg = k % 2 == 1
            (sub / f"{k:03d}{'.JPEG' if jpeg else '.png'}").write_bytes(image_bytes(10 * k, "JPEG" if jpeg else "PNG"))
        (root / name / "README.txt").write_text("not an image")


def upload_tree(s3: S3Server, root: Path, prefix: str) -> str:
    """Every file under ``root`` put under ``prefix``; returns the prefix's URL."""
    for folder, _, files in os.walk(root):
        for name in files:
            path = Path(folder) / name
            s3.put(f"{prefix}/{path.relative_to(root).as_posix()}", path.read_bytes())
    return f"s3://{BUCKET}/{prefix}/"


@pytest.fixture(scope="module")
def tree(server: S3Server, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The local tree and its URL."""
    root = tmp_path_factory.mktemp("images") / "train"
    write_tree(root)
    return root, upload_tree(server, root, "images/train")


def object_gets(s3: S3Server, prefix: str) -> list[str]:
    """The object GETs under ``prefix`` so far (listings are GETs of the bucket, not counted)."""
    return [p for m, p, _ in s3.proxy.requests if m == "GET" and p.split("?")[0].startswith(f"/{BUCKET}/{prefix}/")]


def run(loader: naiad.DataLoader) -> list[dict[str, Any]]:
    try:
        return list(loader)
    finally:
        loader.close()


def test_a_folder_behind_a_url_reads_as_the_same_folder_on_disk(server, tree):
    root, url = tree
    local = naiad.read_images(root, index_dir=False)
    remote = naiad.read_images(url, storage=storage(server))
    assert remote.root == url.rstrip("/") and remote.paths == [remote.root]
    assert remote.classes == local.classes == ["ant", "cat", "dog"] and remote.class_to_idx == local.class_to_idx
    assert remote.column_names == local.column_names == ["image", "label", "path"] and len(remote) == len(local) == TOTAL
    mine = run(naiad.DataLoader(remote, batch_size=4))
    theirs = run(naiad.DataLoader(local, batch_size=4))
    urls = [p for b in mine for p in b["path"]]
    assert urls == [url + os.path.relpath(p, root) for b in theirs for p in b["path"]]  # the same order
    assert torch.equal(torch.cat([b["label"] for b in mine]), torch.cat([b["label"] for b in theirs]))
    assert [v for b in mine for v in b["image"]] == [v for b in theirs for v in b["image"]]
    assert remote.storage.infos == {}  # the objects' versions travel in the listing's arrays
    again = pickle.loads(pickle.dumps(remote))
    assert len(again) == TOTAL and again.read_block(again.blocks()[0]).columns["path"][0] == urls[0]


def test_a_flat_prefix_has_no_label_column(server):
    for k in range(4):
        server.put(f"flat/{k}.png", image_bytes(k))
    server.put("flat/notes.md", b"x")
    src = naiad.read_images(f"s3://{BUCKET}/flat", storage=options(server))
    assert src.class_to_idx == {} and src.column_names == ["image", "path"]
    batch = next(iter(naiad.DataLoader(src, batch_size=10)))
    assert batch["image"] == [image_bytes(k) for k in range(4)] and "label" not in batch


def test_an_empty_class_prefix_or_prefix_is_an_error(server):
    server.put("noclass/a/1.png", image_bytes(1))
    server.put("noclass/b/readme.txt", b"x")
    with pytest.raises(SourceError, match=r"noclass/b: the class folder 'b' holds no image file"):
        naiad.read_images(f"s3://{BUCKET}/noclass", storage=options(server))
    with pytest.raises(SourceError, match=r"nowhere: no object under the prefix"):
        naiad.read_images(f"s3://{BUCKET}/nowhere/", storage=options(server))


@pytest.mark.timeout(240)
def test_decoded_through_process_workers_every_file_once(server, tree):
    root, url = tree
    src = naiad.read_images(url, storage=storage(server), block_bytes=256)
    loader = naiad.DataLoader(src, batch_size=4, shuffle=True, seed=3, shuffle_buffer=6, num_workers=2,
                              worker_mode="process", transform=naiad.decode_images("image", size=4, crop="center"))
    batches = run(loader)
    paths = [p for b in batches for p in b["path"]]
    assert len(paths) == len(set(paths)) == TOTAL
    assert all(b["image"].dtype == torch.uint8 and b["image"].shape[1:] == (3, 4, 4) for b in batches)
    expected = {url + os.path.relpath(str(p), root): v for p, v in _local_values(root).items()}
    for b in batches:  # each image decoded to its own flat colour (JPEG within a few levels)
        for path, pixels in zip(b["path"], b["image"], strict=True):
            assert abs(int(pixels[0, 2, 2]) - expected[path]) <= 3, path


def _local_values(root: Path) -> dict[Path, int]:
    return {p: 10 * int(p.stem) for p in root.rglob("*") if p.suffix.lower() in (".png", ".jpeg")}


@pytest.mark.timeout(240)
def test_two_ranks_of_two_process_workers_read_every_file_once_with_equal_steps(server, tree):
    _, url = tree
    per_rank, steps = [], []
    for rank in range(2):
        src = naiad.read_images(url, storage=storage(server), block_bytes=256)
        batches = run(naiad.DataLoader(src, batch_size=3, shuffle=True, seed=1, shuffle_buffer=5, num_workers=2,
                                       rank=rank, world_size=2))
        steps.append(len(batches))
        per_rank.append([p for b in batches for p in b["path"]])
    assert steps[0] == steps[1] and not set(per_rank[0]) & set(per_rank[1])
    assert len(per_rank[0] + per_rank[1]) == len(set(per_rank[0] + per_rank[1])) == TOTAL


@pytest.mark.timeout(300)
def test_a_folder_behind_a_url_resumes_exactly(server, tree):
    _, url = tree

    def make() -> naiad.DataLoader:
        return naiad.DataLoader(naiad.read_images(url, storage=storage(server), block_bytes=256), batch_size=4,
                                shuffle=True, seed=2, shuffle_buffer=6)

    check_resume(make, epochs=2, positions=[0.5])


@pytest.mark.timeout(120)
def test_a_blocks_objects_are_fetched_a_few_at_a_time(server, tree):
    _, url = tree
    src = naiad.read_images(url, storage=storage(server))  # one block: the folder is small
    assert len(src.blocks()) == 1
    server.proxy.max_concurrent = 0
    server.proxy.latency_s = 0.05
    try:
        batches = run(naiad.DataLoader(src, batch_size=TOTAL, read_ahead=0))  # one task at a time
    finally:
        server.proxy.latency_s = 0.0
    assert len(batches[0]["path"]) == TOTAL
    assert 4 <= server.proxy.max_concurrent <= FETCH_WINDOW


@pytest.mark.timeout(120)
def test_an_oversized_object_is_skipped_into_the_ledger_without_a_fetch(server):
    for k in range(3):
        server.put(f"big/a/{k}.png", image_bytes(k))
    server.put("big/a/huge.png", image_bytes(9) + b"\0" * 5000)
    url = f"s3://{BUCKET}/big/a/huge.png"
    small = naiad.MediaAccess(max_bytes=2000)
    raising = naiad.read_images(f"s3://{BUCKET}/big", storage=storage(server), media=small)
    with pytest.raises(SourceError, match=rf"{url}: cannot read the image \(5,\d+ bytes, more than the 2,000"):
        run(naiad.DataLoader(raising, batch_size=2))
    skipping = naiad.read_images(f"s3://{BUCKET}/big", storage=storage(server), media=small, on_bad_rows="skip")
    loader = naiad.DataLoader(skipping, batch_size=2)
    paths = [p for b in run(loader) for p in b["path"]]
    assert len(paths) == 3 and url not in paths
    assert [e["file"] for e in loader.stats().bad_row_ledger] == [url]
    assert not [p for m, p, _ in server.proxy.requests if m == "GET" and p.split("?")[0] == f"/{BUCKET}/big/a/huge.png"]


@pytest.mark.timeout(120)
def test_an_object_removed_after_listing_is_named_or_skipped(server):
    for k in range(4):
        server.put(f"gone/a/{k}.png", image_bytes(k))
    raising = naiad.read_images(f"s3://{BUCKET}/gone", storage=storage(server))
    skipping = naiad.read_images(f"s3://{BUCKET}/gone", storage=storage(server), on_bad_rows="skip")
    server.client.delete_object(Bucket=BUCKET, Key="gone/a/2.png")
    url = f"s3://{BUCKET}/gone/a/2.png"
    with pytest.raises(SourceError, match=rf"{url}: cannot read the image: object or bucket not found .*removed since"):
        run(naiad.DataLoader(raising, batch_size=3))
    loader = naiad.DataLoader(skipping, batch_size=3)
    assert len([p for b in run(loader) for p in b["path"]]) == 3
    assert [e["file"] for e in loader.stats().bad_row_ledger] == [url]


def test_a_listing_with_names_that_climb_or_are_empty_is_refused(server):
    server.put("hostile/a/1.png", image_bytes(1))
    server.put("hostile/a/../../secret.png", image_bytes(2))  # S3 keys are any bytes: '..' is a name
    with pytest.raises(SourceError, match=r"hostile: the listing returned .*a name with a '\.' or '\.\.' component: refused"):
        naiad.read_images(f"s3://{BUCKET}/hostile", storage=options(server))
    server.put("hostile2/a//1.png", image_bytes(1))
    with pytest.raises(SourceError, match=r"hostile2: the listing returned .*an empty component: refused"):
        naiad.read_images(f"s3://{BUCKET}/hostile2", storage=options(server))


@pytest.mark.timeout(180)
def test_the_second_epoch_reads_the_cache_with_the_server_stopped(own_s3, tmp_path):
    root = tmp_path / "train"
    write_tree(root, {"a": 4, "b": 5})
    url = upload_tree(own_s3, root, "cached/train")
    cache = tmp_path / "cache"
    src = naiad.read_images(url, storage=storage(own_s3, cache_dir=cache), block_bytes=256)
    loader = naiad.DataLoader(src, batch_size=3, shuffle=True, seed=4)
    first = [p for b in run(loader) for p in b["path"]]
    fetched = len(object_gets(own_s3, "cached/train"))
    assert fetched == 9 and cache_stats(cache).misses == 9
    loader.set_epoch(1)
    second = [p for b in run(loader) for p in b["path"]]
    assert len(object_gets(own_s3, "cached/train")) == fetched and cache_stats(cache).hits == 9  # no request
    stop_server(own_s3)
    loader.set_epoch(2)
    third = [(p, v) for b in run(loader) for p, v in zip(b["path"], b["image"], strict=True)]
    assert sorted(first) == sorted(second) == sorted(p for p, _ in third) and first != second
    assert dict(third) == {url + os.path.relpath(str(p), root): p.read_bytes()
                           for p in root.rglob("*") if p.suffix.lower() in (".png", ".jpeg")}


# -- videos ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def videos(server: S3Server, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A local folder of small real videos in two classes, and its URL."""
    pytest.importorskip("av", reason="the video tests write and decode videos with PyAV (pip install 'naiad[test]')")
    from tests.video_data import write_video

    root = tmp_path_factory.mktemp("videos") / "train"
    for n, (name, k) in enumerate([("archery", 0), ("archery", 1), ("bowling", 0), ("bowling", 1), ("bowling", 2)]):
        write_video(root / name / f"{name}_{k}.mp4", 6 + n, width=32, height=24, gop=4)
    return root, upload_tree(server, root, "videos/train")


def clips() -> naiad.Transform:
    return naiad.decode_video("video", frames=3, stride=1, clip="center", size=16, crop="center")


@pytest.mark.timeout(240)
def test_a_video_folder_behind_a_url_decodes_in_process_workers(server, videos):
    from tests.video_data import frame_numbers

    root, url = videos
    local = naiad.read_videos(root, index_dir=False)
    src = naiad.read_videos(url, storage=storage(server), block_bytes=1)
    assert src.class_to_idx == local.class_to_idx == {"archery": 0, "bowling": 1} and len(src) == 5
    batches = run(naiad.DataLoader(src, batch_size=2, shuffle=True, seed=0, num_workers=2, transform=clips()))
    seen = {}
    for b in batches:
        assert b["video"].shape[1:] == (3, 3, 16, 16)
        for path, clip, frames, label in zip(b["path"], b["video"], b["video_frames"], b["label"], strict=True):
            assert (frame_numbers(clip.numpy()) == frames.numpy()).all(), path
            seen[path] = int(label)
    assert seen == {url + os.path.relpath(str(p), root): local.class_to_idx[p.parent.name] for p in root.rglob("*.mp4")}


@pytest.mark.timeout(120)
def test_videos_by_url_glob_and_by_a_list_of_urls(server, videos):
    root, url = videos
    files = sorted(root.rglob("*.mp4"))
    urls = [url + os.path.relpath(str(p), root) for p in files]
    matched = naiad.read_videos(f"s3://{BUCKET}/videos/train/*/*_1.mp4", storage=storage(server))
    assert matched.root == f"s3://{BUCKET}/videos/train" and matched.class_to_idx == {}
    got = run(naiad.DataLoader(matched, batch_size=5))[0]
    assert got["path"] == [u for u in urls if u.endswith("_1.mp4")] and "label" not in got
    listed = naiad.read_videos(urls[::-1], storage=storage(server))  # the list's order
    got = run(naiad.DataLoader(listed, batch_size=5))[0]
    assert got["path"] == urls[::-1] and got["video"] == [p.read_bytes() for p in files[::-1]]
    assert listed.storage.infos == {} and matched.storage.infos == {}
    with pytest.raises(SourceError, match=r"train/\*\.avi: the pattern matches no object"):
        naiad.read_videos(f"s3://{BUCKET}/videos/train/*.avi", storage=storage(server))
    with pytest.raises(SourceError, match=r"nope\.mp4: object or bucket not found"):
        naiad.read_videos([urls[0], f"s3://{BUCKET}/videos/nope.mp4"], storage=storage(server))
    with pytest.raises(ConfigError, match="both local files and URLs"):
        naiad.read_videos([urls[0], str(files[0])], storage=storage(server))
