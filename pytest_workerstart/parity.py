"""The differential judge of the data-path clauses: the loader under test against torch's own
``DataLoader`` built with the same arguments, at one point.

Both iterate the point's dataset for its epochs; the batches (values, structure and Python
types), their order and count, and what each worker did (its id, seed and pid, and one draw
from torch, ``random`` and NumPy per sample: :mod:`pytest_workerstart.parity_data`)
are compared. Every difference is attributed to the clause it breaks and says what differed:
the epoch, the first differing batch, expected against got (shortened), an exception's type
and message. torch's run is the truth; it runs in the check's context, or under the suite's
preloaded forkserver where that is spawn (torch's batches do not depend on the start method,
and spawned truths would double the boots).

One observation per loader, context and point serves every clause that judges the point
(:func:`differences`), and one torch run per start method and point every loader judged in
the session; the clause's check keeps its own differences (:func:`judge`).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import tempfile
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from pytest_workerstart import explore
from pytest_workerstart.harness.forkserver import warm_forkserver
from pytest_workerstart.parity_data import dataset_of, loader_kwargs, read_records
from pytest_workerstart.point import Point
from pytest_workerstart.probes import tensor_origin
from pytest_workerstart.probes.deadline import StepAborted, deadline
from pytest_workerstart.probes.faults import FaultPlan
from pytest_workerstart.verdict import record_measurements

#: The clauses the judge attributes differences to, with what each judges.
CLAUSES = {
    "digest.first_batch": "the batches' content: each sample is the dataset's, collated as torch does",
    "digest.torch_parity": "an argument torch's DataLoader refuses (or takes) is refused (or taken) alike",
    "sharding.exactly_once": "every epoch serves torch's samples once: none lost, none repeated",
    "order.registration": "batch k comes from the worker torch's DataLoader takes it from",
    "order.epoch_shuffle": "the batches come in torch's order (the sampler's, the generator's)",
    "order.worker_seeds": "each worker has torch's seed (base_seed + worker_id)",
    "order.rng_streams": "what user code draws from torch, random and NumPy in a worker is torch's",
    "persistent.reuse": "persistent workers serve every epoch: no more worker processes than torch's",
    "prefetch.bound": "fetched but unconsumed samples never exceed prefetch_factor x num_workers batches",
    "transfer.shared_memory": "a tensor torch delivers in shared memory arrives in a segment a worker created",
}
#: Seconds between the start slots of consecutive workers in a scheduled start.
SCHEDULE_STEP_S = 0.2
#: torch's global generator's seed for both loaders of a point with gen=none.
GLOBAL_SEED = 20261206
#: Characters of a batch shown in a reason.
SHOWN = 120


# --- what a run shows ----------------------------------------------------------------------


def form(obj: Any) -> Any:
    """A batch as hashable data: every container's type, every leaf's type and value."""
    import numpy as np
    import torch

    if isinstance(obj, torch.Tensor):
        return ("Tensor", str(obj.dtype).removeprefix("torch."), tuple(obj.shape), _frozen(obj.tolist()))
    if isinstance(obj, np.ndarray):
        return ("ndarray", obj.dtype.str, obj.shape, _frozen(obj.tolist()))
    if isinstance(obj, np.generic):
        return (type(obj).__name__, obj.item())
    if obj is None or isinstance(obj, (str, bytes, int, float, bool)):
        return (type(obj).__name__, obj)
    if isinstance(obj, Mapping):
        return (type(obj).__name__, "mapping", tuple((k, form(v)) for k, v in obj.items()))
    if isinstance(obj, (list, tuple)):
        return (type(obj).__name__, "sequence", tuple(form(v) for v in obj))
    return (type(obj).__name__, repr(obj))


def _frozen(value: Any) -> Any:
    return tuple(_frozen(v) for v in value) if isinstance(value, list) else value


def show(f: Any, width: int = SHOWN) -> str:
    """A batch's form as a reader would write it, shortened to ``width`` characters."""
    text = _show(f)
    return text if len(text) <= width else text[:width - 3] + "..."


