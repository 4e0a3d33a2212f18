"""Every command shown in docs/ is exercised.

Commands come from the ``sh`` code blocks of every page. How each kind is
exercised (a kind without a handler fails this test, so a new command in the
docs cannot go unchecked):

* ``pytest ...``: run with ``--collect-only`` in a scratch directory, which
  parses every option, resolves the loader SPEC (placeholder modules of the
  docs get stubs, docs/recipes adapters are copied in) and validates
  capabilities; usage errors would exit 4. A command whose third-party
  package is not installed is skipped.
  Full runs of the same options are the self-tests and ``make conformance``.
* ``python -m pytest_workerstart.bench``: ``plot``/``arrivals``/``table``/``targets``/``epochs``/``suite-table``
  run for real on the committed results; a benchmark or suite run is parsed by its own parser
  (``tests/test_bench.py`` runs the harness end to end).
* ``python -m pytest_workerstart.results_table``: run for real, output compared.
* ``make T``: ``make -n T``. ``tox -e E``: each E is a configured environment.
* ``torchrun ... -m pytest_workerstart.distributed``: the ``--standalone`` form
  runs in ``tests/test_distributed.py``; here every form's arguments parse.
* ``pip install -c constraints.txt ...``: the constraints file and extras exist.
* ``python docs/results/repro/X.py [SPEC]``: the script exists and SPEC resolves; each
  script runs on torch and on the reference in ``tests/test_repro_scripts.py``.
"""

import configparser
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
STUBS = {
    "mypackage/loaders.py": "from pytest_workerstart.reference import ParallelStartDataLoader as MyLoader\n",
    "myproject/workerstart_adapter.py": (
        "from pytest_workerstart.reference import ParallelStartDataLoader\n\n\n"
        "def make(dataset, *, start_parallelism=1, **kwargs):\n"
        "    return ParallelStartDataLoader(dataset, worker_start_parallelism=start_parallelism, **kwargs)\n\n\n"
        "make.__workerstart_parallelism_kwarg__ = 'start_parallelism'\n"),
}


def doc_commands():
    out = []
    for page in sorted(DOCS.glob("*.md")):
        for block in re.findall(r"```(?:sh|bash)\n(.*?)```", page.read_text(), flags=re.S):
            joined = re.sub(r"\\\n\s*", " ", block)
            for line in joined.splitlines():
                line = re.sub(r"\s+#\s.*$", "", line).strip()
                if line and not line.startswith("#"):
                    out.append((page.name, line))
    return out


COMMANDS = doc_commands()


def test_docs_show_commands():
    assert len(COMMANDS) >= 15, COMMANDS


