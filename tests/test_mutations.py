"""Mutation self-tests: every check id has a broken loader it catches, and the
reference loader passes the same checks (the passing control).

Each broken loader runs its target checks plus a fixed set of cheap sentinel
checks in the quick profile under forkserver; the target must fail, sentinels
not related to the defect must not. The loaders are judged in a few batches
(one suite run each, one module per loader: tests/_batch.py); each loader is
still its own test, and a loader whose batch ended before its checks finished
is rerun alone. A batch's tests are one class, so ``--dist loadscope`` keeps them
on one xdist worker and the batch runs once.
"""

import shlex

import pytest

from pytest_workerstart import registry
from pytest_workerstart.fixtures.broken import catalog
from tests import _batch
from tests.conftest import NO_HYPOTHESIS_PLUGIN

CATCHES, SPEED_CATCHES = catalog.load()
#: broken loaders whose defect lives in one region of a check's space: tests/test_explore.py
REGIONAL = {name for name, c in CATCHES.items() if c.region is not None}

pytestmark = pytest.mark.slow
#: Cheap checks that must not fail for a defect they are not related to. Not digest.first_batch:
#: it was two thirds of the sentinels' time (three datasets, with and without parallel start),
#: and a loader that alters samples is the defect of the broken loaders that target it. Not
#: leaks.clean_exit: its four endings boot eight workers per loader, a quarter of the batches'
#: time, and the loaders whose defects leak are judged by it as their target.
SENTINELS = ("start.default_serial", "order.registration", "transfer.shared_memory")
ARGS = ("--workerstart-context=forkserver", "--workerstart-profile=quick")
#: No preflight in the batches: each broken loader is known to build and deliver a batch, and its
#: preflight (a scenario with a forkserver of its own) was a third of a batch's time. The checks are
#: bounded by the step deadlines all the same; the passing control keeps the preflight.
#: One run per failing scenario case: a batch's subject is that the loader is caught, and a second
#: run of each caught scenario case (tests/test_reruns.py) would double the batches' longest cases.
BATCH_ARGS = (*ARGS, "--workerstart-preflight=false", "--workerstart-failure-runs=1", *NO_HYPOTHESIS_PLUGIN)
#: Batches per set of extra options: enough to keep a few xdist workers busy, few enough
#: that each pays its pytest start and torch import for many loaders.
BATCHES = 4
#: One batch's whole run (its loaders' checks are bounded by the suite's own step deadlines).
BATCH_TIMEOUT_S = 1500


def _selection(catch) -> list[str]:
    return list(catch.targets) + [s for s in SENTINELS if s not in catch.targets and s not in catch.related]


def _batches() -> dict[str, list[str]]:
    """Batch name -> broken loader names: loaders that need the same extra options, dealt round-robin."""
    by_options: dict[tuple[str, ...], list[str]] = {}
    for name in sorted(set(CATCHES) - REGIONAL):
        by_options.setdefault(CATCHES[name].options, []).append(name)
    out: dict[str, list[str]] = {}
    for k, (options, names) in enumerate(sorted(by_options.items())):
        n = BATCHES if not options else 1
        for i in range(n):
            out[f"b{k}{i}"] = names[i::n]
    return {b: names for b, names in out.items() if names}


BATCH_OF = {name: b for b, names in _batches().items() for name in names}
_SLICES: dict[str, dict[str, _batch.Slice]] = {}


def test_every_check_id_has_a_broken_loader():
    caught = {t for c in (*CATCHES.values(), *SPEED_CATCHES.values()) for t in c.targets}
    missing = set(registry.CHECKS) - caught
    assert not missing, f"check ids no broken loader fails: {sorted(missing)}"


def test_every_broken_loader_is_in_one_batch():
    assert sorted(BATCH_OF) == sorted(set(CATCHES) - REGIONAL)


@pytest.mark.timeout(1200)
def test_reference_passes_every_selection(run_suite):
    """The live passing control: the reference on the union of the selections below, with every option they add."""
    batched = [c for name, c in CATCHES.items() if name not in REGIONAL]
    ids = sorted({i for c in batched for i in _selection(c)})
    options = sorted({o for c in batched for o in c.options})
    verdict = run_suite(*ARGS, "-k", " or ".join(ids), *options)
    assert verdict.data["complete"] and verdict.failed_ids() == set(), verdict.result.stdout.str()[-3000:]
    assert {c["id"] for c in verdict.data["checks"] if c["outcome"] == "passed"} == set(ids)


def _slice(name: str, tmp_path_factory) -> _batch.Slice:
    batch = BATCH_OF[name]
    if batch not in _SLICES:
        names = [n for n, b in BATCH_OF.items() if b == batch]
        entries = {n: (CATCHES[n].spec, _selection(CATCHES[n])) for n in names}
        _SLICES[batch] = _batch.judge(tmp_path_factory.mktemp(f"mutations-{batch}"), entries,
                                      [*BATCH_ARGS, *CATCHES[names[0]].options], timeout=BATCH_TIMEOUT_S)
    return _SLICES[batch][name]


class BrokenLoaders:
    """The tests of one batch: ``names`` are its broken loaders (subclasses below, one per batch)."""

    names: tuple[str, ...] = ()

    @pytest.mark.timeout(2 * BATCH_TIMEOUT_S + 60)  # the batch's first test runs it, and maybe a rerun alone
    def test_broken_loader_is_caught(self, name, tmp_path_factory):
        catch = CATCHES[name]
        got = _slice(name, tmp_path_factory)
        assert got.checks, f"{name}: no check of it ran\n{got.output[-3000:]}"
        for target in catch.targets:
            assert "failed" in got.outcomes(target), (
                f"{name}: {target} did not fail: {got.outcomes(target)}\n{got.describe()}")
        for case in got.checks:  # each failure names the command that reruns it (tests/test_reproduce.py runs some)
            if case["outcome"] in ("failed", "error"):
                cmd = shlex.split(case["reproduce"] or "")
                assert cmd[-1:] == [case["nodeid"]] and "--workerstart-profile=quick" in cmd \
                    and f"--workerstart-context={case['context']}" in cmd, (case["nodeid"], case["reproduce"])
        collateral = got.failed_ids() - set(catch.targets) - set(catch.related)
        assert not collateral, f"{name}: unrelated checks failed too: {sorted(collateral)}\n{got.describe()}"


def pytest_generate_tests(metafunc):
    if metafunc.cls is not None and issubclass(metafunc.cls, BrokenLoaders):
        metafunc.parametrize("name", metafunc.cls.names)


for _batch_name, _names in _batches().items():
    _cls = f"TestBatch{_batch_name.upper()}"
    globals()[_cls] = type(_cls, (BrokenLoaders,), {"names": tuple(_names)})
