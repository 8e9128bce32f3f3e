"""``naiad inspect`` and ``naiad convert`` of videos behind s3:// URLs (a prefix of class folders,
a URL glob, a list of URLs), against a real S3 server on loopback (moto's server mode,
tests/s3server.py) behind the logging proxy: the same report and the same shards as from the
same tree on local disk; only the videos inspect looks at fetched; a prefix without videos named."""

from __future__ import annotations

import glob
import io
import json
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("moto.server", reason="the object storage tests need moto[server] (pip install 'naiad[test]')")
pytest.importorskip("s3fs", reason="the object storage tests need s3fs (pip install 'naiad[s3]')")
av = pytest.importorskip("av", reason="the video tests write and decode videos with PyAV (pip install 'naiad[test]')")

import naiad  # noqa: E402
from naiad.cli import main  # noqa: E402
from naiad.tools.inspect_video import inspect_videos  # noqa: E402
from naiad.tools.video_files import is_video_source  # noqa: E402
from tests.s3server import BUCKET, S3Server, own_server  # noqa: E402
from tests.video_data import write_video  # noqa: E402

pytestmark = pytest.mark.timeout(300)

CLASSES = {"archery": 3, "bowling": 2, "cycling": 3}
PER_VIDEO = ("label", "codec", "width", "height", "fps", "frames", "keyframe_interval", "b_frames", "error")


@pytest.fixture(scope="module")
def server() -> Iterator[S3Server]:
    """The module's server, behind the proxy that logs every request (``server.proxy``)."""
    yield from own_server()


@pytest.fixture(scope="module")
def tree(server: S3Server, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, dict[str, tuple[int, int]]]:
    """Class folders of small videos on disk and the same under ``s3://.../cli-videos/train``: the
    folder, its URL, and each sample key -> (label, frames)."""
    root = tmp_path_factory.mktemp("videos") / "train"
    expected = {}
    n = 0
    for label, (name, count) in enumerate(CLASSES.items()):
        for k in range(count):
            frames = 6 + 3 * n
            write_video(root / name / f"{name}.{k}.mp4", frames, width=64 + 16 * (n % 2), height=48, gop=4 + n)
            expected[f"{name}/{name}_{k}"] = (label, frames)
            n += 1
    (root / "bowling" / "bowling.9.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42 not a video" * 4)  # named as bad
    for path in sorted(root.rglob("*.mp4")):
        server.put(f"cli-videos/train/{path.relative_to(root).as_posix()}", path.read_bytes())
    server.put("cli-novideo/train/cat/a.png", b"\x89PNG not read")
    return root, f"s3://{BUCKET}/cli-videos/train/", expected


def opts(server: S3Server) -> str:
    return json.dumps(server.options(server.proxy.endpoint, config_kwargs={"retries": {"max_attempts": 1},
                                                                            "connect_timeout": 2}))


