"""Test configuration shared by every suite."""

import os
import sys

# `tests.helpers` is importable whether pytest runs from the repo root or elsewhere.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Block indexes (and other cached data) of the tests' files go to a folder of this run, not to
# the user's cache; child processes inherit it.
if "NAIAD_CACHE_DIR" not in os.environ:
    import tempfile

    os.environ["NAIAD_CACHE_DIR"] = tempfile.mkdtemp(prefix="naiad-test-cache-")
