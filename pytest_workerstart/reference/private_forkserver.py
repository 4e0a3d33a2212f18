"""The reference loader's own forkserver: torch preloaded once, shared, restartable.

``multiprocessing``'s forkserver is one per process and its preload list is a
process-wide setting (``set_forkserver_preload``) that a library should not
change behind its user's back. This module runs a second server that only the
reference loader uses: it does once what every spawn or forkserver worker does
for itself (the driver's ``sys.path``, ``sys.argv`` and working directory, its
main module imported as ``__mp_main__``) and imports torch and the modules of
what every worker is sent (dataset, ``collate_fn``, ``worker_init_fn``, the
context's Process class, plus modules the user names); each worker is then a
fork of it: milliseconds instead of a torch import.

How a worker gets there: the reference sets ``Process._Popen`` on each worker
*instance* to :func:`popen`, so everything else about the Process (its class,
the caller's instrumented ``start()``, what is pickled to the child) stays
the context's own. The server itself is ``multiprocessing.forkserver.main``
(the stdlib serving loop), started by :class:`PrivateForkServer` with the
driver's ``sys.path`` (the stdlib server ignores it, so a module found
through a path added at run time would be imported from elsewhere, or not at
all; and its ``__main__`` preload never happens, cpython#126631) and ``SIGINT``
ignored while it imports (a Ctrl-C to the process group must not print a
traceback from inside the server's torch import).

Lifecycle: one current server per process, started on first use, reused by
every loader, iterator and epoch. A loader that needs a module the current
server lacks replaces it with one that preloads the union; the old one exits
once its last worker does (each worker holds its "alive" pipe). A server that
died (killed) is started again on the next worker start. At interpreter exit,
after multiprocessing has stopped its daemonic children, the server is
stopped and reaped. When the driver is killed, the workers exit (they watch
the driver, :mod:`pytest_workerstart.reference.driverwatch`) and the server sees the
end of its "alive" pipe and exits too.

Uses multiprocessing internals that are the same from Python 3.10 to 3.13
(``ForkServer``, ``popen_forkserver.Popen``, ``forkserver.main``);
:func:`unsupported` says why they are not usable elsewhere, and the reference
then falls back to ``multiprocessing``'s own forkserver.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import io
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterable
from multiprocessing import connection, context, forkserver, popen_forkserver, reduction, spawn, util

__all__ = ["PrivateForkServer", "current", "popen", "redirect", "server_for", "stop", "unsupported"]

#: Always preloaded: the import every worker would otherwise pay, and the module
#: of the reference's worker entry point.
BASE_PRELOAD = ("torch", "torch.utils.data", "pytest_workerstart.reference", __name__)

_MAIN_PARAMS = ("listener_fd", "alive_r", "preload", "main_path", "sys_path")

# The server's command: SIGINT ignored while it imports, the driver's sys.path (to
# find this module), then the preload and the stdlib serving loop (children get
# Python's default SIGINT handler back).
_COMMAND = ("import signal; signal.signal(signal.SIGINT, signal.SIG_IGN); import sys; sys.path[:] = {path!r}; "
            "from multiprocessing.forkserver import main; from {mod} import _preload; _preload({preload!r}, {prep!r}); "
            "signal.signal(signal.SIGINT, signal.default_int_handler); main({listener}, {alive}, [])")


def unsupported() -> str | None:
    """Why this Python's multiprocessing cannot host a private server, or None."""
    return _why_unsupported()


@functools.cache
def _why_unsupported() -> str | None:
    if sys.platform != "linux":
        return f"a private forkserver is only supported on Linux (this is {sys.platform})"
    params = tuple(inspect.signature(forkserver.main).parameters)
    if params != _MAIN_PARAMS:
        return f"Python {sys.version.split()[0]}: multiprocessing.forkserver.main takes {params}, not {_MAIN_PARAMS}"
    for owner, names in ((forkserver.ForkServer, ("connect_to_new_process", "ensure_running")),
                         (popen_forkserver.Popen, ("duplicate_for_child", "_launch", "poll")),
                         (forkserver, ("read_signed",)), (util, ("spawnv_passfds", "_args_from_interpreter_flags")),
                         (spawn, ("prepare", "get_preparation_data", "_fixup_main_from_name", "_fixup_main_from_path")),
                         (context, ("set_spawning_popen",))):
        missing = [n for n in names if not hasattr(owner, n)]
        if missing:
            return f"Python {sys.version.split()[0]}: multiprocessing lacks {owner.__name__}.{missing[0]}"
    return None


def _preparation() -> dict:
    """What a worker's ``spawn.prepare()`` is given about the driver, for the server to do
    the same once: ``sys.path``, ``sys.argv``, working directory, main module. Built
    here: ``spawn.get_preparation_data`` would fix the process's default start method."""
    from multiprocessing import process

    orig = process.ORIGINAL_DIR
    data = {"sys_path": [orig if p == "" and orig else p for p in sys.path], "sys_argv": list(sys.argv),
            "dir": os.getcwd(), "orig_dir": orig}
    main = sys.modules.get("__main__")
    name = getattr(getattr(main, "__spec__", None), "name", None)
    path = getattr(main, "__file__", None)
    if name is not None:
        data["init_main_from_name"] = name
    elif path is not None:
        data["init_main_from_path"] = os.path.normpath(os.path.join(orig or "", path))
    return data


