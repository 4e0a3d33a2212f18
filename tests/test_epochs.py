"""The multi-epoch judges (``order.epoch_shuffle``, ``order.rng_streams``) on synthetic
streams: right streams pass, and each defect the checks exist for is named."""

import random

from pytest_workerstart.conformance.order import streams as epochs
from pytest_workerstart.conformance.order.streams import Run

N = epochs.WORKERS


def _stream(seed: int, *, replay=False, frozen: str | None = None, shared: str | None = None) -> epochs.Stream:
    """Epochs of a plausible loader: ``replay`` repeats epoch 1's permutation, ``frozen``
    draws that generator's values the same in every epoch, ``shared`` the same in every worker."""
    rng = random.Random(seed)
    first = rng.sample(range(epochs.LENGTH), epochs.LENGTH)
    out = []
    for e in range(epochs.EPOCHS):
        order = first if replay or e == 0 else rng.sample(range(epochs.LENGTH), epochs.LENGTH)
        rows, served = [], [0] * N
        for k, i in enumerate(order):
            w = (k // epochs.BATCH) % N
            served[w] += 1
            draws = []
            for g in epochs.GENERATORS:
                key = (seed, g, 0 if g == frozen else e, 0 if g == shared else w, served[w])
                draws.append(random.Random(repr(key)).getrandbits(62))
            rows.append((i, w, *draws))
        out.append(rows)
    return out


def _runs(**defect) -> dict[Run, epochs.Stream]:
    return {Run("map", False, N, seed, parallelism=p): _stream(seed, **defect)
            for seed in epochs.SEEDS for p in (1, N) if (seed, p) != (epochs.SEEDS[1], 1)}


def test_right_streams_pass_with_and_without_torch_truth():
    runs = _runs()
    truths = {r.truth_key: s for r, s in runs.items()}
    assert epochs.order_problems(runs, None) == [] and epochs.order_problems(runs, truths) == []
    assert epochs.rng_problems(runs, None) == [] and epochs.rng_problems(runs, truths) == []


def test_a_replayed_permutation_is_named():
    problems = epochs.order_problems(_runs(replay=True), None)
    assert any("epochs 1 and 2 repeat the same permutation" in p for p in problems), problems


def test_a_stream_that_differs_from_torchs_names_epoch_and_stream():
    runs = _runs()
    truths = {r.truth_key: s for r, s in _runs(replay=True).items()}
    problems = epochs.order_problems(runs, truths)
    assert any("epoch 2's index stream" in p and "torch's DataLoader" in p for p in problems), problems
    problems = epochs.rng_problems(runs, truths)
    assert any("epoch 2, sample 1" in p for p in problems), problems


def test_generator_seed_that_changes_nothing_is_named():
    same = _stream(epochs.SEEDS[0])
    runs = {Run("map", False, N, seed): same for seed in epochs.SEEDS}
    assert any("generator seeds 1234 and 4321 give the same index streams" in p
               for p in epochs.order_problems(runs, None))
    assert any("give every worker the same draws" in p for p in epochs.rng_problems(runs, None))


def test_parallelism_that_changes_the_stream_is_named():
    runs = {Run("map", False, N, parallelism=1): _stream(1), Run("map", False, N, parallelism=N): _stream(2)}
    assert any("depends on parallelism" in p for p in epochs.order_problems(runs, None))
    assert any("depend on parallelism" in p for p in epochs.rng_problems(runs, None))


def test_draws_repeated_across_epochs_or_workers_name_the_generator():
    frozen = epochs.rng_problems(_runs(frozen="random"), None)
    assert frozen and all("random's first draw repeats: worker" in p for p in frozen), frozen
    shared = epochs.rng_problems(_runs(shared="numpy"), None)
    assert shared and all("numpy's first draw repeats: workers 0, 1 in epoch 1" in p for p in shared), shared


def test_a_generator_never_observed_is_not_judged():
    runs = _runs(frozen="numpy", shared="numpy")
    runs = {r: [[(*row[:4], -1) for row in rows] for rows in s] for r, s in runs.items()}
    assert epochs.rng_problems(runs, None) == []


def test_lost_or_duplicated_indices_are_named():
    runs = _runs()
    run = next(iter(runs))
    runs[run][1][0] = runs[run][1][1]
    assert any("epoch 2 did not serve each" in p for p in epochs.order_problems(runs, None))


def test_plan_covers_workers_persistence_parallelism_and_a_second_seed():
    runs = epochs.plan(parallel=True, iterable=True, persistent=True)
    assert {r.num_workers for r in runs} == {0, N} and {r.persistent for r in runs} == {False, True}
    assert {r.parallelism for r in runs if r.num_workers} == {1, N} and {r.kind for r in runs} == {"map", "iterable"}
    assert {r.seed for r in runs} == set(epochs.SEEDS)
    # the p = 1 twin is persistent: the parallelism judge has a pair, at one start's cost
    (a, b), = epochs._twins(dict.fromkeys(runs), "parallelism")
    assert a.persistent and b.persistent
    # one sharded iterable run with workers, persistent where declared
    assert [r.persistent for r in runs if r.kind == "iterable" and r.num_workers] == [True]
    plain = epochs.plan(parallel=False, iterable=False, persistent=False)
    assert all(r.parallelism is None and not r.persistent and r.kind == "map" for r in plain)
