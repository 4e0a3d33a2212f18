"""transfer.shared_memory: batch tensors arrive through shared memory (their
storage is shared with the worker that built them), not as bytes copied
through a pipe. Observed on the received tensors: ``Tensor.is_shared()``."""

import pytest

from pytest_workerstart.fixtures.datasets import NestedMapDataset

check = pytest.mark.workerstart_check
N = 2


@check("transfer.shared_memory")
def test_shared_memory(check_env):
    loader = check_env.make(NestedMapDataset(8), num_workers=N, parallelism=N if check_env.parallel_start_here else None, batch_size=4)
    batch = next(iter(loader))
    tensors = {"x": batch["x"], "meta.pair.right": batch["meta"][1]["pair"].right}
    not_shared = [name for name, t in tensors.items() if not t.is_shared()]
    del batch, tensors, loader
    assert not not_shared, f"batch tensors were copied, not shared: {not_shared}"
