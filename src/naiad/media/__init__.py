"""Decoding samples in batches: images (``decode_images``, ``images.normalize``) and audio
(``decode_audio``), video clips (``decode_video``), as picklable batch transforms that decode on a small thread pool.

Pillow, simplejpeg, soundfile and PyAV are extras (``naiad[images]``, ``naiad[audio]``,
``naiad[video]``): this package
imports without them and says what to install when a transform is made.
"""

from __future__ import annotations

from naiad.media import images
from naiad.media.audio import DecodeAudio, decode_audio
from naiad.media.images import DecodeImages, decode_images
from naiad.media.video import DecodeVideo, decode_video

__all__ = ["DecodeAudio", "DecodeImages", "DecodeVideo", "decode_audio", "decode_images", "decode_video", "images"]
