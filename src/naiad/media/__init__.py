"""Decoding samples in batches: images (``decode_images``, ``images.normalize``) and audio
(``decode_audio``), as picklable batch transforms that decode on a small thread pool.

Pillow, simplejpeg and soundfile are extras (``naiad[images]``, ``naiad[audio]``): this package
imports without them and says what to install when a transform is made.
"""

from __future__ import annotations

from naiad.media import images
from naiad.media.audio import DecodeAudio, decode_audio
from naiad.media.images import DecodeImages, decode_images

__all__ = ["DecodeAudio", "DecodeImages", "decode_audio", "decode_images", "images"]
