"""leaks.clean_exit: nothing is left after the ordinary ways an epoch ends.

Each way is its own case: full exhaustion, early ``break`` + ``del``, an
exception raised by the training loop itself, and persistent workers shut
down by deleting the loader. Batches are released before measuring: an fd
backing a batch the test still holds is not a leak. Processes and threads have
``--workerstart-exit-timeout`` (default 5 s) to go once the loader is done.
"""

import pytest

from pytest_workerstart.fixtures.datasets import WorkerTagDataset

check = pytest.mark.workerstart_check
N = 2


class LoopError(Exception):
    pass


@check("leaks.clean_exit")
@pytest.mark.parametrize("ending", ["exhaustion", "early_break", "loop_exception", "persistent_shutdown"])
def test_clean_exit(check_env, ending):
    if ending == "persistent_shutdown" and not check_env.loader.has("persistent_workers"):
        pytest.skip("loader does not declare capability 'persistent_workers'")
    before = check_env.snapshot()
    p = N if check_env.parallel_start_here else None
    kw = {"persistent_workers": True} if ending == "persistent_shutdown" else {}
    loader = check_env.make(WorkerTagDataset(16), num_workers=N, parallelism=p, **kw)
    if ending == "exhaustion":
        assert sum(1 for _ in loader) == 8
    elif ending == "early_break":
        for i, batch in enumerate(loader):
            if i == 1:
                break
        del batch
    elif ending == "loop_exception":
        with pytest.raises(LoopError):
            for i, batch in enumerate(loader):
                if i == 1:
                    raise LoopError("raised by the training loop")
        del batch
    else:
        for _epoch in range(2):
            for batch in loader:
                pass
        del batch
    del loader
    check_env.assert_clean(before, f"after {ending.replace('_', ' ')}", timeout=check_env.settings.exit_timeout)
