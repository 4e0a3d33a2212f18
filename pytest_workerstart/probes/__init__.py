"""Instruments that observe a loader from outside, through public interfaces
(what runs and cleans up the processes they observe is :mod:`pytest_workerstart.harness`).

* :mod:`.context` — instrumented multiprocessing context (+ :mod:`.faults`)
* :mod:`.leaks` — before/after leak snapshots, the ``/dev/shm`` watch
* :mod:`.digest` — canonical batch SHA-256
* :mod:`.deadline` — bounded in-process steps, the memory guard
* :mod:`.epochs` — index and random streams over several epochs
* :mod:`.driver_death`, :mod:`.clean_exit` — what outlives a driver or an interpreter
* :mod:`.timing`, :mod:`.cores`, :mod:`.foreign_cpu` — startup timer, usable cores, a busy machine
* :mod:`.tensor_origin` — where a batch's tensors were allocated
"""
