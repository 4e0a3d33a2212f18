"""Every ``--workerstart-*`` option, defined once and resolved once.

Each :class:`Option` names its command-line flag, environment variable and ini
key; :func:`resolve` applies the documented precedence

    command line > environment variable > ini file > default

and returns a frozen :class:`Settings` kept in ``config.stash[SETTINGS]``.
Converters get the value *and where it came from*, so a bad value is one
usage error line that names its source (as pytest-timeout's
``_validate_timeout(value, where)`` does), never a traceback.

Only the standard library and pytest are imported here: the plugin registers
these options in every pytest run, with or without ``--workerstart``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pytest_workerstart import registry
from pytest_workerstart import setting_values as values

#: --workerstart-explore's default in the full profile (seconds per explorable check and context)
DEFAULT_EXPLORE_S = 8.0
SPAWN_NOTE = "spawn: two draws"


# --- the options ---------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Option:
    """One setting: where it can be given, how it is checked, what it means."""

    field: str
    convert: Callable[[Any, str], Any]
    default: Any
    help: str
    metavar: str | None = None
    kind: str = "value"  # value | flag (store_true) | list (repeatable)
    ini_type: str | None = None  # pytest ini type ("bool", "linelist") or None (string)
    env: bool = True
    ini: bool = True
    ini_key: str | None = None  # when the ini key is not ``workerstart_<field>``
    #: False for options that only say where output goes (they cannot change a verdict).
    in_verdict: bool = True
    #: False for options that cannot change one case's outcome when it is rerun alone
    #: (where output goes, baselines, expected failures, how many cases run at once)
    in_reproduce: bool = True

    @property
    def flag(self) -> str:
        return "--workerstart-" + self.field.replace("_", "-")

    @property
    def dest(self) -> str:
        return "workerstart_" + self.field

    @property
    def env_name(self) -> str | None:
        return "WORKERSTART_" + self.field.upper() if self.env else None

    @property
    def ini_name(self) -> str | None:
        return (self.ini_key or self.dest) if self.ini else None

    def as_args(self, value: Any) -> list[str]:
        """``value`` as this option's command-line arguments."""
        if self.kind == "flag":
            return [self.flag] if value else []
        if self.kind == "list":
            return [f"{self.flag}={v}" for v in value]
        shown = str(value).lower() if isinstance(value, bool) else f"{value:g}" if isinstance(value, float) \
            else str(value)
        return [f"{self.flag}={shown}"]


