"""The failure clause: a start that fails, a worker that dies, hangs or is interrupted while the
workers start, a forkserver or a driver that dies; the error names what failed and nothing is left."""