def _show(f: Any) -> str:
    kind = f[0]
    if kind in ("Tensor", "ndarray"):
        values = _thawed(f[3])
        return f"tensor({values}, {f[1]})" if kind == "Tensor" else f"ndarray({values}, {f[1]})"
    if len(f) == 3 and f[1] == "mapping":
        inner = ", ".join(f"{k!r}: {_show(v)}" for k, v in f[2])
        return "{" + inner + "}" if kind == "dict" else f"{kind}({{{inner}}})"
    if len(f) == 3 and f[1] == "sequence":
        inner = ", ".join(_show(v) for v in f[2])
        if kind == "list":
            return f"[{inner}]"
        return f"({inner}{',' if len(f[2]) == 1 else ''})" if kind == "tuple" else f"{kind}({inner})"
    return repr(f[1]) if kind in ("str", "bytes", "int", "float", "bool", "NoneType") else f"{kind}({f[1]!r})"


def _thawed(value: Any) -> Any:
    return [_thawed(v) for v in value] if isinstance(value, tuple) else value


@dataclasses.dataclass
class Observation:
    """What one loader did at one point (plain data: no batch, no loader)."""

    #: per epoch, each batch's :func:`form`
    epochs: list[list[Any]] = dataclasses.field(default_factory=list)
    #: per epoch, the side channel's records (index, worker, seed, pid, torch, random, numpy)
    records: list[list[tuple]] = dataclasses.field(default_factory=list)
    #: where it raised, the exception's type and message (None: it did not)
    error: tuple[str, str, str] | None = None
    #: the most fetched-but-unconsumed samples seen after a batch
    inflight: int = 0
    #: per epoch, for each tensor of its first batch: (path, in shared memory, created by: worker|driver|other)
    tensors: list[list[tuple[str, bool, str]]] = dataclasses.field(default_factory=list)


def _tensors(batch: Any, workers: set[int]) -> list[tuple[str, bool, str]]:
    import torch

    out = []

    def walk(obj, path):
        if isinstance(obj, torch.Tensor):
            creator = tensor_origin.creator_pid(obj) if obj.is_shared() else None
            origin = "driver" if creator == os.getpid() else "worker" if creator in workers else "other"
            out.append((path or "batch", obj.is_shared(), origin))
        elif isinstance(obj, Mapping):
            for k, v in obj.items():
                walk(v, f"{path}[{k!r}]")
        elif isinstance(obj, (list, tuple)):
            for k, v in enumerate(obj):
                walk(v, f"{path}[{k}]")

    walk(batch, "")
    return out


def run(make: Callable[[str], Any], point: Point, log_dir: str, *, workers: Callable[[], set[int]]) -> Observation:
    """Iterate the loader ``make(log_dir)`` builds for the point's epochs; what it raises is recorded,
    not raised (a stopped step, a skip or an interrupt goes through)."""
    obs, offsets, where = Observation(), {}, "building the loader"
    per_batch = point.batch_size or 1
    try:
        loader = make(log_dir)
        for epoch in range(1, point.epochs + 1):
            where = f"epoch {epoch}: iter()"
            it = iter(loader)
            batches, records, consumed = [], [], 0
            while True:
                where = f"epoch {epoch}: batch {len(batches)}"
                try:
                    batch = next(it)
                except StopIteration:
                    break
                records += read_records(log_dir, offsets)
                if not batches:  # the workers: the context's, and the processes that fetched samples
                    obs.tensors.append(_tensors(batch, workers() | {r[3] for r in records}))
                batches.append(form(batch))
                del batch
                consumed += per_batch  # at most: the in-flight count is never above the truth
                obs.inflight = max(obs.inflight, len(records) - consumed)
            del it
            obs.epochs.append(batches)
            obs.records.append(records + read_records(log_dir, offsets))
        del loader
    except Exception as exc:  # the loader's error is an observation; a stopped step goes through
        obs.error = (where, type(exc).__name__, (str(exc).strip().splitlines() or [""])[0][:200])
    return obs