OPTIONS: tuple[Option, ...] = (
    Option("loader", values.text, "reference", metavar="SPEC",
           help="loader under test: reference, torch, torchdata or module:attribute"),
    Option("parallelism_kwarg", values.text, None, metavar="NAME",
           help="keyword that sets start parallelism ('none': the loader has no parallel start)"),
    Option("capability", values.capabilities, (), metavar="NAME=VALUE", kind="list", ini_type="linelist",
           ini_key="workerstart_capabilities",
           help="declare or override a capability, e.g. parallel_start=spawn,forkserver (repeatable)"),
    Option("context", values.contexts, None, metavar="LIST",
           help="comma-separated contexts to check (default: every context the platform offers)", in_reproduce=False),
    Option("profile", values.profile, "full", metavar="quick|full",
           help="quick: one fault position, one p, forkserver where the clause is not about spawn"),
    Option("strict", values.boolean, False, kind="flag",
           help="also fail on fds/semaphores/shm held only through a referenced exception"),
    Option("min_speedup", values.positive_float, None, metavar="X",
           help="speed.startup threshold (default: derived from boot cost and usable cores)"),
    Option("driver_death_timeout", values.positive_float, None, metavar="S",
           help="seconds every process of a killed driver has to disappear (default: 5 s for a worker's "
                "poll of its parent, then the failure patience, max(5 s, 2 x the boot cost measured in the run))"),
    Option("exit_timeout", values.positive_float, 5.0, metavar="S",
           help="seconds after the loader's end (exhaustion, break, del) for its processes and threads to go "
                "(leaks.clean_exit; failure paths keep their own, documented patience)"),
    Option("step_timeout", values.positive_float, None, metavar="S",
           help="deadline of each step that waits on the loader (iter(), a batch) in in-process checks "
                "(default: derived from the boot cost measured at session start)"),
    Option("memory_limit", values.positive_float, None, metavar="GIB",
           help="memory (GiB of PSS, summed over the driver and its workers) a step that waits on the loader "
                "may reach before it is stopped and the check fails (default: half of this machine's memory, "
                "shared by the scenarios that run at once)"),
    Option("scenario_jobs", values.jobs, None, metavar="N|auto",
           help="fresh-interpreter scenarios of consecutive correctness checks that may run at once (1: one at a "
                "time; auto: 2 where at least 2 cores are usable, 1 under xdist); speed trials always run alone",
           in_reproduce=False),
    Option("circuit_breaker", values.count, 3, metavar="N",
           help="after N checks in a row fail the same way (a hang, the same error at the same step), "
                "report the rest as not run (0: never)", in_reproduce=False),
    Option("failure_runs", values.count, 2, metavar="N",
           help="runs in all of a check when its first run fails (not the speed checks, an explored case, nor a "
                "hang the suite stopped in its own process): one that then passes fails as 'unstable: failed k "
                "of n', never passes (1: no second run)"),
    Option("preflight", values.boolean, True, metavar="BOOL",
           help="first build the loader and fetch one batch in a scenario process; stop saying why if that fails"),
    Option("explore", values.seconds, None, metavar="SECONDS",
           help="seconds each explorable check may spend per context drawing and judging further points of its "
                f"space (fork, forkserver; {SPAWN_NOTE}); 0: its fixed corners only "
                f"(default: 0 in the quick profile, {DEFAULT_EXPLORE_S:g} in full)"),
    Option("explore_points", values.count, None, metavar="N",
           help="draw exactly N points per explorable check and context (spawn too) instead of spending "
                "--workerstart-explore's seconds, and shrink a failure within 3N more: with "
                "--workerstart-explore-seed, the same points on any machine, however loaded; 0: corners only"),
    Option("explore_shrink_points", values.count, None, metavar="N",
           help="judge at most N simpler points when shrinking an explored failure (default: 3 x "
                "--workerstart-explore-points, else --workerstart-explore's time; 0: the failing point as drawn)",
           in_reproduce=False),
    Option("explore_seed", values.count, None, metavar="N",
           help="seed of the explorer's draws (default: a new one each run, recorded per case in the verdict)"),
    Option("replay", values.point, None, metavar="POINT",
           help="judge exactly POINT (e.g. N=4,p=3) in the explored cases instead of exploring: what a failed "
                "case's reproduce command passes", in_reproduce=False),
    Option("xfail", values.xfail_file, (), metavar="FILE",
           help="file of expected failures: one 'check.id[context-case]: reason' per line (context, case optional)",
           in_reproduce=False),
    Option("baseline", values.baseline_name, None, metavar="VERDICT",
           help="show beside each case what a baseline got: 'torch' (the torch verdict shipped with the package) "
                "or a verdict file; the summary separates failures the baseline shares from new ones",
           in_reproduce=False),
    Option("json", values.json_path, None, metavar="PATH", in_verdict=False,
           help="write a machine-readable verdict to PATH (rewritten as each check finishes)", in_reproduce=False),
    Option("repro", values.directory, None, metavar="DIR", in_verdict=False, in_reproduce=False,
           help="write into DIR, for each failed check that has one, a standalone reproducer script "
                "(torch and the standard library only; exit 1 on the loader judged, 0 on one that meets the clause)"),
)
BY_FIELD = {o.field: o for o in OPTIONS}


@dataclasses.dataclass(frozen=True)
class Settings:
    """The resolved options of one run; checks see it as ``check_env.settings``."""

    loader: str
    parallelism_kwarg: str | None
    capability: tuple[str, ...]
    context: tuple[str, ...] | None  # None: every available context
    profile: str
    strict: bool
    min_speedup: float | None
    driver_death_timeout: float | None
    exit_timeout: float
    step_timeout: float | None
    memory_limit: float | None
    scenario_jobs: int | None  # None: auto
    circuit_breaker: int
    failure_runs: int
    preflight: bool
    explore: float | None  # None: the profile's default (explore_budget)
    explore_points: int | None  # None: a time budget (explore_budget)
    explore_shrink_points: int | None  # None: derived from explore_points or the time budget
    explore_seed: int | None
    replay: str | None
    xfail: tuple[tuple[str, str | None, str], ...]
    baseline: str | None
    json: Path | None
    repro: Path | None
    #: option field -> where its value came from ("--workerstart-x", "$WORKERSTART_X", "ini", "default")
    sources: tuple[tuple[str, str], ...] = ()

    @property
    def json_path(self) -> Path | None:
        return self.json

    @property
    def explore_budget(self) -> float:
        """Seconds of exploration per explorable check and context (0: corners only)."""
        if self.explore is not None:
            return self.explore
        return 0.0 if self.profile == "quick" else DEFAULT_EXPLORE_S

    @property
    def explores(self) -> bool:
        """Whether the explorable checks draw points beyond their corners."""
        return self.explore_points > 0 if self.explore_points is not None else self.explore_budget > 0

    @property
    def xfails(self) -> dict[tuple[str, str | None], str]:
        return {(i, c): r for i, c, r in self.xfail}

    def for_verdict(self) -> dict[str, Any]:
        """Every option that can change a verdict, with its source."""
        out: dict[str, Any] = {}
        for opt in OPTIONS:
            if not opt.in_verdict:
                continue
            value = getattr(self, opt.field)
            if opt.field == "xfail":
                value = [f"{i}[{c}]: {r}" if c else f"{i}: {r}" for i, c, r in value]
            elif isinstance(value, tuple):
                value = list(value)
            out[opt.field] = value
        out["sources"] = dict(self.sources)
        return out

    def as_args(self) -> list[str]:
        """The command-line options that give a rerun of one case these settings, whatever
        their source (command line, environment, ini): each differing from its default."""
        args = []
        for opt in OPTIONS:
            value = getattr(self, opt.field)
            if opt.in_reproduce and (value != opt.default or opt.field == "loader"):
                args += opt.as_args(value)
        return args


