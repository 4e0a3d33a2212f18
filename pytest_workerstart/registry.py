"""The contract's checks, one entry each: the single source of every check id.

A conformance function names its id with ``@pytest.mark.workerstart_check(ID)``
and nothing else; what the id needs (capabilities, contexts, the quick
profile's contexts) is read from here by the session. ``tests/test_registry.py``
keeps the markers, ``docs/contract.md`` and the broken loaders (which declare
what they catch with :func:`pytest_workerstart.fixtures.broken.catches`) in
step with this table. Pure data: the plugin imports it without torch.
"""

from __future__ import annotations

import dataclasses

#: Clause name -> (module in conformance/, heading in docs/contract.md).
CLAUSES = {
    "start": ("test_start", "Start"),
    "order": ("test_order", "Order"),
    "digest": ("test_digest", "Digest"),
    "failure": ("test_failure", "Failure"),
    "leaks": ("test_leaks", "Leaks and seed properties"),
    "persistent": ("test_persistent", "Leaks and seed properties"),
    "prefetch": ("test_prefetch", "Leaks and seed properties"),
    "sharding": ("test_sharding", "Leaks and seed properties"),
    "transfer": ("test_transfer", "Leaks and seed properties"),
    "speed": ("test_speed", "Speed"),
    "exit": ("test_exit", "Exit"),
    "memory": ("test_memory", "Memory"),
    "resume": ("test_resume", "Resume"),
}


@dataclasses.dataclass(frozen=True)
class Check:
    """One check id and what running it requires."""

    id: str
    title: str
    #: capabilities the loader must declare (else: skipped with the capability named)
    requires: tuple[str, ...] = ()
    #: the only contexts it runs in (None: every selected context)
    contexts: tuple[str, ...] | None = None
    #: contexts it runs in under the quick profile
    quick_contexts: tuple[str, ...] = ("forkserver",)
    #: skipped when the loader has no parallelism keyword
    needs_parallelism_kwarg: bool = False
    #: never under xdist (it needs the machine to itself)
    serial_only: bool = False
    #: conformance module, when not the clause's
    module: str | None = None
    #: exercises parallel start (p > 1) where the loader declares it; the quick
    #: profile then runs it in such a context, and the coverage record says so
    parallel_path: bool = True

    @property
    def clause(self) -> str:
        return self.id.split(".", 1)[0]

    @property
    def conformance_module(self) -> str:
        return self.module or CLAUSES[self.clause][0]


_SPEED = dict(contexts=("spawn",), quick_contexts=("spawn",), serial_only=True, requires=("parallel_start",))

CHECKS: dict[str, Check] = {c.id: c for c in (
    Check("start.parameter_validation", "a bad parallelism value is rejected naming the argument",
          needs_parallelism_kwarg=True, parallel_path=False),
    Check("start.default_serial", "without the parallelism argument, one start at a time", parallel_path=False),
    Check("start.respects_bound", "with p in {1, 2, N}, exactly min(p, N) starts overlap",
          requires=("parallel_start",), quick_contexts=("spawn", "forkserver")),
    Check("start.builds_all_before_start", "every Process exists before the first start()",
          requires=("parallel_start",)),
    Check("start.unpicklable_argument", "a lambda dataset, collate_fn or worker_init_fn under spawn/forkserver "
                                        "raises at iter() or the first next() naming the argument; nothing left",
          contexts=("spawn", "forkserver")),
    Check("start.large_pickle", "a dataset pickle of 1 MiB and 100 MiB: every worker through the given context, "
                                "min(p, N) starts at once, batches in order; start time per worker reported",
          contexts=("spawn", "forkserver")),
    Check("order.registration", "batch k comes from worker k mod N whatever order starts finish in",
          requires=("in_order",)),
    Check("order.worker_seeds", "per-worker seeds do not depend on parallelism or context"),
    Check("order.epoch_shuffle", "epochs 1-3 each serve every index once, a shuffled loader's epochs differ and "
                                 "follow the generator, independent of p; torch's index streams where torch_parity"),
    Check("order.rng_streams", "torch, random and NumPy as a worker's user code draws from them: different per "
                               "worker, epoch and generator seed, independent of p; torch's draws where torch_parity"),
    Check("digest.first_batch", "the first batch is the same for every parallelism and context, with the "
                                "dataset's content"),
    Check("digest.torch_parity", "the first batches equal torch's DataLoader's for the same arguments",
          requires=("torch_parity",)),
    Check("failure.parent_start_error", "a failing start() surfaces naming the worker; leak rule"),
    Check("failure.worker_init_error", "a raising worker_init_fn surfaces with the worker's id",
          requires=("worker_init_fn",)),
    Check("failure.retry_after_failure", "after a failed start, a fresh iter() yields the truth"),
    Check("failure.child_exit_during_start", "a worker exiting during boot gives an error naming it"),
    Check("failure.child_killed_during_start", "a worker killed during boot gives an error naming it"),
    Check("failure.child_hang_during_start", "a worker hanging during boot is timed out, naming it",
          requires=("timeout",)),
    Check("failure.interrupt_during_start", "Ctrl-C while workers start leaves nothing"),
    Check("failure.forkserver_died", "the forkserver killed between epochs: the next epoch works or raises saying "
                                     "so, within the step bound; nothing left", contexts=("forkserver",)),
    Check("failure.driver_killed", "nothing the driver started outlives it",
          requires=("driver_watchdog",), module="test_driver_death"),
    Check("leaks.clean_exit", "nothing leaks after the ordinary ways an epoch ends"),
    Check("leaks.fd_growth", "fds of the driver and of persistent workers stay flat over 20 epochs"),
    Check("leaks.shm_segments", "no /dev/shm entry the loader's processes created outlives it (exhaustion, "
                                "early break, a worker error)"),
    Check("persistent.reuse", "persistent workers live as long as the loader",
          requires=("persistent_workers",)),
    Check("prefetch.bound", "in-flight batches never exceed prefetch_factor x num_workers"),
    Check("sharding.exactly_once", "each sample exactly once per epoch, across workers and ranks",
          requires=("iterable_dataset",)),
    Check("transfer.shared_memory", "batch tensors arrive through shared memory"),
    Check("exit.clean_interpreter", "a fresh interpreter that used the loader exits 0, prints nothing on "
                                    "stderr and leaves nothing running", parallel_path=True),
    Check("memory.epoch_growth", "a persistent worker's USS stays flat from epoch 2 to epoch 10",
          requires=("persistent_workers",)),
    Check("resume.state_dict", "stopping after k batches and resuming in a new loader gives exactly the rest",
          requires=("state_dict",), contexts=("spawn", "forkserver")),
    Check("speed.startup", "parallel start pays off in time to first batch", **_SPEED),
    Check("speed.steady_state", "parallel start costs no steady-state throughput", **_SPEED),
    Check("speed.memory", "parallel start costs no memory", **_SPEED),
)}


def get(check_id: str) -> Check:
    try:
        return CHECKS[check_id]
    except KeyError:
        raise KeyError(f"unknown check id {check_id!r}: add it to pytest_workerstart/registry.py") from None
