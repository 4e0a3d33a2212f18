"""The reference parallel-start loader: a drop-in ``torch.utils.data.DataLoader``.

``ParallelStartDataLoader(..., worker_start_parallelism=p)`` builds every worker
process and queue first, then starts them in worker-id order with at most
``min(p, num_workers)`` starts in flight (spawn and forkserver; fork stays
serial because forking from a process with start threads is unsafe). With
p > 1 the start is deferred: ``iter()`` returns while the starts run, and
``next()`` waits only for the worker the next batch needs. Workers are
registered in worker-id order whatever order the starts finish in, so seeds,
sharding and batch order are exactly torch's.

Under forkserver the workers are forked from the loader's own preloaded server
(:mod:`pytest_workerstart.reference.private_forkserver`; ``private_forkserver=False``
opts out), and workers from id p on start once the first batch has arrived.

Every decision about the workers (how many starts at once, what each worker is
sent, how they start, in which order they are registered, what a failed start
cleans up, how a dead worker is noticed, how they stop) is made by a
:class:`StartPolicy` (:mod:`.policy`), one per iterator: the one extension point.
The iterator's states, and what each failure does:

============  =====================================  ==========================================
state         entered / left                         on a failure
============  =====================================  ==========================================
building      ``__init__`` / every Process and        ``StartPolicy.cleanup_failed_start`` stops
              queue exists                           what was started and closes every queue;
                                                     ``_abandon`` releases the shared queue
starting      p > 1: ``Launcher.begin`` / ``_settle``   failed start (``_settle``): the building
              sees every start returned              cleanup, then ``_fail``; Ctrl-C or a dead
                                                     worker: ``_fail`` (``_halt_starts`` first)
running       pids registered with torch's SIGCHLD   a dead or silent worker: ``_fail``
              handler / exhaustion or shutdown
closed        ``_shutdown_workers`` or ``_fail``     (nothing left)
============  =====================================  ==========================================

Every raised error leaves through ``StartPolicy.forget``, which drops what its
traceback would keep alive. Modules: :mod:`.errors`, :mod:`.loader`, :mod:`.policy`,
:mod:`.launcher` (starting and stopping processes), :mod:`.iterator`.

On any start failure every started process is stopped and joined, every queue
closed, every start thread joined, and the references a raised exception would
otherwise keep alive (through traceback frames) are dropped, so nothing leaks
even while the exception is held. Workers also exit when the *driving* process
dies (see :mod:`pytest_workerstart.reference.driverwatch`), in every context.
"""

from pytest_workerstart.cores import usable_cores
from pytest_workerstart.reference.errors import WorkerFailedError, WorkerStartError
from pytest_workerstart.reference.loader import ParallelStartDataLoader, preload_forkserver
from pytest_workerstart.reference.policy import StartPolicy

__all__ = ["ParallelStartDataLoader", "StartPolicy", "WorkerStartError", "WorkerFailedError", "preload_forkserver",
           "usable_cores"]
