"""Seed files of the readers of samples and tokens, the damage the fuzz tests do to their headers,
and the rules each read must obey, one module a kind of input:

* ``tars``: tar shards (ustar, GNU, pax, ``webdataset.TarWriter``) and their header damage;
* ``kept``: the indexes and listings naiad keeps (member indexes, image folders' listings, block
  indexes), damaged or rewritten;
* ``tables``: Parquet tables of ``{bytes, path}`` structs naming files by hostile paths, local
  and on ``memory://``;
* ``media``: images and audio clips with damaged header fields;
* ``tokens``: token files (``.npy``, modded-nanogpt shards, flat ``.bin``);
* ``rules``: what every case obeys (the case time, workers left behind), and
  ``damage``: the damage the kinds share;
* ``runner``: the child process that measures a batch's memory (NOTE [ Memory runner ] there).

Each ``*_case(pick, folder)`` draws one damaged input from ``pick`` (a ``random.Random``, or the
tests' adapter over hypothesis's draws), reads it, and fails with an AssertionError naming the
input when the read breaks a rule: it must end in the right data or in a naiad error that names
the file (or the sample), within ``CASE_S`` seconds. :data:`CASES` names every kind.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from tests.fuzz.samples.damage import write_file
from tests.fuzz.samples.kept import (
    block_index_case,
    kept_index_case,
    listing_case,
    replay_kept,
    the_kept_file,
)
from tests.fuzz.samples.media import (
    AUDIO_FORMATS,
    IMAGE_FORMATS,
    audio_case,
    audio_seed,
    decode_clip,
    decode_image,
    image_case,
    image_seed,
)
from tests.fuzz.samples.rules import CASE_S, SECRET, Pick, settled
from tests.fuzz.samples.tables import MEDIA, media_files, table_case
from tests.fuzz.samples.tars import (
    TAR_NAMES,
    TAR_WRITERS,
    member_bytes,
    read_shards,
    reference_samples,
    same_samples,
    tar_case,
    tar_shard,
)
from tests.fuzz.samples.tokens import (
    TOKENS,
    read_windows,
    reference_windows,
    token_case,
    token_seed,
)

CASES: dict[str, Callable[[Pick, str], None]] = {
    "tar": tar_case, "kept_index": kept_index_case, "listing": listing_case, "block_index": block_index_case,
    "table": functools.partial(table_case, remote=False), "remote_table": functools.partial(table_case, remote=True),
    "image": image_case, "audio": audio_case, "tokens": token_case,
}
"""Every kind of case by name, as the memory runner reads them."""

__all__ = [
    "AUDIO_FORMATS", "CASES", "CASE_S", "IMAGE_FORMATS", "MEDIA", "SECRET", "TAR_NAMES", "TAR_WRITERS", "TOKENS",
    "Pick", "audio_case", "audio_seed", "block_index_case", "decode_clip", "decode_image", "image_case",
    "image_seed", "kept_index_case", "listing_case", "media_files", "member_bytes", "read_shards", "read_windows",
    "reference_samples", "reference_windows", "replay_kept", "same_samples", "settled", "table_case", "tar_case",
    "tar_shard", "the_kept_file", "token_case", "token_seed", "write_file",
]
