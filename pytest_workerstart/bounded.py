"""The loader under test as a check drives it: ``iter()``, each ``next()`` and the iterator's
shutdown are steps of the check's environment (``CheckEnv.step``), each with its deadline."""

from __future__ import annotations


class BoundedLoader:
    """The loader under test, with ``iter()`` and each ``next()`` as bounded steps."""

    def __init__(self, loader, env, num_workers: int, ctx):
        self._ws = (loader, env, num_workers, ctx)

    def __iter__(self):
        loader, env, n, ctx = self._ws
        return BoundedIterator(env.step("iter()", lambda: iter(loader), n, ctx), env, n, ctx)

    def __len__(self):
        return len(self._ws[0])

    def __getattr__(self, name):
        return getattr(self._ws[0], name)


class BoundedIterator:
    def __init__(self, it, env, num_workers: int, ctx):
        self._ws = (it, env, num_workers, ctx)
        self._k = 0

    def __iter__(self):
        return self

    def __next__(self):
        it, env, n, ctx = self._ws
        self._k += 1
        return env.step(f"next() #{self._k}", lambda: next(it), n, ctx)

    def __getattr__(self, name):
        return getattr(self._ws[0], name)

    def __del__(self):
        # the loader's iterator goes with this one: its shutdown is a bounded step too
        box, env, n, ctx = [self._ws[0]], *self._ws[1:]
        self._ws = (None, env, n, ctx)
        if box[0] is not None:
            env.release(box, "the iterator's shutdown", n, ctx)


def batches_of(loader, limit: int | None = None) -> list:
    out = []
    for i, batch in enumerate(loader):
        out.append(batch)
        if limit is not None and i + 1 >= limit:
            break
    return out
