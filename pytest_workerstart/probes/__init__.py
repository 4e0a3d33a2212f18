"""Instruments that observe a loader from outside, through public interfaces, and inject the
faults a check asks for. Running processes and removing what they leave (killing, unlinking)
is :mod:`pytest_workerstart.harness`'s, which imports these; they never import it.

* :mod:`.context` — instrumented multiprocessing context (+ :mod:`.faults`)
* :mod:`.leaks` — before/after leak snapshots, the ``/dev/shm`` watch
* :mod:`.digest` — canonical batch SHA-256
* :mod:`.deadline` — bounded in-process steps, the memory guard
* :mod:`.epochs` — index and random streams over several epochs
* :mod:`.timing`, :mod:`.foreign_cpu` — what a timing trial measures, a busy machine
* :mod:`.tensor_origin` — where a batch's tensors were allocated
"""
