"""One video re-encoded for ``naiad convert --keyframe-interval/--max-size`` (tools/convert_video.py):
its video stream to H.264 with a keyframe every N frames and a bounded shorter side, its audio
kept (NOTE [ Re-encoded audio ]).

NOTE [ Re-encoded audio ]
Every frame is decoded in presentation order and encoded again with libx264 (yuv420p, one
thread: videos re-encode in parallel). A constant-rate video's frame ``i`` is stamped ``i /
fps`` at its average rate, so the output's sample table is constant (its frames numbered from
the header, with no demux: NOTE [ Variable frame rate ] in ``media/video_stream.py``); a
variable-rate video's frames keep their own timestamps in its own time base, so the rate stays
variable and every frame keeps its number (its position) and its time.

The first audio stream is kept (others are dropped), on the video's clock: a constant-rate
video's frame 0 moves to time 0, and its audio moves with it (audio before frame 0 is cut); a
variable-rate video and its audio keep their times. The audio's packets are copied as they are
(a remux: no loss, no decode) when MP4 holds their codec as it is (``_MP4_AUDIO``: AAC, MP3,
AC-3, E-AC-3, ALAC, Opus, FLAC); any other (PCM, Vorbis, WMA, AMR...) is decoded and encoded to
AAC (FFmpeg's own encoder, at the source's sample rate where AAC has it, else 48 kHz; mono,
stereo, 5.1 and 7.1 kept, other layouts made stereo). A video without audio stays without.
"""

from __future__ import annotations

import io
from fractions import Fraction
from typing import Any

from naiad.errors import ConfigError
from naiad.media.video_stream import FrameTimes, frame_times, opened_video
from naiad.tools.video_files import pyav_for

__all__ = ["reencode"]

_PRESET = "veryfast"  # x264: within ~10% of "medium"'s size at these rates, several times faster
_MP4_AUDIO = frozenset({"aac", "mp3", "mp3float", "ac3", "eac3", "alac", "opus", "flac"})
_AAC_LAYOUTS = {1: "mono", 2: "stereo", 6: "5.1", 8: "7.1"}
_AAC_FRAME = 1024  # samples per AAC frame


def reencode(data: bytes, *, keyframe_interval: int | None = None, max_size: int | None = None, crf: int = 23) -> bytes | None:
    """One video re-encoded to H.264 in MP4, its audio kept (NOTE [ Re-encoded audio ]), or None
    when nothing asks for it (no ``keyframe_interval``, and the shorter side is at most ``max_size``).

    Raises:
        ValueError: the bytes are not a video FFmpeg reads, or hold no frame.
        ConfigError: PyAV is missing, or its FFmpeg has no libx264.
    """
    av = pyav_for("re-encoding videos (`naiad convert --keyframe-interval/--max-size`)")
    if "libx264" not in av.codecs_available:
        raise ConfigError("re-encoding videos needs FFmpeg's libx264, which this PyAV lacks; install PyAV's wheel "
                          "(pip install 'naiad[video]'), which bundles it.")
    target = _target(av, data, keyframe_interval, max_size)
    if target is None:
        return None
    size, times = target
    out = io.BytesIO()
    with opened_video(av, data) as (source, stream), av.open(out, mode="w", format="mp4") as sink:
        rate = times.rate or Fraction(25)
        encoder = _h264(sink, rate, size, keyframe_interval, crf)
        own_times = times.variable and times.time_base is not None
        if own_times:  # the frames keep their timestamps, in their own time base
            encoder.codec_context.time_base = times.time_base
        # The video's frame 0 moves to time 0 unless it keeps its own times: its audio moves with it.
        shift_s = Fraction(0) if own_times or not times.time_base else times.start * times.time_base
        audio = _Audio(av, sink, source.streams.audio[0], shift_s) if source.streams.audio else None
        pictures = _Pictures(encoder, size, own_times, 1 / Fraction(rate))
        for packet in source.demux(stream, *([audio.stream] if audio else [])):
            if packet.stream.index == stream.index:
                for frame in packet.decode():
                    sink.mux(pictures.encode(frame))
            elif audio is not None:
                audio.add(packet)
        if pictures.count == 0:
            raise ValueError("the video stream has no frames")
        sink.mux(encoder.encode(None))
        if audio is not None:
            audio.finish()
    return out.getvalue()


def _target(av: Any, data: bytes, keyframe_interval: int | None, max_size: int | None
            ) -> tuple[tuple[int, int], FrameTimes] | None:
    """The output's size and how the source's frames are numbered, or None when nothing asks
    for a re-encode."""
    with opened_video(av, data) as (source, stream):  # one thread a video: videos re-encode in parallel
        width, height = int(stream.codec_context.width), int(stream.codec_context.height)
        if width <= 0 or height <= 0:
            raise ValueError(f"the video stream has no frame size ({width}x{height})")
        shorter = min(width, height)
        if keyframe_interval is None and (max_size is None or shorter <= max_size):
            return None
        times = frame_times(source, stream)  # a demux where the header cannot say the rate is constant
    scale = min(1.0, max_size / shorter) if max_size is not None else 1.0
    # yuv420p halves the chroma planes: both sides must be even.
    return (max(2, int(round(width * scale / 2)) * 2), max(2, int(round(height * scale / 2)) * 2)), times


