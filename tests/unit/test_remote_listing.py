"""A prefix's listing is the server's answer: checked before it names a sample (trust/listings.py,
NOTE [ Remote folder listing ]), with crafted listings a real server would not send; the common
folder of a list of URLs; the bounded window of a read's concurrent fetches."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from naiad.errors import ConfigError, SourceError
from naiad.sources.readahead import io_map
from naiad.sources.remote_listing import url_folder
from naiad.trust.listings import MAX_LISTED_BYTES, checked_entries, name_problem

URL = "s3://bucket/train"


def obj(size: Any = 3, **kw: Any) -> dict[str, Any]:
    return {"type": "file", "size": size, "ETag": '"abc"', **kw}


def test_a_plain_listing_gives_its_objects_below_the_prefix_and_its_folder_markers() -> None:
    objects, markers = checked_entries({
        "bucket/train/": obj(0),                   # the prefix's own marker
        "bucket/train/cat/1.png": obj(5),
        "bucket/train/dog/": obj(0),               # a folder made in a console
        "bucket/train/dog/sub/": obj(0),
        "bucket/train/top.png": obj(7),
    }, "bucket/train", URL)
    assert {k: v["size"] for k, v in objects.items()} == {"cat/1.png": 5, "top.png": 7}
    assert markers == ["dog", "dog/sub"]


@pytest.mark.parametrize(("name", "said"), [
    ("bucket/train2/x.png", "outside the prefix"),          # a sibling sharing the prefix's letters
    ("other/train/x.png", "outside the prefix"),            # another bucket
    ("bucket/x.png", "outside the prefix"),
    ("bucket/train", "outside the prefix"),                 # the prefix itself as an object
    ("bucket/train/a/../../../etc/passwd", r"'\.\.' component"),
    ("bucket/train/a/./x.png", r"'\.' or '\.\.' component"),
    ("bucket/train/..", r"'\.\.' component"),
    ("bucket/train/a//x.png", "an empty component"),
    ("bucket/train//x.png", "an empty component"),
    ("bucket/train/a\0.png", "a NUL"),
    ("bucket/train/a//", "an empty component"),             # a marker of an empty folder name
])
def test_a_hostile_name_refuses_the_listing_naming_the_url(name: str, said: str) -> None:
    entries = {"bucket/train/cat/1.png": obj(), name: obj()}
    with pytest.raises(SourceError, match=rf"^{URL}: the listing .*{said}.*refused"):
        checked_entries(entries, "bucket/train", URL)


@pytest.mark.parametrize("size", [-1, MAX_LISTED_BYTES + 1, True, 1.5, "12", None])
def test_an_impossible_size_refuses_the_listing(size: Any) -> None:
    with pytest.raises(SourceError, match=r"the size .* not a byte count: refused"):
        checked_entries({"bucket/train/cat/1.png": obj(size)}, "bucket/train", URL)


def test_a_plain_name_has_no_problem() -> None:
    assert name_problem("cat/sub/x.y.png") is None and name_problem("..x/y..") is None
    assert name_problem("") == "a name with an empty component"


def test_the_common_folder_of_urls_is_at_least_a_bucket() -> None:
    assert url_folder(["s3://b/v/a/1.mp4", "s3://b/v/b/2.mp4"]) == "s3://b/v"
    assert url_folder(["s3://b/v/a/1.mp4"]) == "s3://b/v/a"
    assert url_folder(["s3://b/1.mp4", "s3://b/v/2.mp4"]) == "s3://b"
    with pytest.raises(ConfigError, match="several buckets"):
        url_folder(["s3://b/1.mp4", "s3://c/2.mp4"])
    with pytest.raises(ConfigError, match="several protocols"):
        url_folder(["s3://b/1.mp4", "gs://b/2.mp4"])


def test_io_map_keeps_the_order_and_at_most_its_window_in_flight() -> None:
    lock, running, most = threading.Lock(), [0], [0]

    def slow(x: int) -> int:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.002 * (x % 3))
        with lock:
            running[0] -= 1
        return x * x

    assert io_map(slow, list(range(40)), window=3) == [x * x for x in range(40)]
    assert 1 <= most[0] <= 3


def test_io_map_raises_the_first_failure_in_order() -> None:
    def fail_on_odd(x: int) -> int:
        if x % 2:
            raise ValueError(f"bad {x}")
        return x

    with pytest.raises(ValueError, match="bad 1"):
        io_map(fail_on_odd, list(range(10)), window=4)
