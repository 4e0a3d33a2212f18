"""transfer.shared_memory: batch tensors arrive through shared memory created by
the worker that built them, not as bytes copied through a pipe.

Truth from outside the loader: the workers' pids come from the suite's
instrumented context, and each received tensor's shared segment names the pid
that created it (:mod:`pytest_workerstart.probes.tensor_origin`, verified on the
installed torch first). ``Tensor.is_shared()`` alone would pass a batch copied
through the pipe and moved to shared memory in the driver afterwards.
"""

import os

import pytest

from pytest_workerstart import parity
from pytest_workerstart.datasets import NestedMapDataset
from pytest_workerstart.probes import tensor_origin

check = pytest.mark.workerstart_check
N = 2


@check("transfer.shared_memory", "batch tensors arrive through shared memory")
def test_shared_memory(check_env):
    """batch tensors arrive through shared memory created by a worker of this loader, not copied through a pipe
    (and not copied and then moved with `share_memory_()` in the driver, which `is_shared()` alone would pass)

    Observed by: the creator pid in the name of the segment that maps each received tensor (`/proc/self/maps`;
    torch names segments `torch_<pid>_…` under both sharing strategies, verified on the installed torch first,
    skipped with the reason if not) against the worker pids the suite's context recorded
    """
    try:
        tensor_origin.verify()
    except RuntimeError as exc:
        pytest.skip(f"cannot attribute shared segments here: {exc}")
    ctx = check_env.context(N)
    loader = check_env.make(NestedMapDataset(8), num_workers=N, ctx=ctx,
                            parallelism=check_env.parallelism(N), batch_size=4)
    batch = next(iter(loader))
    tensors = {"x": batch["x"], "meta.pair.right": batch["meta"][1]["pair"].right}
    workers = {r.pid for r in ctx.records() if r.pid}
    found = {}
    for name, t in tensors.items():
        creator = tensor_origin.creator_pid(t)
        if not t.is_shared():
            found[name] = "copied (not in shared memory)"
        elif creator == os.getpid():
            found[name] = "copied, then moved to shared memory by the driver"
        elif creator not in workers:
            found[name] = f"in a segment created by pid {creator}, not by a worker ({sorted(workers)})"
    del batch, tensors, loader
    assert not found, "batch tensors did not arrive through the workers' shared memory: " + "; ".join(
        f"{k}: {v}" for k, v in found.items())


@check("transfer.shared_memory")
def test_shared_memory_at(check_env, ws_point):
    """A tensor torch's DataLoader delivers in shared memory arrives in a segment a worker created,
    at every point of the data path."""
    parity.judge_case(check_env, ws_point)
