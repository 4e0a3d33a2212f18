"""pytest-workerstart: a pytest plugin and conformance suite for data loaders
that start worker processes. Importing this package never imports torch."""

__version__ = "0.1.0"