# --- what differs ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Difference:
    clause: str
    text: str


def _first_unequal(a: list, b: list) -> int:
    return next((k for k in range(max(len(a), len(b))) if k >= len(a) or k >= len(b) or a[k] != b[k]), 0)


def _at(batches: list, k: int) -> str:
    return show(batches[k]) if k < len(batches) else "nothing (the epoch had ended)"


def _draws(r: tuple) -> str:
    return f"torch {r[4]}, random {r[5]}, numpy {r[6]}"


def compare(point: Point, truth: Observation, got: Observation) -> list[Difference]:
    """Every difference between torch's run (``truth``) and the loader's, under the clause it breaks."""
    out: list[Difference] = []

    def add(clause: str, text: str) -> None:
        out.append(Difference(clause, text))

    if truth.error != got.error:
        if got.error is None:
            add("digest.torch_parity", f"torch's DataLoader raises {truth.error[1]}: {truth.error[2]!r} at "
                                       f"{truth.error[0]}; the loader did not raise")
        elif truth.error is None:  # what the loader did not serve, no clause can judge
            for clause in CLAUSES:
                add(clause, f"{got.error[0]}: the loader raised {got.error[1]}: {got.error[2]!r}; torch's "
                            "DataLoader serves every batch")
        elif truth.error[:2] != got.error[:2]:
            add("digest.torch_parity", f"the loader raised {got.error[1]}: {got.error[2]!r} at {got.error[0]}; "
                                       f"torch's DataLoader raises {truth.error[1]}: {truth.error[2]!r} at "
                                       f"{truth.error[0]}")
    for e in range(min(len(truth.epochs), len(got.epochs))):
        _compare_epoch(point, e + 1, truth, got, add)
    bound = (point.prefetch_factor or 2) * point.num_workers * (point.batch_size or 1)
    if got.inflight > max(bound, truth.inflight):
        add("prefetch.bound", f"{got.inflight} samples were fetched beyond those consumed; at most prefetch_factor "
                              f"{point.prefetch_factor or 2} x {point.num_workers} workers x {point.batch_size or 1} "
                              f"per batch = {bound} may be")
    if point.persistent_workers:
        pids = [len({r[3] for ep in obs.records for r in ep}) for obs in (truth, got)]
        if pids[1] > pids[0]:
            add("persistent.reuse", f"{pids[1]} worker processes served the {point.epochs} epochs of one loader with "
                                    f"persistent_workers; torch's DataLoader uses {pids[0]}")
    for e, (want, have) in enumerate(zip(truth.tensors, got.tensors, strict=False), 1):
        have_at = {path: (shared, origin) for path, shared, origin in have}
        for path, shared, _ in want:
            if not shared or path not in have_at:
                continue
            arrived, origin = have_at[path]
            if not arrived or origin != "worker":
                how = "was copied (not in shared memory)" if not arrived else \
                    f"is in shared memory the {origin} process created: copied, then moved"
                add("transfer.shared_memory", f"epoch {e}, batch 0: {path} {how}; torch's DataLoader delivers it "
                                              "in shared memory a worker created")
                break
    return out


def _fetched_batches(point: Point, records: list[tuple]) -> collections.Counter:
    """The index tuples of the batches the workers fetched: a task's samples are fetched one
    after another by one worker, so each worker's records cut into batches of the point's size
    (its last one short) are its tasks, whatever order the batches then arrive in."""
    size, out, by_pid = point.batch_size or 1, collections.Counter(), {}
    for r in records:
        by_pid.setdefault(r[3], []).append(r[0])
    for indices in by_pid.values():
        out.update(tuple(indices[k:k + size]) for k in range(0, len(indices), size))
    return out


