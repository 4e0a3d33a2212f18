"""Order clause: registration order and per-worker seeds survive any start order, and
the index and random streams stay right epoch after epoch.

Adversarial timing: the instrumented context delays ``start()`` of worker i by
(N-1-i) x 0.4 s, so under parallel start worker N-1 finishes first and worker 0
last (not at p = 1, where the delays would only add up). What each worker did is
observed through ``get_worker_info()`` and ``torch.initial_seed()`` recorded in the
samples themselves.

Truths come from torch, not from the loader under test: the index stream of
torch's ``DataLoader`` for the same dataset, and torch's worker seeds
(``base_seed + worker_id``, with ``base_seed`` the first draw from the
loader's generator, as torch defines it; see
:func:`pytest_workerstart._torch_internals.torch_worker_seeds`).

``order.epoch_shuffle`` and ``order.rng_streams`` judge one observation of several
configurations over three epochs (:mod:`pytest_workerstart.conformance.order.streams`), made once per
context for both; their truth is torch's ``DataLoader`` run in a fresh process.
"""

import pytest
import torch
from torch.utils.data import DataLoader

from pytest_workerstart import _torch_internals, parity, scenarios
from pytest_workerstart.bounded import batches_of
from pytest_workerstart.conformance.order import streams as epochs
from pytest_workerstart.conformance.order.streams import order_problems, rng_problems
from pytest_workerstart.datasets import WorkerTagDataset
from pytest_workerstart.harness.runner import run_scenario
from pytest_workerstart.probes.faults import FaultPlan
from pytest_workerstart.verdict import record_measurements

check = pytest.mark.workerstart_check
N = 3
SEEDS = pytest.StashKey[dict]()


GENERATOR_SEEDS = (1234, 4321)
ITEMS = 8 * N


def _tagged(check_env, p, generator_seed=GENERATOR_SEEDS[0]) -> dict:
    """One epoch of a worker-tagged dataset (batch 2, unshuffled, the generator seeding the
    workers) while worker i's start is delayed so the last finishes first: judged by
    ``order.registration`` and ``order.worker_seeds``."""
    def run() -> dict:
        # one start at a time cannot finish out of order: p = 1 runs undelayed
        ctx = check_env.context(N, faults=None if p == 1 else FaultPlan.reverse_finish(N))
        loader = check_env.make(WorkerTagDataset(ITEMS), num_workers=N, ctx=ctx, parallelism=p,
                                generator=torch.Generator().manual_seed(generator_seed))
        batches = batches_of(loader)
        seeds: dict[int, set] = {}
        for b in batches:
            for w, seed in zip(b["worker"].tolist(), b["seed"].tolist(), strict=True):
                seeds.setdefault(int(w), set()).add(int(seed))
        return {"served": [b["worker"].tolist() for b in batches],
                "indices": [int(i) for b in batches for i in b["index"]],
                "seeds": {w: sorted(s) for w, s in sorted(seeds.items())}, "start_order": ctx.start_order()}

    return check_env.observe("one epoch with reversed start delays", run, p, generator_seed)


@check("order.registration", "batch k comes from worker k mod N whatever order starts finish in",
       requires=("in_order",))
def test_registration(check_env):
    """with adversarial start delays (worker N-1 finishes first, worker 0 last) batch k comes from worker k mod N,
    and the index stream equals torch's `DataLoader`'s for the same dataset (not the loader's own)

    Observed by: `get_worker_info().id` recorded in every sample; the run is the one `order.worker_seeds` judges
    at p = N
    """
    got = _tagged(check_env, check_env.parallelism(N))
    wrong = [(k, s) for k, s in enumerate(got["served"]) if set(s) != {k % N}]
    assert not wrong, (
        f"batch k must come from worker k mod {N} (start order was {got['start_order']}); "
        f"mismatches (batch, workers): {wrong[:6]}")
    truth = [int(i) for b in DataLoader(WorkerTagDataset(ITEMS), batch_size=2) for i in b["index"]]
    assert got["indices"] == truth, (
        f"the index stream {got['indices'][:8]}... differs from torch's DataLoader's {truth[:8]}...")


