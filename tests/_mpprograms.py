"""Tiny stdlib multiprocessing programs with known answers, for probe self-tests."""

import os
import threading
import time


def sleeper(seconds=30.0):
    time.sleep(seconds)


def quick():
    pass


def start_with_threads(ctx, n, parallelism, target=quick):
    """Build n processes, then start them from ``parallelism`` threads; join all."""
    procs = [ctx.Process(target=target, daemon=True) for _ in range(n)]
    it = iter(range(n))
    lock = threading.Lock()

    def run():
        while True:
            with lock:
                i = next(it, None)
            if i is None:
                return
            procs[i].start()

    threads = [threading.Thread(target=run) for _ in range(parallelism)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for p in procs:
        p.join()
    return procs


def hang_forever():
    while True:
        time.sleep(3600)


def returns_42():
    return 42


def raises():
    raise ValueError("scenario failed on purpose")


def exits_hard():
    os._exit(7)


def interrupt_at_worker_1():
    """Serial starts with an interrupt fault at worker 1: which starts happened?"""
    from pytest_workerstart.probes.context import InstrumentedContext
    from pytest_workerstart.probes.faults import FaultPlan

    ctx = InstrumentedContext("fork", num_workers=3, faults=FaultPlan.interrupt(1))
    procs = [ctx.Process(target=quick) for _ in range(3)]
    started = []
    try:
        for i, p in enumerate(procs):
            p.start()
            started.append(i)
    except KeyboardInterrupt:
        outcome = "KeyboardInterrupt"
    else:
        outcome = "no interrupt"
    for p in procs:
        if p.pid is not None:
            p.join()
    return {"outcome": outcome, "started": started}
