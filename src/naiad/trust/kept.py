"""Files naiad keeps between processes, read back as untrusted data: block indexes, member indexes,
folder listings.

NOTE [ Kept files ]
A kept index saves a scan, a header walk or a folder listing; it is never needed. So reading one
back takes no risk for it: a kept file is read only when

* it is a regular file (a FIFO planted under its name would block the read forever) of at most
  ``MAX_KEPT_BYTES``, read whole into memory once;
* it belongs to this user, or to an owner the user names in ``NAIAD_TRUST_INDEX_OWNERS`` (user
  names or ids, comma-separated, or ``*`` for any): on a shared data folder anyone who can write
  to its ``.naiad-index`` could otherwise choose which of your files become samples, and with
  which labels;
* it parses as what it claims: JSON for block indexes; for ``.npz`` files, NumPy arrays that are
  stored (not compressed), match their checksums, and whose headers' shapes agree with the bytes
  that follow them, so parsing one allocates no more than the file weighs (NumPy's own loader
  allocates what a member's header claims before reading it), never with pickle.

Anything else is a miss: the caller scans, walks or lists again, as it would with no kept file,
and the reason is logged once per process on the ``naiad`` logger (WARNING for a file refused
or implausible, which a user should know of; DEBUG for one that is merely absent). What the
arrays must then say (offsets inside the file, paths inside the folder, labels within the
classes) is checked by each reader (``ShardIndex.from_arrays``, ``KeptIndexes``, the image
folder's ``check_listing`` in listings.py), and anything implausible there is reported through :func:`miss`.
"""

from __future__ import annotations

import errno
import io
import logging
import os
import pwd
import stat
import threading
import zipfile
import zlib

import numpy as np

from naiad.process_state import per_process
from naiad.trust.npy_header import read_npy_header

__all__ = ["MAX_KEPT_BYTES", "load_npz", "miss", "parse_npz", "read_kept", "trusted_owner"]

MAX_KEPT_BYTES = 1 << 30
"""The largest kept file read back (a listing of ten million files is about 700 MB)."""

_LOG = logging.getLogger("naiad.kept")
# What this process has told, and its lock: a forked child gets its own (a lock held at the fork
# would never be released there).
_TOLD = per_process("naiad.trust.kept told", lambda: (threading.Lock(), set[tuple[str, str]]()))
_ALLOWED_KINDS = "biuUS"  # bools, integers, unsigned, fixed-width text and bytes: no objects, no floats needed


def miss(path: os.PathLike[str] | str, reason: str, *, level: int = logging.WARNING, what: str = "the kept file") -> None:
    """Log, once per process for each file and reason, why a kept file (``what``: the kept file,
    or the kept listing of a folder) was not used: it is made again."""
    key = (f"{what} {os.fspath(path)}", reason)
    lock, told = _TOLD.get()
    with lock:
        if key in told:
            return
        told.add(key)
    _LOG.log(level, "naiad: not using %s: %s; it is made again.", key[0], reason)


def trusted_owner(uid: int) -> bool:
    """Whether a kept file owned by ``uid`` may be read (NOTE [ Kept files ])."""
    if not hasattr(os, "geteuid") or uid == os.geteuid():
        return True
    named = os.environ.get("NAIAD_TRUST_INDEX_OWNERS", "")
    for who in (w.strip() for w in named.split(",")):
        if who == "*" or who == str(uid):
            return True
        if who:
            try:
                if pwd.getpwnam(who).pw_uid == uid:
                    return True
            except KeyError:
                continue
    return False


