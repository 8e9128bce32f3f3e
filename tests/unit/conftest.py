"""Fixtures the unit tests share."""

from __future__ import annotations

import pytest


@pytest.fixture(params=["simplejpeg", "pillow"])
def decoder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test through each JPEG path: simplejpeg (when installed) and Pillow alone."""
    from naiad.media import images

    if request.param == "simplejpeg":
        pytest.importorskip("simplejpeg")
    else:
        monkeypatch.setattr(images, "simplejpeg", lambda: None)
    return str(request.param)
