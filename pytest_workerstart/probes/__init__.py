"""Instruments that observe a loader from outside, through public interfaces.

* :mod:`.context` — instrumented multiprocessing context (+ :mod:`.faults`)
* :mod:`.leaks` — before/after leak snapshots
* :mod:`.digest` — canonical batch SHA-256
* :mod:`.scenario` — fresh-interpreter runner with a hard timeout
* :mod:`.timing` — startup timer
* :mod:`.reaper` — session-end cleanup
"""
