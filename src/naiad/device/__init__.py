"""Getting batches onto the device: ``prefetch.DevicePrefetcher`` (pinning and copying on a side
CUDA stream, in a thread of its own) and the movers it runs (``transfer``)."""