def _shuffled(point: Point) -> bool:
    return bool(point.shuffle) or point.sampler in ("random", "subset")


def _per_worker(records: list[tuple]) -> collections.Counter:
    """What each worker fetched, in its order, whichever id it has: equal for two runs that
    differ only in which worker is called which, or in the order their batches are served."""
    by_pid: dict = {}
    for r in records:
        by_pid.setdefault(r[3], []).append(r[0])
    return collections.Counter(tuple(v) for v in by_pid.values())


def _another_selection(point: Point, fetched: collections.Counter, truth: collections.Counter) -> bool:
    """Whether a shuffled point's samples differ from torch's only as another permutation's
    selection would: as many, none twice, all of the dataset (what drop_last keeps of a
    permutation, or a subset sampler's draw, depends on the order)."""
    return (_shuffled(point) and fetched.total() == truth.total() and max(fetched.values(), default=0) <= 1
            and all(0 <= i < (point.length or 0) for i in fetched))


def _compare_epoch(point: Point, e: int, truth: Observation, got: Observation, add) -> None:
    want, have = truth.epochs[e - 1], got.epochs[e - 1]
    tr, gr = truth.records[e - 1], got.records[e - 1]
    fetched, true_fetched = collections.Counter(r[0] for r in gr), collections.Counter(r[0] for r in tr)
    worker_of, got_worker = {r[0]: r[1] for r in tr}, {r[0]: r[1] for r in gr}
    moved = sorted(i for i, w in got_worker.items() if worker_of.get(i, w) != w) \
        if point.in_order is not False and point.dataset != "iterable" else []
    why = (f"sample {moved[0]} was fetched by worker {got_worker[moved[0]]}, in torch's DataLoader by worker "
           f"{worker_of[moved[0]]}") if moved else ""
    if fetched != true_fetched:
        extra, missing = sorted((fetched - true_fetched).elements()), sorted((true_fetched - fetched).elements())
        said = (f"the loader's workers fetched {len(extra)} samples torch's DataLoader does not {extra[:8]} and "
                f"not {len(missing)} it does {missing[:8]} ({fetched.total()} fetched, torch {true_fetched.total()})")
        if _another_selection(point, fetched, true_fetched):
            add("order.epoch_shuffle", f"epoch {e}: {said}: as many distinct samples, another selection of a "
                                       "shuffled order (drop_last drops its tail): the order is not torch's")
        else:
            add("sharding.exactly_once", f"epoch {e}: {said}")
    elif (batched := _fetched_batches(point, gr)) != (true_batched := _fetched_batches(point, tr)):
        odd = sorted(batched - true_batched)[:3]
        clause = "sharding.exactly_once" if point.dataset == "iterable" else "order.epoch_shuffle"
        add(clause, f"epoch {e}: the same samples, batched otherwise: the loader's workers fetched batches of "
                    f"indices {odd} that torch's DataLoader does not form (it forms {sorted(true_batched)[:3]}...)")
    elif collections.Counter(want) != collections.Counter(have):
        counts = collections.Counter(want)
        foreign = next((k for k, b in enumerate(have) if b not in counts), None)
        if foreign is not None:
            add("digest.first_batch", f"epoch {e}, batch {foreign}: got {_at(have, foreign)}, which torch's "
                                      f"DataLoader does not serve in this epoch; its batch {foreign} is "
                                      f"{_at(want, foreign)} (the same samples were fetched, in the same batches)")
        else:
            missing = collections.Counter(want) - collections.Counter(have)
            extra = collections.Counter(have) - collections.Counter(want)
            k = _first_unequal(want, have)
            add("sharding.exactly_once", f"epoch {e}: {len(have)} batches, torch's DataLoader serves {len(want)}: "
                                         f"{missing.total()} of its batches missing, {extra.total()} served again; "
                                         f"batch {k}: expected {_at(want, k)}, got {_at(have, k)}")
    elif want != have and point.in_order is not False:
        k = _first_unequal(want, have)
        clause = "order.registration" if moved or point.dataset == "iterable" else "order.epoch_shuffle"
        if _shuffled(point) and _per_worker(gr) != _per_worker(tr):
            clause = "order.epoch_shuffle"  # another permutation: which worker fetches a sample follows it
        shown = "; " + why if why and clause == "order.registration" else ""
        add(clause, f"epoch {e}, batch {k}: expected {_at(want, k)}, got {_at(have, k)} (the same batches in "
                    f"another order{shown})")
    elif moved:
        add("order.registration", f"epoch {e}: the same batches in torch's order, from other workers: {why}")
    else:  # what a worker drew follows from its seed and from the samples it fetched: judged where those are torch's
        if not _compare_seeds(e, tr, gr, add):
            _compare_draws(point, e, tr, gr, add)
        return
    _compare_seeds(e, tr, gr, add)  # a worker's seed does not depend on which samples it fetched


