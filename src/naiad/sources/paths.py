"""What a source's ``paths`` name: files, glob patterns, folders and URLs, as a list of files."""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence
from typing import Union

from naiad.errors import ConfigError, SourceError
from naiad.sources.storage import Storage, is_remote, local_path

__all__ = ["PathLike", "expand_paths", "folder_files"]


PathLike = Union[str, "os.PathLike[str]", Sequence[Union[str, "os.PathLike[str]"]]]
"""A path, a glob pattern, or a list of paths/patterns."""


def expand_paths(paths: PathLike, storage: Storage | None = None) -> list[str]:
    """Turn a path, a glob or a list of them into a sorted-per-pattern list of existing files.

    A local folder stands for its data files (:func:`folder_files`). URLs
    (``s3://bucket/train-*.csv``) are listed through ``storage`` (its ``storage_options``);
    ``file://`` URLs become local paths.

    Raises:
        SourceError: a named file or object does not exist, or a pattern matches nothing.
        ConfigError: the URL's filesystem is not installed (naming the extra to install).
    """
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    if not items:
        raise ConfigError("`paths` must name at least one file, got an empty list.")
    out: list[str] = []
    for item in items:
        text = os.fspath(item)
        if is_remote(text):
            out.extend((storage or Storage()).expand(text))
            continue
        text = local_path(text)
        if glob.has_magic(text):
            matches = sorted(p for p in glob.glob(text, recursive=True) if os.path.isfile(p))
            if not matches:
                raise SourceError("the pattern matches no file.", path=text)
            out.extend(matches)
        elif os.path.isdir(text):
            out.extend(folder_files(text))
        elif not os.path.isfile(text):
            raise SourceError("file not found.", path=text)
        else:
            out.append(text)
    return out


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