def read_kept(path: os.PathLike[str] | str, max_bytes: int = MAX_KEPT_BYTES) -> bytes | None:
    """The bytes of the kept file ``path``, or None when there is none or it may not be read
    (NOTE [ Kept files ]: not a regular file, too large, another user's); a refusal is logged."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        if exc.errno not in (errno.ENOENT, errno.ENOTDIR):
            miss(path, f"it cannot be opened ({exc.strerror})")
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            miss(path, "it is not a regular file")
            return None
        if not trusted_owner(st.st_uid):
            miss(path, f"it belongs to another user (uid {st.st_uid}); name them in NAIAD_TRUST_INDEX_OWNERS to use it")
            return None
        if st.st_size > max_bytes:
            miss(path, f"it holds {st.st_size:,} bytes, more than the {max_bytes:,} a kept file may")
            return None
        parts, offset = [], 0
        while offset < st.st_size:
            part = os.pread(fd, st.st_size - offset, offset)
            if not part:
                break
            parts.append(part)
            offset += len(part)
        return b"".join(parts)
    except OSError as exc:
        miss(path, f"it cannot be read ({exc.strerror})")
        return None
    finally:
        os.close(fd)


def load_npz(path: os.PathLike[str] | str, max_bytes: int = MAX_KEPT_BYTES) -> dict[str, np.ndarray] | None:
    """The arrays of the kept ``.npz`` file ``path`` (read-only views of its bytes), or None when
    there is none, it may not be read, or it is not a plain archive of plain arrays (NOTE [ Kept
    files ]); a refusal is logged."""
    data = read_kept(path, max_bytes)
    if data is None:
        return None
    try:
        return parse_npz(data)
    except Exception as exc:  # noqa: BLE001 - a damaged archive fails in many ways (zipfile's NotImplementedError for an unknown version...): all are a miss
        miss(path, f"it is not a readable archive of arrays ({type(exc).__name__}: {str(exc):.200})")
        return None


def parse_npz(data: bytes) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` archive held in ``data``, each a view of its bytes; every member
    stored, its dtype plain (no objects) and its shape matching its bytes.

    Raises:
        ValueError: (or zipfile.BadZipFile) anything else.
    """
    view = memoryview(data)
    out: dict[str, np.ndarray] = {}
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        for info in archive.infolist():
            if info.compress_type != zipfile.ZIP_STORED or info.file_size != info.compress_size:
                raise ValueError(f"member {info.filename!r} is compressed")
            if not info.filename.endswith(".npy"):
                raise ValueError(f"member {info.filename!r} is not an array")
            # The member's bytes, where its local header says they start (zipfile checks it).
            with archive.open(info) as member:
                head = member.read(min(info.file_size, 1 << 16))
            start = _data_offset(data, info)
            body = view[start:start + info.file_size]
            if bytes(body[:len(head)]) != head:
                raise ValueError(f"member {info.filename!r} is not where the archive says")
            if zlib.crc32(body) != info.CRC:  # zipfile checks it only on a read to the end
                raise ValueError(f"member {info.filename!r} does not match its checksum")
            out[info.filename[:-4]] = _array(body)
    return out


def _data_offset(data: bytes, info: zipfile.ZipInfo) -> int:
    """Where a stored member's bytes start: after its local header and that header's name and
    extra field (whose lengths may differ from the central directory's)."""
    at = info.header_offset
    local = data[at:at + 30]
    if len(local) < 30 or local[:4] != b"PK\x03\x04":
        raise ValueError(f"member {info.filename!r} has no local header")
    name_len = int.from_bytes(local[26:28], "little")
    extra_len = int.from_bytes(local[28:30], "little")
    start = at + 30 + name_len + extra_len
    if start + info.file_size > len(data):
        raise ValueError(f"member {info.filename!r} runs past the end of the file")
    return start


def _array(body: memoryview) -> np.ndarray:
    """One ``.npy`` member: its header read as a literal (never code, never by Python's parser:
    NOTE [ npy headers without ast ] in npy_header.py), then a view of the bytes after it, which
    must be exactly what the header's shape and dtype take."""
    f = io.BytesIO(body[: min(len(body), 1 << 16)])
    shape, fortran, dtype = read_npy_header(f)
    if dtype.hasobject or dtype.kind not in _ALLOWED_KINDS or fortran:
        raise ValueError(f"an array of {dtype}{' in Fortran order' if fortran else ''}")
    count = 1
    for n in shape:
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"an array of shape {shape}")
        count *= n
    offset = f.tell()
    if offset + count * dtype.itemsize != len(body):
        raise ValueError(f"an array of shape {shape} and {dtype} in {len(body) - offset:,} bytes")
    return np.frombuffer(body, dtype, count=count, offset=offset).reshape(shape)

