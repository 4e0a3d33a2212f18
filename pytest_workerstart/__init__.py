"""pytest-workerstart: a pytest plugin and conformance suite for data loaders
that start worker processes. Importing this package never imports torch."""

from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("pytest-workerstart")  # pyproject.toml is the one place it is set
except _metadata.PackageNotFoundError:  # a checkout on sys.path without an install
    __version__ = "0+unknown"


def __getattr__(name: str):
    # check_loader and its verdict without importing pytest's machinery until asked for
    if name in ("check_loader", "LoaderVerdict"):
        from pytest_workerstart import api

        return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
