"""The pipeline over a naiad ``Source``: the epoch ``plan`` (blocks for each rank), the reads a
worker makes (``reads``), ``early`` reads while a source is still counted, a resume's ``restore``
and ``replay``, the ``shuffle`` buffer and its keyed ``permutation``, ``batching``, and the
``ledger`` of bad rows; ``batches.BatchStream`` drives them and ``pipeline.StreamPipeline`` is
the seam the loader sees."""