@pytest.mark.suite  # each runs a pytest, the benchmark or make of its own
@pytest.mark.parametrize(("page", "command"), COMMANDS, ids=[f"{p}:{c[:60]}" for p, c in COMMANDS])
@pytest.mark.usefixtures("environ_restored")  # monai sets CUBLAS_WORKSPACE_CONFIG as it is imported
def test_command_is_exercised(page, command, tmp_path, monkeypatch, capsys):
    redirect = None
    if " > " in command:
        command, redirect = (part.strip() for part in command.split(" > ", 1))
    argv = shlex.split(command)
    head = argv[0]
    if head == "pytest":
        _pytest(argv[1:], tmp_path, monkeypatch, capsys)
    elif argv[:3] == ["python", "-m", "pytest_workerstart.bench"]:
        _bench(argv[3:], tmp_path, redirect)
    elif argv[:3] == ["python", "-m", "pytest_workerstart.results_table"]:
        proc = subprocess.run([sys.executable, "-m", "pytest_workerstart.results_table", *argv[3:]], cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert redirect and proc.stdout == (ROOT / redirect).read_text(), f"{redirect} is not what the command renders"
    elif head == "make":
        proc = subprocess.run(["make", "-n", *argv[1:]], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
    elif head == "tox":
        _tox(argv[1:])
    elif head == "torchrun":
        _torchrun(argv[1:])
    elif argv[:2] == ["pip", "install"]:
        assert (ROOT / argv[argv.index("-c") + 1]).exists()
    elif head == "python" and argv[1].startswith("docs/results/repro/"):
        # run on torch and on the reference by tests/test_repro_scripts.py; here: it exists, the SPEC resolves
        assert (ROOT / argv[1]).is_file(), argv[1]
        if len(argv) > 2:
            module, _, name = argv[2].partition(":")
            assert hasattr(__import__(module, fromlist=[name]), name), argv[2]
    else:
        pytest.fail(f"{page}: no handler exercises {command!r}; add one to {__file__}")


RECIPES = DOCS / "recipes"


def _third_party_missing(args):
    """The package a ``--workerstart-loader`` of the docs needs (directly or through a
    docs/recipes adapter), when it is not installed: that command is then skipped."""
    import importlib.util

    for package in _loader_packages(args):
        top = package.split(".")[0]
        if top not in PLACEHOLDERS and importlib.util.find_spec(top) is None:
            return top
    return None


def _loader_packages(args):
    """The importable module each ``--workerstart-loader=MODULE:NAME`` of ``args`` comes from
    (a docs/recipes adapter: the package it wraps)."""
    for a in args:
        if a.startswith("--workerstart-loader=") and ":" in a:
            module = a.split("=", 1)[1].split(":")[0]
            recipe = RECIPES / f"{module.split('.')[0]}.py"
            if recipe.exists():
                module = re.search(r'__workerstart_package__ = "(\w+)"', recipe.read_text()).group(1)
            yield module


#: the docs' placeholder packages (given :data:`STUBS`), not third-party
PLACEHOLDERS = {Path(rel).parts[0] for rel in STUBS}
#: every third-party module a docs loader comes from, in one fixed order
THIRD_PARTY = sorted({m for _, c in COMMANDS for m in _loader_packages(shlex.split(c))
                      if m.split(".")[0] not in PLACEHOLDERS})


def _import_third_party() -> None:
    """Import every installed :data:`THIRD_PARTY` module, in its order, the first time a command
    needs one: importing monai after mosaic's streaming replaces the ``transformers`` module in
    ``sys.modules``, which the process-state guard fails, so the test that replaced it depended
    on which commands ran before it in the worker."""
    import importlib
    import importlib.util

    for name in THIRD_PARTY:
        if importlib.util.find_spec(name.split(".")[0]) is not None:
            importlib.import_module(name)


def _pytest(args, here, monkeypatch, capsys):
    """``pytest --collect-only`` in this process (``pytest.main``): torch and the loaders' packages
    are imported once for every command, not once per command, and stay imported (unloading an
    extension module is not safe)."""
    missing = _third_party_missing(args)
    if missing:
        pytest.skip(f"{missing} is not installed (the third-party extra)")
    if any(m in THIRD_PARTY for m in _loader_packages(args)):
        _import_third_party()
    for rel, text in STUBS.items():
        (here / rel).parent.mkdir(parents=True, exist_ok=True)
        (here / rel).write_text(text)
    for recipe in RECIPES.glob("*.py"):  # the docs run recipes from their directory
        (here / recipe.name).write_text(recipe.read_text())
    for a in args:
        if a.startswith("--workerstart-json="):
            (here / a.split("=", 1)[1]).parent.mkdir(parents=True, exist_ok=True)
    monkeypatch.chdir(here)
    monkeypatch.syspath_prepend(str(here))
    capsys.readouterr()
    ret = pytest.main(["-p", "no:cacheprovider", "--collect-only", "-q", *args])
    out, err = capsys.readouterr()
    assert ret == 0, out[-2000:] + err[-2000:]
    assert "ERROR:" not in err


def _bench(args, tmp_path, redirect):
    from pytest_workerstart.bench import __main__ as bench

    if args and args[0] in ("plot", "arrivals", "table", "targets", "epochs", "suite-table"):
        real = [str(tmp_path / Path(a).name) if a.endswith(".png") else a for a in args]
        proc = subprocess.run([sys.executable, "-m", "pytest_workerstart.bench", *real], cwd=ROOT,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        if redirect:
            assert proc.stdout == (ROOT / redirect).read_text(), f"{redirect} is not what the command renders"
    elif args[:1] == ["suite"]:  # a suite run per loader and profile: its arguments parse
        from pytest_workerstart.bench import suite

        suite.parser().parse_args(args[1:])
    else:
        bench.run_parser().parse_args(args)


def _tox(args):
    envs = args[args.index("-e") + 1].split(",")
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "tox.ini")
    listed = cfg["tox"]["envlist"]
    expanded = set()
    for item in re.split(r",\s*(?![^{]*})", listed):
        parts = re.findall(r"\{([^}]*)\}|([^{}]+)", item.strip())
        combos = [""]
        for group, literal in parts:
            options = group.split(",") if group else [literal]
            combos = [c + o for c in combos for o in options]
        expanded.update(combos)
    assert set(envs) <= expanded, f"not in tox.ini: {set(envs) - expanded}"


def _torchrun(args):
    from pytest_workerstart.conformance.sharding import ranks as distributed

    i = args.index("-m")
    assert args[i + 1] == "pytest_workerstart.distributed"
    with pytest.raises(SystemExit) as exc:  # parse, then stop before touching RANK/WORLD_SIZE
        distributed.main([*args[i + 2:], "--help"])
    assert exc.value.code == 0