def _seeds(check_env, p, generator_seed=GENERATOR_SEEDS[0]):
    return _tagged(check_env, p, generator_seed)["seeds"]


@check("order.worker_seeds", "per-worker seeds do not depend on parallelism or context")
def test_worker_seeds(check_env):
    """per-worker `torch.initial_seed()` is the same for p=1 and p=N and across contexts, distinct across workers,
    follows the loader's generator (two generator seeds give different worker seeds) and equals torch's
    `base_seed + worker_id` (unless `torch_parity=false`)

    Observed by: seeds recorded in samples (three runs, with the adversarial start delays of
    `order.registration` except at p = 1, where one start at a time cannot finish out of order; the registration
    run is one of them); cross-context comparison within the session
    """
    serial = _seeds(check_env, check_env.parallelism(1))
    assert len(serial) == N and all(len(s) == 1 for s in serial.values()), f"one seed per worker expected: {serial}"
    flat = [s[0] for s in serial.values()]
    assert len(set(flat)) == N, f"workers share seeds: {serial}"
    if check_env.parallel_start_here:
        parallel = _seeds(check_env, N)
        assert parallel == serial, f"seeds differ between p=1 {serial} and p={N} {parallel}"
    other = _seeds(check_env, check_env.parallelism(N), GENERATOR_SEEDS[1])
    assert other != serial, (
        f"worker seeds do not follow the loader's generator: seeds {GENERATOR_SEEDS} both gave {serial}")
    if check_env.loader.has("torch_parity"):
        torch_seeds = {w: [s] for w, s in _torch_internals.torch_worker_seeds(GENERATOR_SEEDS[0], N).items()}
        assert serial == torch_seeds, (
            f"worker seeds {serial} differ from torch's base_seed + worker_id {torch_seeds} for the same generator; "
            f"declare torch_parity=false if the loader deliberately differs")
    # per loader: a project's own tests may judge several loaders in one session
    seen = check_env.request.config.stash.setdefault(SEEDS, {}).setdefault(check_env.loader.spec, {})
    for other_ctx, other in seen.items():
        assert other == serial, (
            f"seeds differ between contexts: {other_ctx} {other} vs {check_env.context_name} {serial}")
    seen[check_env.context_name] = serial


TRUTHS = pytest.StashKey[dict]()
#: torch's own streams are computed once per session, in a process forked from the zygote
TRUTH_TIMEOUT_S = 120.0


def _observe(check_env, run: epochs.Run) -> epochs.Stream:
    ds = epochs.dataset(run.kind)
    loader = check_env.make(ds, num_workers=run.num_workers, parallelism=run.parallelism,
                            **epochs.loader_kwargs(run))
    return epochs.iterate(loader)


def _streams(check_env) -> dict[epochs.Run, epochs.Stream]:
    """Every run of :func:`epochs.plan` in this context, observed once for both ids that judge them."""
    runs = epochs.plan(parallel=check_env.parallel_start_here, iterable=check_env.loader.has("iterable_dataset"),
                       persistent=check_env.loader.has("persistent_workers"))
    return check_env.observe(f"{epochs.EPOCHS} epochs of each configuration",
                             lambda: {run: _observe(check_env, run) for run in runs}, *runs)


def _truths(check_env, runs) -> dict[tuple, epochs.Stream] | None:
    """torch's streams for ``runs`` (None: the loader does not declare torch_parity)."""
    if not check_env.loader.has("torch_parity"):
        return None
    cache = check_env.request.config.stash.setdefault(TRUTHS, {})
    missing = sorted({r.truth_key for r in runs} - set(cache))
    if missing:
        res = run_scenario("pytest_workerstart.conformance.order.streams:torch_streams", {"keys": missing},
                                     timeout=TRUTH_TIMEOUT_S, env=scenarios.child_env(), warm=True)
        if res.status != "ok":
            pytest.fail(f"torch's own streams (the truth, not the loader under test) could not be computed: "
                        f"{res.details()}", pytrace=False)
        cache.update(epochs.decode(res.value))
    return cache


