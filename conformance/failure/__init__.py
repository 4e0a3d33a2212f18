"""The failure clause: a start that fails, a worker that dies, hangs or is interrupted while the
workers start, a forkserver or a driver that dies; the error names what failed and nothing is left.

Leak rule: **while the raised exception is still referenced** (as
`pytest.raises` holds it) no live or zombie child and no extra thread; **once
released and collected** no extra fd, semaphore or shm segment. fds,
semaphores and segments that disappear on release are reported "held by the
exception" with counts, and fail only with `--workerstart-strict`. What the
loader stopped has max(5 s, 2 × the boot cost measured in the run) to be gone
after its own shutdown returns (a worker's interpreter teardown; torch's workers
poll every 5 s), so a loader that keeps its workers fails at that bound; once
processes were alive while the error was held, the scenario kills the loader's
workers instead of waiting out its shutdown (the case has failed already).
Releasing the error is itself bounded by that patience: the shutdown it sets off
that has not returned by then is stopped and the case fails, naming "the shutdown
after the error was released". A shutdown that returns within the patience is judged
by what ended the workers: one that took longer than a join's timeout (torch's 5 s)
and left ready workers ended by a signal rather than by the end of their own loop
waited that timeout out, and fails ("ended worker 0, 1 by a signal, not by the end of
its work"), however high the patience a busy machine's boot cost gave. The error is released
once every worker the loader started has booted (its `run()` began) or ended, up to the step
deadline: a spawn or forkserver worker still unpickling its queues when the shutdown unlinks their
semaphores dies of it, and a loader that notices a dead worker may cut its shutdown short, so
released mid-boot the same loader stalls in one run and not the next (torchdata's
`StatefulDataLoader` did); a worker still booting at the deadline is named in the case's
`released_while_booting`. The suite drops the error
as a reference cycle, so
what only the error holds (the iterator, through the traceback's frames) is always
freed by the cyclic garbage collector, never by reference counting: which of the two
a traceback leads to depends on the frames it kept, and a loader's shutdown may
differ between them. torch's own `DataLoader` fails here in
`failure.worker_init_error` and `failure.retry_after_failure`: collected as
garbage, its iterator finds its index queues already finalized, so the `None`
that ends each worker never leaves the driver and every join waits its 5 s.
"""
