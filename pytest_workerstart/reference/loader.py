"""``ParallelStartDataLoader``: torch's DataLoader plus ``worker_start_parallelism``, its
argument checks, and ``preload_forkserver``."""

from __future__ import annotations

import functools
import sys
import warnings
from typing import TypeVar

import torch
import torch.multiprocessing
from torch.utils.data import DataLoader

from pytest_workerstart import _torch_internals as torch_internals
from pytest_workerstart.reference import private_forkserver
from pytest_workerstart.reference.iterator import _ParallelStartIter, _Progress, _SingleIter
from pytest_workerstart.reference.policy import StartPolicy


def _validate_flag(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {type(value).__name__} {value!r}")
    return value


def _validate_preload(value) -> tuple[str, ...]:
    try:
        names = None if isinstance(value, str) else tuple(value)
    except TypeError:
        names = None
    if names is None or not all(isinstance(v, str) and v for v in names):
        raise TypeError(f"preload must be a list of module names, got {value!r}")
    return names


def _modules_of(*objs) -> list[str]:
    """Modules a worker imports to unpickle ``objs`` (``__main__`` is left to the server's
    own preparation, which imports it as a worker would, as ``__mp_main__``)."""
    out = []
    for obj in objs:
        if obj is None:
            continue
        obj = getattr(obj, "func", obj)  # functools.partial
        mod = getattr(obj, "__module__", None) if callable(obj) and not isinstance(obj, type) else None
        mod = mod or type(obj).__module__
        if isinstance(mod, str) and mod not in ("__main__", "builtins"):
            out.append(mod)
    return out


_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        import warnings

        warnings.warn(message, RuntimeWarning, stacklevel=3)


def _validate_parallelism(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"worker_start_parallelism must be an int >= 1, got {type(value).__name__} {value!r}")
    if value < 1:
        raise ValueError(f"worker_start_parallelism must be an int >= 1, got {value!r}")
    return value


def preload_forkserver(*modules: str, dataset=None) -> list[str]:
    """Have the forkserver import ``torch`` (plus ``modules`` and ``dataset``'s
    module) once, so forkserver workers fork with it already imported.

    Call it before the first forkserver worker of the process; it cannot change
    a server that is already running (a ``RuntimeWarning`` says so). Trade-offs:
    workers boot in a fork plus an unpickle instead of a full torch import, and
    share the imported pages copy-on-write (less PSS); but whatever those imports
    do at import time happens in the server, and a module imported there is not
    re-imported per worker (edits to it need a new process). ``__main__`` is
    deliberately not preloaded (its preload differs across Python versions,
    cpython#126631). Returns the list it set.
    """
    import multiprocessing
    import warnings
    from multiprocessing import forkserver

    names = ["torch", *modules]
    if dataset is not None:
        mod = type(dataset).__module__
        if mod and mod != "__main__":
            names.append(mod)
    names = list(dict.fromkeys(names))
    if getattr(forkserver._forkserver, "_forkserver_pid", None) is not None:
        warnings.warn("preload_forkserver: the forkserver is already running; its preload list is unchanged",
                      RuntimeWarning, stacklevel=2)
    multiprocessing.get_context("forkserver").set_forkserver_preload(names)
    return names


#: The item type, as torch's DataLoader is generic in it (``ParallelStartDataLoader[Batch]``).
T_co = TypeVar("T_co", covariant=True)


class ParallelStartDataLoader(DataLoader[T_co]):
    """``torch.utils.data.DataLoader`` plus ``worker_start_parallelism``.

    ``worker_start_parallelism`` (int >= 1, default 1): how many worker starts may
    be in flight at once under spawn and forkserver; capped at ``num_workers``;
    1 starts workers one by one; ignored (serial) under fork.

    ``private_forkserver`` (bool, default True): under forkserver, fork workers from
    the loader's own server, which has imported torch, the main module and the
    modules of what workers are sent (docs/reference.md); False: multiprocessing's.
    ``preload`` (module names): more modules that server imports once.

    ``state_dict()`` / ``load_state_dict()``: resume an epoch of a map-style dataset
    where it stopped, in a new loader built with the same arguments (the generator's
    state is saved and restored, so a seeded shuffle resumes the same permutation).

    ``start_policy`` (class attribute): the :class:`StartPolicy` subclass whose instance,
    one per iterator, makes every decision about starting, watching and stopping workers;
    a subclass of the loader that changes one of them sets its own.
    """

    __workerstart_capabilities__ = {"parallel_start": ("spawn", "forkserver")}
    __workerstart_parallelism_kwarg__ = "worker_start_parallelism"
    # resume: batches the next iterator skips; the current epoch's progress
    _resume_skip = 0
    _progress: _Progress | None = None
    _index_sampler = torch_internals.resumable_index_sampler("_resume_skip")
    _iterator_class = _ParallelStartIter
    start_policy: type[StartPolicy] = StartPolicy

    def __init__(
        self,
        dataset,
        batch_size=1,
        shuffle=None,
        sampler=None,
        batch_sampler=None,
        num_workers=0,
        collate_fn=None,
        pin_memory=False,
        drop_last=False,
        timeout=0,
        worker_init_fn=None,
        multiprocessing_context=None,
        generator=None,
        *,
        prefetch_factor=None,
        persistent_workers=False,
        pin_memory_device="",
        in_order=True,
        worker_start_parallelism: int = 1,
        private_forkserver: bool = True,
        preload=(),
    ) -> None:
        self.worker_start_parallelism = _validate_parallelism(worker_start_parallelism)
        self.private_forkserver = _validate_flag("private_forkserver", private_forkserver)
        self.preload = _validate_preload(preload)
        super().__init__(
            dataset, batch_size, shuffle, sampler, batch_sampler, num_workers, collate_fn, pin_memory,
            drop_last, timeout, worker_init_fn, multiprocessing_context, generator,
            prefetch_factor=prefetch_factor, persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device, in_order=in_order,
        )
        # Boot the server now, in the background: its torch import overlaps whatever the
        # caller does before iter(). Only for an explicit forkserver context: asking the
        # default context its method would fix the process's start method.
        ctx = self.multiprocessing_context
        if self.num_workers > 0 and ctx is not None and ctx.get_start_method() == "forkserver":
            self._private_server("forkserver")

    def _private_server(self, method: str):
        """The private forkserver this loader's workers boot from under ``method``, or None."""
        if method != "forkserver" or not self.private_forkserver:
            return None
        why = private_forkserver.unsupported()
        if why is not None:
            _warn_once(f"ParallelStartDataLoader: {why}; workers boot from multiprocessing's forkserver")
            return None
        implicit = _modules_of(self.dataset, self.collate_fn, self.worker_init_fn, self.multiprocessing_context)
        return private_forkserver.server_for(implicit, self.preload)

    def __iter__(self):
        # counted by the iterator itself, so the count outlives it (``for ... break`` drops it)
        progress = _Progress(self._resume_skip, self.generator.get_state() if self.generator is not None else None)
        try:
            it = super().__iter__()
        finally:
            self._resume_skip = 0
        it._ws_progress = self._progress = progress
        return it

    def state_dict(self) -> dict:
        """Where the current epoch stands: batches delivered (plus those a resume skipped)
        and the generator's state when the epoch began."""
        p = self._progress
        if p is None:
            return {"batches_yielded": 0, "generator_state": None}
        return {"batches_yielded": p.delivered, "generator_state": p.generator_state}

    def load_state_dict(self, state: dict) -> None:
        """The next ``iter()`` resumes the epoch ``state`` (from :meth:`state_dict`) describes."""
        try:
            skip, gen_state = int(state["batches_yielded"]), state["generator_state"]
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"load_state_dict: expected a dict from state_dict(), got {state!r}") from None
        if skip < 0:
            raise ValueError(f"load_state_dict: batches_yielded must be >= 0, got {skip}")
        if skip and isinstance(self.dataset, torch.utils.data.IterableDataset):
            raise ValueError("load_state_dict: an IterableDataset's position is the dataset's own state; "
                             "this loader resumes map-style datasets only")
        if gen_state is not None and self.generator is not None:
            self.generator.set_state(gen_state)
        self._resume_skip = skip

    def _get_iterator(self):
        if self.num_workers == 0:
            return _SingleIter(self)
        _as_torchs_warning(self.check_worker_number_rationality)
        return self._iterator_class(self)


def _as_torchs_warning(check) -> None:
    """Run one of torch's checks so that what it warns is attributed to torch's DataLoader
    module, as when torch's own ``_get_iterator`` calls it: a user's filter by module
    (``ignore::UserWarning:torch.utils.data.dataloader``) and torch's once-per-location
    registry then treat it alike."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check()
    module = sys.modules[DataLoader.__module__]
    filename, lineno = _torch_call_site(check.__name__)
    for w in caught:
        warnings.warn_explicit(w.message, w.category, filename, lineno, module=module.__name__,
                               registry=module.__dict__.setdefault("__warningregistry__", {}))


@functools.cache
def _torch_call_site(name: str) -> tuple[str, int]:
    """Where torch's ``DataLoader._get_iterator`` calls ``name`` (its first line if the source is not there)."""
    import inspect

    code = DataLoader._get_iterator.__code__
    try:
        lines, first = inspect.getsourcelines(DataLoader._get_iterator)
    except (OSError, TypeError):
        return code.co_filename, code.co_firstlineno
    return code.co_filename, next((first + k for k, line in enumerate(lines) if name in line), first)
