"""naiad.decode_video on real videos written here with PyAV (H.264 with B-frames where PyAV's FFmpeg
has libx264): the delivered frame numbers checked against the frames' pixels, clip placement,
short videos padded, the shared geometry, bounds and videos that do not decode."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import naiad
from naiad.errors import ConfigError, DecodeError
from naiad.media.video import DecodeVideo
from tests.video_data import frame_numbers, write_audio_only, write_video

pytest.importorskip("av", reason="the video tests write and decode videos with PyAV (pip install 'naiad[test]')")


@pytest.fixture(scope="module")
def videos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    root = tmp_path_factory.mktemp("videos")
    return {
        "long": write_video(root / "long.mp4", 30).read_bytes(),
        "short": write_video(root / "short.mp4", 5, width=32, height=24).read_bytes(),
        "tall": write_video(root / "tall.mp4", 12, width=48, height=64).read_bytes(),
    }


def decode(transform: DecodeVideo, *values: bytes, keys: list[int] | None = None) -> dict[str, Any]:
    batch = {"video": list(values), "__index__": np.array(keys or range(len(values)), np.int64),
             "path": [f"v{i}.mp4" for i in range(len(values))]}
    return transform(batch)


def test_a_center_clip_is_uint8_b_t_c_h_w_and_its_frames_are_the_middle_ones(videos):
    out = decode(naiad.decode_video("video", frames=4, stride=3, clip="center", size=(24, 32), resize="stretch"),
                 videos["long"])
    assert out["video"].shape == (1, 4, 3, 24, 32) and out["video"].dtype == torch.uint8
    assert out["video_frames"].dtype == torch.int64
    assert out["video_frames"].tolist() == [[10, 13, 16, 19]]  # (30 - 10) // 2 = 10
    assert frame_numbers(out["video"].numpy()).tolist() == [[10, 13, 16, 19]]


def test_uniform_clips_span_the_video_from_its_first_frame_to_its_last(videos):
    out = decode(naiad.decode_video("video", frames=3, stride=2, clip="uniform", clips_per_video=3, size=16,
                                    crop="center"), videos["long"])
    assert out["video"].shape == (1, 3, 3, 3, 16, 16)
    assert out["video_frames"].tolist() == [[[0, 2, 4], [12, 14, 16], [25, 27, 29]]]
    assert (frame_numbers(out["video"].numpy()) == out["video_frames"].numpy()).all()


def test_random_clips_are_keyed_by_seed_epoch_and_sample_and_match_their_pixels(videos):
    transform = naiad.decode_video("video", frames=4, stride=2, clip="random", size=16, crop="center", seed=5)
    first = decode(transform, videos["long"], videos["long"], videos["long"], keys=[3, 4, 5])
    again = decode(transform, videos["long"], keys=[4])  # another batch, the same sample
    assert torch.equal(first["video_frames"][1:2], again["video_frames"])
    assert torch.equal(first["video"][1:2], again["video"])
    assert (frame_numbers(first["video"].numpy()) == first["video_frames"].numpy()).all()
    starts = {int(decode(transform, videos["long"], keys=[k])["video_frames"][0, 0]) for k in range(12)}
    assert len(starts) > 3 and max(starts) <= 30 - 7  # many starts, each clip inside the video
    transform.set_epoch(1)
    other = [int(decode(transform, videos["long"], keys=[k])["video_frames"][0, 0]) for k in range(12)]
    assert other != [int(decode(naiad.decode_video("video", frames=4, clip="random", seed=5), videos["long"],
                                keys=[k])["video_frames"][0, 0]) for k in range(12)]


def test_a_video_shorter_than_its_clip_repeats_its_last_frame_and_says_so(videos):
    out = decode(naiad.decode_video("video", frames=4, stride=2, clip="random", seed=0), videos["short"])
    assert out["video_frames"].tolist() == [[0, 2, 4, 4]]
    clip = out["video"][0].numpy()
    assert clip.shape == (4, 3, 24, 32)  # its own size without `size`
    assert frame_numbers(clip).tolist() == [0, 2, 4, 4]


def test_frames_share_decode_images_geometry_and_one_crop_and_flip_per_video(videos):
    out = decode(naiad.decode_video("video", frames=3, stride=1, clip="center", size=20, resize=24, crop="center"),
                 videos["tall"])
    assert out["video"].shape == (1, 3, 3, 20, 20)
    listed = decode(naiad.decode_video("video", frames=2, stride=1, clip="center", resize=24), videos["tall"])
    assert isinstance(listed["video"], list) and listed["video"][0].shape == (2, 3, 32, 24)  # the shorter side 24
    # A random crop and flip are the same for every frame of a clip: equal frames stay equal.
    flat = decode(naiad.decode_video("video", frames=4, stride=1, clip="center", size=16, crop="random", flip=True,
                                     seed=1), videos["long"], keys=[7])
    video = flat["video"][0].numpy().astype(np.int16)
    assert (np.abs(video[:, 1] - 128) <= 4).all()  # the green plane is flat: no padding, no stray crop


def test_videos_that_do_not_decode_raise_one_decode_error_naming_each_file(videos, tmp_path):
    audio = write_audio_only(tmp_path / "audio.mp4").read_bytes()
    empty = write_audio_only(tmp_path / "empty.mp4", empty_video=True).read_bytes()  # a video stream, no frames
    values = [videos["long"], b"\x00not a video" * 50, videos["long"][: len(videos["long"]) // 3], audio, empty]
    transform = naiad.decode_video("video", frames=2, stride=1, clip="center", size=8, crop="center")
    with pytest.raises(DecodeError) as info:
        decode(transform, *values)
    error = info.value
    assert 0 not in error.rows and {1, 3, 4} <= set(error.rows)  # a truncated file may still give frames
    message = str(error)
    assert "path 'v1.mp4'" in message and "path 'v3.mp4'" in message and "no video stream" in message
    assert error.kept is not None and error.kept["video"].shape[0] == 5 - len(error.rows)
    assert error.kept["path"][0] == "v0.mp4"


def test_clips_over_the_pixel_budget_are_refused_before_decoding(videos):
    transform = naiad.decode_video("video", frames=16, stride=1, clip="center", size=32, crop="center",
                                   max_pixels=15 * 32 * 32)
    with pytest.raises(DecodeError, match="over the decode's budget .*decode_video' `max_pixels`"):
        decode(transform, videos["long"])


def test_bad_arguments_are_config_errors():
    for kwargs in ({"frames": 0}, {"stride": -1}, {"clip": "middle"}, {"clips_per_video": 0}, {"crop": "center"}):
        with pytest.raises(ConfigError):
            naiad.decode_video("video", **kwargs)
    assert naiad.decode_video("video").placement().runs == "workers"
    assert naiad.decode_video("video", frames=2, size=4, crop="center").placement().decoded_row_bytes == 2 * 3 * 16


def test_a_missing_pyav_says_how_to_install_it(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_av(name: str, *args: object, **kwargs: object) -> object:
        if name == "av":
            raise ImportError("No module named 'av'")
        return real(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", no_av)
    with pytest.raises(ConfigError, match=r"pip install 'naiad\[video\]'"):
        naiad.decode_video("video")


def test_the_video_folder_is_labelled_as_imagefolder(tmp_path: Path):
    for name, frames in (("b_class/x.mp4", 3), ("a_class/y.MP4", 3), ("a_class/sub/z.webm", 0)):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"\x00" * (frames + 1))
    (tmp_path / "a_class" / "notes.txt").write_text("not a video")
    source = naiad.read_videos(tmp_path)
    assert source.class_to_idx == {"a_class": 0, "b_class": 1} and len(source) == 3
    assert [f.name for f in source.schema()] == ["video", "label", "path"]
    (tmp_path / "c_class").mkdir()
    (tmp_path / "c_class" / "notes.txt").write_text("no video here")
    with pytest.raises(naiad.SourceError, match="the class folder 'c_class' holds no video file"):
        naiad.read_videos(tmp_path, index_dir=False)


def test_a_glob_or_a_list_of_videos_is_read_flat_without_labels(tmp_path: Path):
    for name in ("a/1.mp4", "a/2.mp4", "b/3.mkv"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"\x00" * 4)
    by_glob = naiad.read_videos(str(tmp_path / "*" / "*.mp4"))
    assert len(by_glob) == 2 and by_glob.class_to_idx == {}
    assert [f.name for f in by_glob.schema()] == ["video", "path"]
    listed = naiad.read_videos([tmp_path / "b" / "3.mkv", tmp_path / "a" / "1.mp4"])
    batch = next(iter(naiad.DataLoader(listed, batch_size=2)))
    assert batch["path"] == [str(tmp_path / "b" / "3.mkv"), str(tmp_path / "a" / "1.mp4")]
    with pytest.raises(naiad.SourceError, match="matches no file"):
        naiad.read_videos(str(tmp_path / "*.avi"))
    with pytest.raises(naiad.SourceError, match="not a file"):
        naiad.read_videos([tmp_path / "a" / "9.mp4"])


def test_only_the_frames_from_the_keyframe_before_each_clip_to_its_last_are_decoded(tmp_path, monkeypatch):
    from naiad.media import video

    data = write_video(tmp_path / "long.mp4", 120, width=32, height=24, gop=8).read_bytes()
    decoded: list[int] = []
    real = video._decode_range

    class CountedPacket:
        def __init__(self, packet: Any) -> None:
            self.packet = packet

        def __getattr__(self, name: str) -> Any:
            return getattr(self.packet, name)

        def decode(self) -> Any:
            for frame in self.packet.decode():
                decoded.append(frame.pts)
                yield frame

    class Counting:
        def __init__(self, container: Any) -> None:
            self.container = container

        def demux(self, stream: Any) -> Any:
            return map(CountedPacket, self.container.demux(stream))

    def counted(container: Any, *args: Any) -> Any:
        return real(Counting(container), *args)

    monkeypatch.setattr(video, "_decode_range", counted)
    out = decode(naiad.decode_video("video", frames=4, stride=1, clip="uniform", clips_per_video=3), data)
    assert out["video_frames"][0, :, 0].tolist() == [0, 58, 116]
    assert (frame_numbers(out["video"][0].numpy()) == out["video_frames"][0].numpy() % 32).all()  # red wraps at 32
    # Each clip: at most a keyframe interval (8) before it, its 4 frames, and B-frame reordering.
    assert len(decoded) <= 3 * (8 + 4 + 2), len(decoded)

    # A sparse clip (every 6th frame) of a video with one keyframe: the frames between that no
    # frame refers to (B-frames) are not decoded, and the delivered ones are still exact.
    sparse = write_video(tmp_path / "sparse.mp4", 48, width=32, height=24, gop=48).read_bytes()
    decoded.clear()
    out = decode(naiad.decode_video("video", frames=5, stride=6, clip="center"), sparse)
    numbers = out["video_frames"][0].numpy()
    assert (frame_numbers(out["video"][0].numpy()) == numbers % 32).all()
    assert len(decoded) < numbers[-1] + 1, (len(decoded), numbers.tolist())


def test_a_seek_that_lands_past_the_clip_decodes_the_video_again_from_its_start(tmp_path, monkeypatch):
    from naiad.media import video

    data = write_video(tmp_path / "v.mp4", 60, width=32, height=24, gop=8).read_bytes()
    real = video._decode_range
    calls: list[int] = []

    def past_once(container: Any, stream: Any, wanted: set[int], first: int, *args: Any) -> Any:
        calls.append(first)
        if len(calls) == 1:
            return None  # as a seek that landed past the clip's first frame (a lying index) says
        return real(container, stream, wanted, first, *args)

    monkeypatch.setattr(video, "_decode_range", past_once)
    out = decode(naiad.decode_video("video", frames=4, stride=2, clip="center"), data)
    numbers = out["video_frames"][0].numpy()
    assert numbers.tolist() == [26, 28, 30, 32]  # the centre clip: (60 - 7) // 2
    assert (frame_numbers(out["video"][0].numpy()) == numbers % 32).all()
    assert calls[1] == -1  # the second decode ran from the start, reopened
