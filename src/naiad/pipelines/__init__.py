"""The pipelines under naiad.DataLoader, one per kind of dataset (NOTE [ Pipeline seam ])."""

from __future__ import annotations

from naiad.pipelines.base import STATE_VERSION, LazyPass, Pipeline, PipelinePass, check_fields
from naiad.pipelines.delivered import DeliveryLog
from naiad.pipelines.iterable import IterablePipeline
from naiad.pipelines.mapstyle import MapPipeline
from naiad.pipelines.streaming import StreamPipeline

__all__ = [
    "STATE_VERSION",
    "DeliveryLog",
    "IterablePipeline",
    "LazyPass",
    "MapPipeline",
    "Pipeline",
    "PipelinePass",
    "StreamPipeline",
    "check_fields",
]
