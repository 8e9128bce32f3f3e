"""What a source's ``paths`` name: files, glob patterns, folders and URLs, as a list of files."""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Sequence
from typing import Union

from naiad.errors import ConfigError, SourceError
from naiad.sources.storage import Storage, is_remote, local_path

__all__ = ["PathLike", "expand_braces", "expand_paths", "folder_files"]


PathLike = Union[str, "os.PathLike[str]", Sequence[Union[str, "os.PathLike[str]"]]]
"""A path, a glob pattern, or a list of paths/patterns."""


def expand_paths(paths: PathLike, storage: Storage | None = None) -> list[str]:
    """Turn a path, a glob or a list of them into a sorted-per-pattern list of existing files.

    Brace groups are expanded first, as a shell and WebDataset expand them
    (:func:`expand_braces`): ``train-{0000..0099}.tar`` names 100 files, in that order, each of
    which must exist (a name with braces that is itself a file is read as it is). A local folder
    stands for its data files (:func:`folder_files`). URLs
    (``s3://bucket/train-*.csv``) are listed through ``storage`` (its filesystem options);
    ``file://`` URLs become local paths.

    Raises:
        SourceError: a named file or object does not exist, or a pattern matches nothing.
        ConfigError: the URL's filesystem is not installed (naming the extra to install).
    """
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    if not items:
        raise ConfigError("`paths` must name at least one file, got an empty list.")
    expanded = [name for item in items for name in _braced(os.fspath(item))]
    remote = [t for t in expanded if is_remote(t) and not glob.has_magic(t)]
    if len(remote) > 1:  # one listing per folder, not a request per object (shards are many)
        (storage or Storage()).expand_many(remote)
    out: list[str] = []
    for text in expanded:
        out.extend((storage or Storage()).expand(text) if is_remote(text) else _local_files(local_path(text)))
    return out


def _braced(text: str) -> list[str]:
    """The names ``text``'s brace groups stand for; ``text`` itself when it has none, or when it
    is a local file whose name has braces."""
    many = expand_braces(text)
    if len(many) > 1 and not (not is_remote(text) and os.path.isfile(local_path(text))):
        return many
    return [text]


def _local_files(text: str) -> list[str]:
    """The files a local path, glob or folder names."""
    if glob.has_magic(text):
        matches = sorted(p for p in glob.glob(text, recursive=True) if os.path.isfile(p))
        if not matches:
            raise SourceError("the pattern matches no file.", path=text)
        return matches
    if os.path.isdir(text):
        return folder_files(text)
    if not os.path.isfile(text):
        raise SourceError("file not found.", path=text)
    return [text]


def folder_files(folder: str) -> list[str]:
    """The data files of a local folder, sorted: its files, not its subfolders, less the names
    that are not data by convention (hidden ``.*``, ``_SUCCESS`` and other ``_*`` markers, and
    the manifests ``naiad convert`` writes), as Spark, pandas and Hugging Face read a folder.

    Raises:
        SourceError: the folder holds no such file.
    """
    names = sorted(
        n for n in os.listdir(folder)
        if not n.startswith((".", "_")) and n != "manifest.json" and not n.endswith(".manifest.json")
        and os.path.isfile(os.path.join(folder, n))
    )
    if not names:
        raise SourceError("the folder holds no data file (hidden, _* and manifest files are skipped).", path=folder)
    return [os.path.join(folder, n) for n in names]


_BRACE = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"(-?\d+)\.\.(-?\d+)")


def expand_braces(text: str) -> list[str]:
    """The names a brace pattern stands for, in order, as a shell (and the ``braceexpand``
    package WebDataset uses) expands them: ``{0000..0003}`` counts (zero-padded to the width
    written), ``{a,b}`` lists; a group of neither kind stays as it is.

    Example:
        >>> expand_braces("s3://b/train-{08..10}.tar")
        ['s3://b/train-08.tar', 's3://b/train-09.tar', 's3://b/train-10.tar']
        >>> expand_braces("{a,b}-{1..2}.tar")
        ['a-1.tar', 'a-2.tar', 'b-1.tar', 'b-2.tar']
    """
    m = _BRACE.search(text)
    if m is None:
        return [text]
    head, body, tail = text[: m.start()], m.group(1), text[m.end():]
    r = _RANGE.fullmatch(body)
    if r is not None:
        a, b = r.group(1), r.group(2)
        lo, hi = int(a), int(b)
        padded = any(len(x.lstrip("-")) > 1 and x.lstrip("-").startswith("0") for x in (a, b))
        width = max(len(a), len(b)) if padded else 0
        step = 1 if hi >= lo else -1
        choices = [str(i).zfill(width) for i in range(lo, hi + step, step)]
    elif "," in body:
        choices = body.split(",")
    else:  # not a pattern: keep the braces, expand what follows
        return [head + "{" + body + "}" + rest for rest in expand_braces(tail)]
    rests = expand_braces(tail)
    return [head + c + rest for c in choices for rest in rests]