SETTINGS = pytest.StashKey[Settings]()


def add_options(parser: pytest.Parser) -> None:
    """Register every option as a flag and (where it has one) an ini key."""
    group = parser.getgroup("workerstart", "worker-start conformance suite (pytest-workerstart)")

    group.addoption("--workerstart", action="store_true", default=False,
                    help="collect and run the worker-start conformance suite (in addition to any paths given); "
                         f"its checks: {', '.join(registry.CHECKS)}")
    for opt in OPTIONS:
        where = [opt.flag]
        if opt.env_name:
            where.append("$" + opt.env_name)
        if opt.ini_name:
            where.append(f"ini {opt.ini_name}")
        default = "" if opt.default in (None, (), False) else f"; default {opt.default}"
        text = f"{opt.help} (precedence: {' > '.join(where)}{default})"
        if opt.kind == "flag":
            group.addoption(opt.flag, action="store_true", default=None, dest=opt.dest, help=text)
        elif opt.kind == "list":
            group.addoption(opt.flag, action="append", default=None, dest=opt.dest, metavar=opt.metavar, help=text)
        else:
            group.addoption(opt.flag, default=None, dest=opt.dest, metavar=opt.metavar, help=text)
        if opt.ini_name:
            parser.addini(opt.ini_name, opt.help, type=opt.ini_type, default=None)


def _ini_where(config: pytest.Config, name: str) -> str:
    where = f"ini {name}"
    if config.inipath is not None:
        where += f" ({config.inipath})"
    return where


def _sources(config: pytest.Config, opt: Option) -> list[tuple[Any, str]]:
    """Raw values of ``opt`` with where each came from, highest precedence first."""
    found = []
    cli = config.getoption(opt.dest, default=None)
    if cli not in (None, []):
        found.append((cli, opt.flag))
    if opt.env_name and os.environ.get(opt.env_name, "").strip():
        env = os.environ[opt.env_name]
        found.append((env.split(";") if opt.kind == "list" else env, "$" + opt.env_name))
    if opt.ini_name:
        where = _ini_where(config, opt.ini_name)
        try:
            ini = config.getini(opt.ini_name)
        except ValueError as exc:  # pytest's own bool parsing
            raise values.usage_error(where, str(exc)) from None
        if ini not in (None, [], ""):
            found.append((ini, where))
    return found


def resolve(config: pytest.Config) -> Settings:
    """Resolve every option once; a bad value raises one :class:`pytest.UsageError`.

    A repeatable option accumulates ini, then environment, then command-line
    entries (a later entry for the same name wins); every other option takes
    its highest-precedence value.
    """
    values: dict[str, Any] = {}
    sources: list[tuple[str, str]] = []
    for opt in OPTIONS:
        found = _sources(config, opt)
        if not found:
            values[opt.field] = opt.default
            sources.append((opt.field, "default"))
        elif opt.kind == "list":
            values[opt.field] = tuple(v for raw, where in reversed(found) for v in opt.convert(raw, where))
            sources.append((opt.field, " + ".join(where for _, where in reversed(found))))
        else:
            raw, where = found[0]
            values[opt.field] = opt.convert(raw, where)
            sources.append((opt.field, where))
    return Settings(**values, sources=tuple(sources))


def in_xdist_worker() -> bool:
    """Whether this process is a pytest-xdist worker (xdist runs checks side by side already)."""
    return bool(os.environ.get("PYTEST_XDIST_WORKER"))


def runs_checks(config: pytest.Config) -> bool:
    """Whether this pytest process runs checks itself: not a collection only, nor the xdist
    controller (its workers do). What a preflight, and a zygote started ahead for it, serve."""
    xdist_controller = bool(getattr(config.option, "numprocesses", None)) and not in_xdist_worker()
    return not config.option.collectonly and not xdist_controller
