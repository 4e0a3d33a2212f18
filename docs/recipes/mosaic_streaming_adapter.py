"""Run pytest-workerstart on mosaicml-streaming's ``StreamingDataLoader`` (0.13.0).

Unlike litdata's, streaming's loader is a thin subclass of torch's ``DataLoader``
(it counts yielded samples for ``state_dict()``) and takes any torch dataset, so
the suite can drive it directly:

    pytest --workerstart --workerstart-loader=streaming:StreamingDataLoader --workerstart-baseline=torch

This module says what that SPEC cannot: that the verdict is streaming's (its
version, not this file's), and that it has no parallel start (workers start one at
a time in torch's iterator), so the summary does not ask for a keyword:

    pytest --workerstart --workerstart-loader=mosaic_streaming_adapter:make --workerstart-baseline=torch

What the suite cannot judge here: streaming's own ``StreamingDataset`` (shard
download, its sample partitioning over ranks and workers, its shuffles) is a
dataset, and it needs MDS shards on disk; the suite hands the loader its own
datasets, so these checks see streaming's loader, not its dataset.
"""

from streaming import StreamingDataLoader


def make(dataset, **kwargs):
    return StreamingDataLoader(dataset, **kwargs)


make.__workerstart_package__ = "streaming"
make.__workerstart_capabilities__ = {"parallel_start": ()}