def _h264(sink: Any, rate: Fraction, size: tuple[int, int], keyframe_interval: int | None, crf: int) -> Any:
    """The output's libx264 stream: one thread, yuv420p, a keyframe every ``keyframe_interval``
    frames exactly (scene cuts off)."""
    encoder = sink.add_stream("libx264", rate=rate)
    encoder.width, encoder.height, encoder.pix_fmt = *size, "yuv420p"
    encoder.codec_context.thread_count = 1
    params = "scenecut=0"
    if keyframe_interval is not None:
        encoder.codec_context.gop_size = keyframe_interval
        params = f"keyint={keyframe_interval}:min-keyint={keyframe_interval}:scenecut=0"
    encoder.options = {"crf": str(crf), "preset": _PRESET, "x264-params": params}
    return encoder


class _Pictures:
    """Decoded frames resized and encoded, stamped ``i / fps`` or with their own timestamps."""

    def __init__(self, encoder: Any, size: tuple[int, int], own_times: bool, frame_s: Fraction) -> None:
        self.encoder, self.size, self.own_times, self.frame_s = encoder, size, own_times, frame_s
        self.count = 0
        self.last: int | None = None  # the last timestamp given, kept strictly increasing for the encoder

    def encode(self, frame: Any) -> list[Any]:
        picture = frame.reformat(width=self.size[0], height=self.size[1], format="yuv420p")
        if self.own_times and frame.pts is not None:
            pts = frame.pts if self.last is None else max(frame.pts, self.last + 1)
            picture.pts, picture.time_base = pts, self.encoder.codec_context.time_base
            self.last = pts
        else:
            picture.pts, picture.time_base = self.count, self.frame_s  # frame i shown at i / fps
        self.count += 1
        packets: list[Any] = self.encoder.encode(picture)
        return packets


class _Audio:
    """The source's first audio stream into ``sink``: its packets copied where MP4 holds its
    codec, else encoded to AAC; moved ``shift_s`` seconds earlier (NOTE [ Re-encoded audio ])."""

    def __init__(self, av: Any, sink: Any, stream: Any, shift_s: Fraction) -> None:
        self.av, self.sink, self.stream = av, sink, stream
        self.shift_s = shift_s
        codec = str(stream.codec_context.name)
        self.copy = codec in _MP4_AUDIO
        if self.copy:
            self.out = sink.add_stream_from_template(stream)
            return
        if "aac" not in av.codecs_available:
            raise ValueError(f"its audio ({codec}) does not go into MP4 as it is, and this FFmpeg has no AAC encoder "
                             "to re-encode it")
        source_rate = int(stream.codec_context.sample_rate or 0)
        self.rate = source_rate if source_rate in av.codec.Codec("aac", "w").audio_rates else 48000
        self.out = sink.add_stream("aac", rate=self.rate)
        self.out.layout = _AAC_LAYOUTS.get(stream.codec_context.layout.nb_channels, "stereo")
        self.resampler = av.AudioResampler(format="fltp", layout=self.out.layout, rate=self.rate, frame_size=_AAC_FRAME)
        self.next_pts: int | None = None  # in samples at self.rate

    def add(self, packet: Any) -> None:
        """One of the source's audio packets (an empty one flushes the decoder)."""
        if self.copy:
            if packet.size == 0 or packet.pts is None:
                return
            shift = int(round(self.shift_s / packet.time_base))
            if shift and packet.pts - shift + (packet.duration or 0) <= 0:
                return  # before the video's frame 0
            packet.pts -= shift
            if packet.dts is not None:
                packet.dts -= shift
            packet.stream = self.out
            self.sink.mux(packet)
            return
        for frame in packet.decode():
            self._encode(frame)

    def _encode(self, frame: Any) -> None:
        if self.next_pts is None:  # the first frame's time on the video's clock; continuous after it
            start = 0 if frame.pts is None else frame.pts * frame.time_base - self.shift_s
            self.next_pts = max(int(round(start * self.rate)), 0)
        for part in self.resampler.resample(frame):
            self._mux(part)

    def _mux(self, part: Any) -> None:
        assert self.next_pts is not None
        part.pts, part.time_base = self.next_pts, Fraction(1, self.rate)
        self.next_pts += part.samples
        self.sink.mux(self.out.encode(part))

    def finish(self) -> None:
        """Flush the AAC encoder (nothing to do for copied packets)."""
        if self.copy:
            return
        if self.next_pts is not None:
            for part in self.resampler.resample(None):
                self._mux(part)
        self.sink.mux(self.out.encode(None))