def inspect_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["inspect", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def per_video(report: dict[str, Any], root: str) -> dict[str, tuple[Any, ...]]:
    """Each probe's per-video fields, by its path under ``root``."""
    return {p["path"][len(root):].lstrip("/"): tuple(p[f] for f in PER_VIDEO) for p in report["probes"]}


def video_gets(server: S3Server) -> list[str]:
    return [p for m, p, _ in server.proxy.requests if m == "GET" and p.split("?")[0].endswith(".mp4")]


def test_urls_are_video_sources_by_their_names() -> None:
    assert is_video_source("s3://bucket/train/") and is_video_source("s3://bucket/train")
    assert is_video_source("s3://bucket/clips/*.mp4") and is_video_source("s3://bucket/clip.MKV")
    assert is_video_source(["s3://bucket/a.mp4", "s3://bucket/b.avi"])
    assert not is_video_source("s3://bucket/train-*.parquet") and not is_video_source("s3://bucket/shards-{0..3}.tar")
    assert not is_video_source("s3://bucket/photo.jpg")


def test_inspect_of_a_prefix_reports_what_the_local_folder_reports(
        tree: tuple[Path, str, dict[str, tuple[int, int]]], server: S3Server, capsys: pytest.CaptureFixture[str]) -> None:
    root, url, _ = tree
    local = inspect_json(capsys, str(root), "--videos", "20")
    before = len(video_gets(server))
    remote = inspect_json(capsys, url, "--videos", "20", "--storage-options", opts(server))
    assert len(video_gets(server)) - before == 9  # each video fetched once, whole
    for field in ("videos", "total_bytes", "classes", "class_counts", "clip"):
        assert remote[field] == local[field], field
    assert remote["root"] == url.rstrip("/") and remote["videos"] == 9
    assert per_video(remote, remote["root"]) == per_video(local, local["root"])
    assert len(per_video(local, local["root"])) == 9
    bad = per_video(remote, remote["root"])["bowling/bowling.9.mp4"]
    assert bad[-1]  # the file that is not a video is named with its problem, not raised
    for key in ("decoded", "failed", "width", "height", "fps", "frames", "duration_s"):
        assert remote["totals"][key] == local["totals"][key], key

    # The words: each video's line as the local folder's, its name under the root.
    assert main(["inspect", str(root), "--videos", "20"]) == 0
    text_local = capsys.readouterr().out.splitlines()
    assert main(["inspect", url, "--videos", "20", "--storage-options", opts(server)]) == 0
    text_remote = capsys.readouterr().out.splitlines()
    video_lines = [i for i, line in enumerate(text_local) if "archery/archery.0.mp4" in line]
    assert video_lines and [text_remote[i].split()[:6] for i in video_lines] == [text_local[i].split()[:6]
                                                                               for i in video_lines]


def test_inspect_fetches_only_the_videos_it_looks_at(
        tree: tuple[Path, str, dict[str, tuple[int, int]]], server: S3Server, capsys: pytest.CaptureFixture[str]) -> None:
    _, url, _ = tree
    before = len(video_gets(server))
    report = inspect_json(capsys, url, "--videos", "3", "--storage-options", opts(server))
    assert report["videos"] == 9 and len(report["probes"]) == 3
    assert len(video_gets(server)) - before == 3
    # A URL glob and a list of URLs: read as a flat folder, without classes.
    flat = inspect_json(capsys, f"s3://{BUCKET}/cli-videos/train/archery/*.mp4", "--storage-options", opts(server))
    assert flat["videos"] == 3 and flat["classes"] == [] and all(p["error"] is None for p in flat["probes"])
    one = inspect_json(capsys, f"s3://{BUCKET}/cli-videos/train/cycling/cycling.1.mp4", "--storage-options", opts(server))
    assert one["videos"] == 1 and one["probes"][0]["frames"] == 6 + 3 * 6
    listed = inspect_videos([f"s3://{BUCKET}/cli-videos/train/cycling/cycling.1.mp4",
                             f"s3://{BUCKET}/cli-videos/train/archery/archery.0.mp4"], storage=json.loads(opts(server)))
    assert [p["frames"] for p in listed.probes] == [6 + 3 * 6, 6] and listed.root == f"s3://{BUCKET}/cli-videos/train"


def test_a_prefix_without_videos_is_named(tree: tuple[Path, str, dict[str, tuple[int, int]]], server: S3Server,
                                          capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    for command in (["inspect", f"s3://{BUCKET}/cli-novideo/train/"],
                    ["convert", f"s3://{BUCKET}/cli-novideo/train/", str(tmp_path / "out.tar")]):
        assert main([*command, "--storage-options", opts(server)]) == 1
        err = capsys.readouterr().err
        assert f"s3://{BUCKET}/cli-novideo/train" in err and "holds no video file" in err, err
        assert "name them with a glob" in err, err


def tar_members(pattern: str) -> dict[str, bytes]:
    out = {}
    for shard in sorted(glob.glob(pattern)):
        with tarfile.open(shard) as tar:
            for m in tar.getmembers():
                data = tar.extractfile(m)
                assert data is not None
                out[m.name] = data.read()
    return out


@pytest.mark.parametrize("flags", [[], ["--keyframe-interval", "4", "--max-size", "32"]], ids=["copied", "reencoded"])
def test_convert_of_a_prefix_writes_the_local_folders_shards(
        tree: tuple[Path, str, dict[str, tuple[int, int]]], server: S3Server, tmp_path: Path,
        flags: list[str]) -> None:
    root, url, expected = tree
    common = ["--shard-size", "64KiB", "--shuffle", "--seed", "2", "--on-bad-rows", "skip", "--quiet", *flags]
    assert main(["convert", str(root), str(tmp_path / "local" / "train.tar"), *common]) == 0
    assert main(["convert", url, str(tmp_path / "remote" / "train.tar"), "--storage-options", opts(server), *common]) == 0
    local = tar_members(str(tmp_path / "local" / "train-*.tar"))
    remote = tar_members(str(tmp_path / "remote" / "train-*.tar"))
    assert sorted(remote) == sorted(local)
    if not flags:  # copied: the same bytes, member for member
        assert remote == local
    manifest = json.loads((tmp_path / "remote" / "train.manifest.json").read_text())
    # A copy takes the file that is not a video as it is; a re-encode leaves it out, counted.
    assert (manifest["rows"], manifest["bad_rows"]) == ((8, 1) if flags else (9, 0))
    assert manifest["samples"]["classes"] == list(CLASSES) and manifest["source"]["paths"] == [url.rstrip("/")]
    labels = {name[:-4]: int(data) for name, data in remote.items() if name.endswith(".cls")}
    assert labels == {k: v[0] for k, v in expected.items()} | ({} if flags else {"bowling/bowling_9": 1})
    if not flags:
        return
    loader = naiad.DataLoader(naiad.read_webdataset(sorted(glob.glob(str(tmp_path / "remote" / "train-*.tar")))),
                              batch_size=4, transform=naiad.decode_video("mp4", frames=2, stride=1, size=16, crop="center"))
    seen: dict[str, int] = {}
    for batch in loader:
        for key, label in zip(batch["__key__"], batch["cls"], strict=True):
            assert key not in seen, f"{key} delivered twice"
            seen[key] = int(label)
    assert seen == {k: v[0] for k, v in expected.items()}
    frames = {}
    for name, data in remote.items():
        if name.endswith(".mp4"):
            with av.open(io.BytesIO(data)) as container:
                stream = container.streams.video[0]
                frames[name[:-4]] = sum(1 for p in container.demux(stream) if p.size)
                assert min(stream.codec_context.width, stream.codec_context.height) <= 32
    assert frames == {k: v[1] for k, v in expected.items()}