def _preload(modules: list[str], prep: dict) -> None:
    """In the server: what each worker would do before unpickling its Process (spawn's
    ``prepare``: the driver's ``sys.path``, ``sys.argv``, working directory, then its
    main module as ``__mp_main__``), and the imports it would need, done once, in a
    worker's order: a module imported before the main module that imports it (a dataset's
    module importing the script's package) would make ``runpy`` warn on stderr.

    A module that fails here is imported again by each worker, which then reports
    the error where it happens. The collector is off while importing and what was
    imported is then frozen (``gc.freeze``, as Python's gc documentation advises
    before forking): a worker's collections never write to those objects, so their
    pages stay shared with the server instead of being copied into every worker."""
    import gc
    from multiprocessing import process

    gc.disable()
    try:
        base = {k: v for k, v in prep.items() if not k.startswith("init_main")}
        main = {k: v for k, v in prep.items() if k.startswith("init_main")}
        spawn.prepare(base)
        # as in a worker: a main module that starts processes when imported raises
        process.current_process()._inheriting = True
        try:
            spawn.prepare(main)
        except BaseException:
            pass
        finally:
            del process.current_process()._inheriting
        for name in modules:
            try:
                importlib.import_module(name)
            except BaseException:
                pass
    finally:
        gc.freeze()
        gc.enable()


class PrivateForkServer(forkserver.ForkServer):
    """A ``multiprocessing.forkserver.ForkServer`` with its own preload and command."""

    def __init__(self, preload: Iterable[str]):
        super().__init__()
        self._preload_modules = list(dict.fromkeys(preload))
        self._owner = os.getpid()

    @property
    def pid(self) -> int | None:
        return self._forkserver_pid

    @property
    def preload(self) -> tuple[str, ...]:
        return tuple(self._preload_modules)

    def covers(self, modules: Iterable[str]) -> bool:
        return set(modules) <= set(self._preload_modules)

    def ensure_running(self) -> None:
        """Start the server unless it runs; a dead one (killed, crashed) is replaced."""
        from multiprocessing import resource_tracker

        with self._lock:
            resource_tracker.ensure_running()
            if self._forkserver_pid is not None:
                if _alive(self._forkserver_pid):
                    return
                self._forget_server(reaped=True)
            listener = socket.socket(socket.AF_UNIX)
            try:
                address = connection.arbitrary_address("AF_UNIX")
                listener.bind(address)
                if not util.is_abstract_socket_namespace(address):
                    os.chmod(address, 0o600)
                listener.listen()
                alive_r, alive_w = os.pipe()
                try:
                    cmd = _COMMAND.format(path=list(sys.path), mod=__name__, preload=self._preload_modules,
                                          prep=_preparation(), listener=listener.fileno(), alive=alive_r)
                    exe = spawn.get_executable()
                    args = [exe, *util._args_from_interpreter_flags(), "-c", cmd]
                    pid = util.spawnv_passfds(exe, args, [listener.fileno(), alive_r])
                except BaseException:
                    os.close(alive_w)
                    raise
                finally:
                    os.close(alive_r)
            finally:
                listener.close()
            self._forkserver_address, self._forkserver_alive_fd, self._forkserver_pid = address, alive_w, pid

    def _forget_server(self, reaped: bool = False) -> None:
        """Drop the driver's ends (alive pipe, socket name): the server exits once its
        last worker has (each holds the alive pipe); reaped later unless ``reaped``."""
        if self._forkserver_alive_fd is not None:
            os.close(self._forkserver_alive_fd)
        if self._forkserver_address and not util.is_abstract_socket_namespace(self._forkserver_address):
            try:
                os.unlink(self._forkserver_address)
            except OSError:
                pass
        if self._forkserver_pid is not None and not reaped:
            _RETIRED.add(self._forkserver_pid)
        self._forkserver_address = self._forkserver_alive_fd = self._forkserver_pid = None

    def died(self, pid: int | None, patience: float) -> bool:
        """Whether server ``pid`` has exited or was replaced (waiting up to ``patience``)."""
        deadline = time.monotonic() + patience
        while True:
            with self._lock:
                if pid is None or self._forkserver_pid != pid or not _alive(pid):
                    return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)

    def retire(self) -> None:
        with self._lock:
            self._forget_server()

    def stop(self, patience: float = 0.5) -> None:
        """Close the alive pipe, wait ``patience`` for the server to exit, then kill it; reap."""
        with self._lock:
            pid = self._forkserver_pid
            self._forget_server()
        if pid is not None:
            _reap(pid, patience)


def _alive(pid: int) -> bool:
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # reaped by someone else
        _RETIRED.discard(pid)
        return False
    if done:
        _RETIRED.discard(pid)
    return not done


