"""The memory clause: a persistent worker's memory stays flat over epochs."""
