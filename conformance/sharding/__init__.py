"""The sharding clause: each sample exactly once per epoch, across workers and ranks."""
