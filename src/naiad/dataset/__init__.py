"""The pipelines over torch datasets: map-style (``MapPipeline``: index batches from
``sampling``, fetched a batch at a time by ``fetch``) and ``IterableDataset`` (``IterablePipeline``:
each worker walks its own iterator), with the worker-side handlers both use (``worker``)."""
