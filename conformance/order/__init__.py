"""The order clause: registration order, per-worker seeds, the index streams over epochs and the
random streams user code draws from."""
