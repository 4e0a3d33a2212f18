"""Run pytest-workerstart on litdata's ``StreamingDataLoader`` (litdata 0.2.76).

litdata's loader accepts only its own ``StreamingDataset``: an ``IterableDataset``
that reads optimized chunks from ``input_dir`` and splits them over workers itself.
The suite hands every loader plain torch datasets, so this adapter presents them
as a ``StreamingDataset``. litdata's loader, its collate wrapper, its iterator and
its worker handling run unchanged; only the data source is the suite's.

Worker assignment follows torch's map-style rule (batch k is computed by worker
k mod N), so order, digest and parity checks compare like with like. Shuffling
uses litdata's convention (a seed shared by all workers, plus the epoch), not
torch's sampler, so ``digest.torch_parity`` on shuffled cases is expected to differ.

    pytest --workerstart --workerstart-loader=litdata_adapter:make

(run from the directory holding this file, or put it on ``PYTHONPATH``.)
"""

import itertools

import torch
from litdata import StreamingDataLoader, StreamingDataset
from torch.utils.data import IterableDataset, default_convert, get_worker_info


class SuiteStreamingDataset(StreamingDataset):
    """A suite dataset (and sampler) behind the setters litdata's loader calls."""

    def __init__(self, dataset, sampler=None, seed: int = 42):
        # Deliberately not StreamingDataset.__init__: it needs an input_dir of chunks.
        self.dataset = dataset
        self.sampler = sampler
        self.seed = seed
        self.batch_size = 1
        self.num_workers = 0
        self.shuffle = False
        self.drop_last = False
        self.current_epoch = 1
        self.item_loader = None  # read by litdata only to refuse fork with its Parquet loader

    def set_shuffle(self, shuffle):
        self.shuffle = bool(shuffle)

    def set_drop_last(self, drop_last):
        self.drop_last = bool(drop_last)

    def set_batch_size(self, batch_size):
        self.batch_size = batch_size or 1

    def set_num_workers(self, num_workers):
        self.num_workers = num_workers

    def set_epoch(self, current_epoch):
        self.current_epoch = current_epoch

    def reset_state_dict(self):
        pass

    def __len__(self):
        return len(self.dataset)

    def get_len(self, num_workers, batch_size):
        return len(self.dataset)

    def __iter__(self):
        if isinstance(self.dataset, IterableDataset):  # the suite's iterable datasets shard themselves
            # litdata's loader hands drop_last to its dataset, not to torch's batching: drop each
            # worker's last partial batch here, as torch does for an iterable dataset
            items = iter(self.dataset)
            while True:
                batch = list(itertools.islice(items, self.batch_size))
                if batch and (len(batch) == self.batch_size or not self.drop_last):
                    yield from batch
                if len(batch) < self.batch_size:
                    return
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        order = list(self.sampler) if self.sampler is not None else list(range(len(self.dataset)))
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed + self.current_epoch)
            order = torch.randperm(len(order), generator=g).tolist()
        b = self.batch_size
        batches = [order[k:k + b] for k in range(0, len(order), b)]
        if self.drop_last and batches and len(batches[-1]) < b:
            batches.pop()
        for batch in batches[worker::workers]:
            for index in batch:
                yield self.dataset[index]


def _unbatched(items):
    """torch's batch_size=None: each item alone, converted but not collated."""
    return default_convert(items[0])


def make(dataset, *, sampler=None, batch_size=1, collate_fn=None, **kwargs):
    # litdata's loader needs a batch size (it asserts one) and refuses sampler= (an
    # IterableDataset): batch_size=None becomes batches of one item, unwrapped, and the
    # sampler's indices (e.g. DistributedSampler's rank share) feed the dataset instead.
    if batch_size is None:
        batch_size, collate_fn = 1, _unbatched
    return StreamingDataLoader(SuiteStreamingDataset(dataset, sampler), batch_size=batch_size,
                               collate_fn=collate_fn, **kwargs)


# litdata starts workers through torch's DataLoader, one at a time: no parallelism keyword.
make.__workerstart_package__ = "litdata"  # the verdict records litdata's version, not this file's
make.__workerstart_capabilities__ = {"parallel_start": ()}