def _reap(pid: int, patience: float) -> None:
    deadline = time.monotonic() + patience
    while _alive(pid):
        if time.monotonic() >= deadline:
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
            break
        time.sleep(0.01)
    _RETIRED.discard(pid)


_LOCK = threading.Lock()
_CURRENT: PrivateForkServer | None = None
#: pids of servers replaced or stopped but not yet reaped
_RETIRED: set[int] = set()
_EXIT_HOOK: util.Finalize | None = None


def current() -> PrivateForkServer | None:
    return _CURRENT


def server_for(implicit: Iterable[str] = (), required: Iterable[str] = ()) -> PrivateForkServer:
    """The process's server, started now if it does not run (in the background: the
    call returns at once, and a worker start waits for the server's imports).

    A new server preloads ``BASE_PRELOAD``, ``implicit`` and ``required``. A running
    one is kept unless it lacks a ``required`` module (what a user named): then it is
    replaced by one that preloads the union, and exits once its last worker has. A
    missing ``implicit`` module (a later loader's dataset module) is imported by each
    worker instead: replacing the server for it would cost every loader a server boot.
    """
    global _CURRENT, _EXIT_HOOK
    required = list(required)
    with _LOCK:
        reap_retired()
        server = _CURRENT
        if server is None or not server.covers(required):
            wanted = [*BASE_PRELOAD, *implicit, *required]
            if server is not None:
                server.retire()
                wanted = [*server.preload, *wanted]
            server = _CURRENT = PrivateForkServer(wanted)
        if _EXIT_HOOK is None:
            # after multiprocessing has terminated its daemonic children at exit
            _EXIT_HOOK = util.Finalize(None, stop, exitpriority=-100)
    server.ensure_running()
    return server


def reap_retired() -> None:
    """Reap replaced servers that have exited (each waits for its last worker)."""
    for pid in list(_RETIRED):
        _alive(pid)


def stop() -> None:
    """Stop the current server and reap every retired one (interpreter exit; tests)."""
    global _CURRENT
    with _LOCK:
        server, _CURRENT = _CURRENT, None
    if server is not None:
        server.stop()
    for pid in list(_RETIRED):
        _reap(pid, 0.5)


def _after_fork_in_child() -> None:
    # A forked child inherits the parent's server object but is not the server's
    # parent: it must start its own. The inherited fds are copies; close them.
    global _CURRENT, _EXIT_HOOK, _LOCK
    _LOCK = threading.Lock()
    server, _CURRENT = _CURRENT, None
    _RETIRED.clear()
    _EXIT_HOOK = None
    if server is not None and server._forkserver_alive_fd is not None:
        try:
            os.close(server._forkserver_alive_fd)
        except OSError:
            pass


os.register_at_fork(after_in_child=_after_fork_in_child)


class _ServerPopen(popen_forkserver.Popen):
    """``popen_forkserver.Popen`` whose request goes to the private server.

    A server that dies under a request (killed between two of them, before the
    driver noticed) is replaced and the request sent once more; anything else is
    an error that names the server."""

    def _launch(self, process_obj) -> None:
        prep = spawn.get_preparation_data(process_obj._name)
        buf = io.BytesIO()
        context.set_spawning_popen(self)
        try:
            reduction.dump(prep, buf)
            reduction.dump(process_obj, buf)
        finally:
            context.set_spawning_popen(None)
        for attempt in (1, 2):
            server = server_for()
            pid = server.pid
            try:
                self._request(server, buf)
                return
            except (EOFError, OSError) as exc:
                if self.finalizer is not None:
                    self.finalizer()  # close this request's pipes
                    self.finalizer = None
                if attempt == 2 or not server.died(pid, patience=1.0):
                    raise RuntimeError(f"the loader's forkserver (pid {pid}) did not start the worker: "
                                       f"{type(exc).__name__}: {exc}") from exc

    def _request(self, server: PrivateForkServer, buf: io.BytesIO) -> None:
        self.sentinel, w = server.connect_to_new_process(self._fds)
        # the child watches a copy of the data pipe's write end to see this process die
        parent_w = os.dup(w)
        self.finalizer = util.Finalize(self, util.close_fds, (parent_w, self.sentinel))
        with open(w, "wb", closefd=True) as f:
            f.write(buf.getbuffer())
        self.pid = forkserver.read_signed(self.sentinel)


def popen(process_obj):
    """``Process._Popen`` for a worker that boots from the private server."""
    return _ServerPopen(process_obj)


def _stdlib_forkserver_popen_factories() -> tuple:
    from multiprocessing import process as _process  # noqa: F401 - the default-context Process

    return (context.ForkServerProcess._Popen, context.Process._Popen)


def redirect(proc) -> bool:
    """Make ``proc`` (a forkserver Process not yet started) boot from the private
    server; False, untouched, when its class brings a Popen of its own."""
    if type(proc)._Popen not in _stdlib_forkserver_popen_factories():
        return False
    proc._Popen = popen
    return True
