"""The prefetch clause: in-flight batches never exceed prefetch_factor x num_workers."""
