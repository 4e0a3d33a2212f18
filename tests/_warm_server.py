"""The warm pytest server (run as a script by tests/_warm.py): imports what every suite run
imports, then forks one ``python -m pytest`` run per request.

Requests are JSON lines on stdin: ``{"args", "cwd", "env", "stdout", "stderr"}`` (``stderr``
null: the same file as ``stdout``). For each, the server forks; it answers ``{"pid": N}`` at
once and ``{"exit": CODE}`` (negative: the signal that ended the run) when the run ends. The
child becomes what ``python -m pytest ARGS`` started in ``cwd`` with ``env`` would be: that
environment, ``sys.path`` built from ``cwd`` and ``PYTHONPATH`` as the interpreter would build
it, stdin from /dev/null, stdout and stderr to the files, pytest's ``__main__`` run the way
``-m`` runs it, and the interpreter's own exit (atexit handlers, non-daemon threads). What a
fresh interpreter would draw at random (numpy's global generator, the temp directory) is drawn
again.

Nothing of pytest_workerstart is imported here: its settings and the plugin are imported by
each run, from the environment that run was given.
"""

import json
import os
import sys

#: the interpreter's own entries (stdlib, site-packages, what .pth files add): this script's
#: folder (sys.path[0]) is not a run's, and the server is started without PYTHONPATH
BASE_PATH = sys.path[1:]

import numpy  # noqa: E402
import psutil  # noqa: E402, F401
import pytest  # noqa: E402, F401
import torch  # noqa: E402
import torch.utils.data  # noqa: E402, F401


def _run(request: dict) -> None:
    """In the forked child: become the run, then exit as the run's interpreter would."""
    import importlib
    import multiprocessing.process
    import runpy
    import tempfile

    cwd, env = request["cwd"], request["env"]
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    entries = [os.getcwd(), *(os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p),
               *BASE_PATH]
    sys.path[:] = list(dict.fromkeys(entries))
    sys.path_importer_cache.clear()
    importlib.invalidate_caches()
    sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
    tempfile.tempdir = None
    multiprocessing.process.current_process()._config.pop("tempdir", None)
    numpy.random.seed()

    null = os.open(os.devnull, os.O_RDONLY)
    out = os.open(request["stdout"], os.O_WRONLY | os.O_APPEND)
    err = os.open(request["stderr"], os.O_WRONLY | os.O_APPEND) if request["stderr"] else out
    for fd, target in ((0, null), (1, out), (2, err)):
        os.dup2(target, fd)
    for fd in {null, out, err}:
        os.close(fd)

    sys.argv = ["pytest", *request["args"]]
    runpy.run_module("pytest", run_name="__main__", alter_sys=True)
    sys.exit(0)  # pytest's __main__ raises SystemExit itself


def _reply(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def serve() -> None:
    _reply({"ready": os.getpid()})
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _run(request)  # raises SystemExit: the child's interpreter ends with the run's code
        _reply({"pid": pid})
        _, status = os.waitpid(pid, 0)
        _reply({"exit": os.waitstatus_to_exitcode(status)})


if __name__ == "__main__":
    serve()
