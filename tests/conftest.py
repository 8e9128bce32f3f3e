"""Test configuration shared by every suite."""

import os
import sys

# `tests.helpers` is importable whether pytest runs from the repo root or elsewhere.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
