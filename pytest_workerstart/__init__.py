"""pytest-workerstart: a pytest plugin and conformance suite for data loaders
that start worker processes. Importing this package never imports torch."""

__version__ = "0.1.0"


def __getattr__(name: str):
    # check_loader and its verdict without importing pytest's machinery until asked for
    if name in ("check_loader", "LoaderVerdict"):
        from pytest_workerstart import api

        return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