def _compare_seeds(e: int, tr: list[tuple], gr: list[tuple], add) -> bool:
    """Whether a worker's seed differs from torch's (base_seed + worker_id): said if so."""
    seeds = {r[1]: r[2] for r in tr}
    wrong = sorted((w, s) for w, s in {r[1]: r[2] for r in gr}.items() if w in seeds and seeds[w] != s)
    if wrong:
        w, s = wrong[0]
        add("order.worker_seeds", f"epoch {e}: worker {w} has seed {s}; torch's DataLoader gives it {seeds[w]} "
                                  f"(base_seed + worker_id)")
    return bool(wrong)


def _compare_draws(point: Point, e: int, tr: list[tuple], gr: list[tuple], add) -> None:
    if point.in_order is not False:
        by_index = {r[0]: r for r in tr}
        drew = next((r for r in sorted(gr) if r[0] in by_index and r[1] == by_index[r[0]][1]
                     and r[4:] != by_index[r[0]][4:]), None)
        if drew is not None:
            add("order.rng_streams", f"epoch {e}, sample {drew[0]} (worker {drew[1]}): user code drew {_draws(drew)}; "
                                     f"in torch's DataLoader {_draws(by_index[drew[0]])}")


# --- one point, both loaders ------------------------------------------------------------------

OBSERVED = pytest.StashKey[dict]()
#: torch's truth per (start method, point): the same whichever loader is judged against it
TRUTHS = pytest.StashKey[dict]()


def schedule_plan(point: Point) -> FaultPlan | None:
    """The point's start schedule as start slots a step apart, every iterator's starts alike
    (:meth:`FaultPlan.start_schedule`). None where starts do not overlap (p <= 1: the slots
    would only hold the serial starts back)."""
    if point.schedule is None or not point.parallelism or point.parallelism <= 1:
        return None
    return FaultPlan.start_schedule(point.schedule, SCHEDULE_STEP_S)


@contextlib.contextmanager
def _seeded_globally(point: Point):
    """With gen=none both loaders draw from torch's global generator: seeded alike for each run,
    and put back after (the test process's stream is not the suite's to change)."""
    if point.generator is not None:
        yield
        return
    import torch

    state = torch.get_rng_state()
    torch.manual_seed(GLOBAL_SEED)
    try:
        yield
    finally:
        torch.set_rng_state(state)


@contextlib.contextmanager
def _no_accelerator_warning():
    import warnings

    with warnings.catch_warnings():  # pin_memory=True without an accelerator: torch's note, not the loader's
        warnings.filterwarnings("ignore", message=".*pin_memory.*")
        yield