def _judge(check_env, problems: list[str], what: str) -> None:
    """Fail with the first problem on the summary line; the JSON keeps them all. Problems that
    hold without torch's truth come first: they are defects whatever the loader declares."""
    problems = sorted(problems, key=lambda p: "torch's" in p)
    record_measurements(check_env.request.node, problems=problems)
    if problems:
        more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
        pytest.fail(f"{what}: {problems[0]}{more}\n" + "\n".join(problems[1:8]), pytrace=False)


@check("order.epoch_shuffle", "epochs 1-3 each serve every index once, a shuffled loader's epochs differ and "
       "follow the generator, independent of p; torch's index streams where torch_parity")
def test_epoch_shuffle(check_env):
    """over epochs 1, 2 and 3 (a fresh iterator per epoch, and persistent workers reused where the loader declares
    them; `num_workers=0` and N = 2; p = N where parallel start is declared, and its p = 1 twin with persistent
    workers where declared, else fresh iterators) each epoch serves every index once, a shuffled map-style
    loader never repeats an earlier epoch's permutation, a second generator seed gives a different stream, and p
    = 1 and p = N give the same stream; with `torch_parity`, every epoch's index stream equals torch's
    `DataLoader`'s for the same arguments and an identically seeded generator (shuffled map-style
    `RngDrawDataset`, and `ShuffledShards`, an iterable dataset sharded by worker, run with workers once: with
    persistent workers where declared, since a fresh start per epoch reseeds workers alike for both kinds and
    the map-style run observes it). Observed once per context together with `order.rng_streams`

    Observed by: indices recorded in the samples; torch's streams computed by torch's `DataLoader` in a process
    forked from the suite's zygote (`conformance/order/streams.py`)
    """
    streams = _streams(check_env)
    _judge(check_env, order_problems(streams, _truths(check_env, streams)),
           f"index streams over {epochs.EPOCHS} epochs")


@check("order.rng_streams", "torch, random and NumPy as a worker's user code draws from them: different per "
       "worker, epoch and generator seed, independent of p; torch's draws where torch_parity")
def test_rng_streams(check_env):
    """in the same runs, each sample records one draw from each global generator a worker hands to user code:
    torch's, Python's `random` and NumPy's (what augmentations draw from). For each generator, the first draw of
    every (worker, epoch) differs from every other worker's in that epoch and from the same worker's in the
    other epochs (fresh iterators and persistent workers alike, as torch does), a second generator seed changes
    them, and p = 1 and p = N draw the same; with `torch_parity`, every draw of every sample equals torch's for
    the same arguments and generator (torch seeds `random` and torch with `base_seed + worker_id` and NumPy from
    both, pytorch PR #56488). NumPy is judged where it is installed

    Observed by: draws recorded in the samples; torch's, as for `order.epoch_shuffle`
    """
    streams = _streams(check_env)
    _judge(check_env, rng_problems(streams, _truths(check_env, streams)),
           f"what workers' user code drew from torch, random and NumPy over {epochs.EPOCHS} epochs")


@check("order.registration")
def test_registration_at(check_env, ws_point):
    """Batch k comes from the worker torch's DataLoader takes it from, at every point of the data path
    (pytest_workerstart.parity), whichever worker's start finishes first."""
    parity.judge_case(check_env, ws_point)


@check("order.worker_seeds")
def test_worker_seeds_at(check_env, ws_point):
    """Each worker has torch's seed at every point of the data path."""
    parity.judge_case(check_env, ws_point)


@check("order.epoch_shuffle")
def test_epoch_shuffle_at(check_env, ws_point):
    """Every epoch's batches come in torch's order at every point of the data path: its samplers,
    shuffle and generator, or torch's global generator."""
    parity.judge_case(check_env, ws_point)


@check("order.rng_streams")
def test_rng_streams_at(check_env, ws_point):
    """What user code draws from torch, random and NumPy in a worker is torch's at every point
    of the data path, with and without a worker_init_fn."""
    parity.judge_case(check_env, ws_point)