def _truth(env, point: Point) -> Observation:
    """torch's run at ``point`` in the check's context, once per session (a batch of loaders, or
    one loader's contexts that share a start method, is judged against one run)."""
    method = "forkserver" if env.context_name == "spawn" else env.context_name
    truths = env.request.config.stash.setdefault(TRUTHS, {})
    if (method, point) not in truths:
        truths[(method, point)] = _torch_run(env, point, method)
    return truths[(method, point)]


def _torch_run(env, point: Point, method: str) -> Observation:
    import multiprocessing

    from torch.utils.data import DataLoader

    if method == "forkserver":
        warm_forkserver()
    ctx = multiprocessing.get_context(method)

    def make(log_dir: str):
        return DataLoader(dataset_of(point, log_dir), num_workers=point.num_workers, multiprocessing_context=ctx,
                          **loader_kwargs(point))

    bound = env.step_timeout(point.num_workers)
    with tempfile.TemporaryDirectory(prefix="ws-parity-") as d, _seeded_globally(point), _no_accelerator_warning(), \
            deadline("torch's DataLoader (the truth)", None if bound is None else bound * (2 + point.epochs)):
        return run(make, point, d, workers=set)


def _loader_run(env, point: Point, ctx) -> Observation:

    def make(log_dir: str):
        return env.make(dataset_of(point, log_dir), num_workers=point.num_workers, ctx=ctx,
                        parallelism=point.parallelism, **loader_kwargs(point))

    with tempfile.TemporaryDirectory(prefix="ws-parity-") as d, _seeded_globally(point), _no_accelerator_warning():
        return run(make, point, d, workers=lambda: {r.pid for r in ctx.records() if r.pid})


def differences(env, point: Point) -> list[Difference]:
    """What differs at ``point`` between the loader and torch's DataLoader, observed once per loader,
    context and point in the session. A step the suite stopped (a hang, too much memory) is a
    difference too, under digest.first_batch: the loader served no batch there."""
    cache = env.request.config.stash.setdefault(OBSERVED, {})
    key = (env.loader.spec, env.context_name, point)
    if key in cache:  # observed for an earlier case: the verdict says where, and who forked its workers
        origin, forked_by, diffs = cache[key]
        if origin != env.request.node.nodeid:
            record_measurements(env.request.node, observed_in=origin,
                                **({"workers_forked_by": forked_by} if forked_by else {}))
        return diffs
    truth = _truth(env, point)
    ctx = env.context(point.num_workers, faults=schedule_plan(point))
    try:
        diffs = compare(point, truth, _loader_run(env, point, ctx))
    except StepAborted as exc:
        diffs = [Difference("digest.first_batch", (exc.msg.splitlines() or [""])[0])]
    cache[key] = (env.request.node.nodeid, sorted(ctx.forked_by()), diffs)
    return diffs


def judge(env, point: Point, clause: str) -> None:
    """Fail with what differs at ``point`` under ``clause`` (the first difference on the first line)."""
    mine = [d.text for d in differences(env, point) if d.clause == clause]
    if mine:
        more = f" (and {len(mine) - 1} more)" if len(mine) > 1 else ""
        pytest.fail(f"{mine[0]}{more}" + "".join(f"\n{t}" for t in mine[1:8]), pytrace=False)


def survey(env, point: Point) -> None:
    """Observe ``point`` for every clause of the data path; never fails."""
    differences(env, point)


def judge_case(env, case: str) -> None:
    """The running data-path check's ``ws_point`` case, judged by the differential judge."""
    clause = env.request.node.get_closest_marker("workerstart_check").args[0]
    if clause in TORCH_SEMANTICS and not env.loader.has("torch_parity"):
        pytest.skip(f"the loader declares torch_parity=false: {CLAUSES[clause]} is torch's semantics")
    explore.judge_case(env, case, lambda point: judge(env, point, clause), survey=lambda point: survey(env, point))


#: What only a loader that declares torch's semantics is judged on.
TORCH_SEMANTICS = ("order.epoch_shuffle", "order.worker_seeds", "order.rng_streams", "digest.torch_parity")
