"""A project runs the suite from its own tests: a conftest fixture picks the loader, no flag."""

from tests.conftest import Verdict


def test_conftest_fixture_picks_the_loader(pytester):
    pytester.makeconftest("""
        import pytest
        from torch.utils.data import DataLoader

        @pytest.fixture(scope="session")
        def workerstart_loader():
            return (DataLoader, {"capabilities": {"persistent_workers": False}})
    """)
    pytester.makepyfile(test_ours="""
        from pytest_workerstart.conformance import *  # noqa: F401,F403

        def test_our_own():
            pass
    """)
    out = pytester.path / "verdict.json"
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--workerstart-context=forkserver",
                                           f"--workerstart-json={out}", "-k",
                                           "our_own or start.default_serial or persistent.reuse or respects_bound")
    v = Verdict(out, result)
    text = result.stdout.str()
    assert result.ret == 0, text[-3000:]
    assert v.data["loader"]["qualified_name"] == "torch.utils.data.dataloader.DataLoader"
    assert v.outcomes("start.default_serial") == ["passed"]
    # the fixture's declarations count: skipped with the capability named
    assert set(v.outcomes("persistent.reuse")) == {"skipped"}  # its case and its data-path corner
    assert all("persistent_workers" in r for r in v.reasons("persistent.reuse"))
    assert set(v.outcomes("start.respects_bound")) == {"skipped"}
    assert all(c["nodeid"].startswith("test_ours.py::") for c in v.data["checks"]), v.data["checks"][:2]
    skipped = len(v.outcomes("start.respects_bound")) + len(v.outcomes("persistent.reuse"))
    result.assert_outcomes(passed=2, skipped=skipped)


def test_fixture_factory_must_be_importable(pytester):
    pytester.makeconftest("""
        import pytest

        @pytest.fixture(scope="session")
        def workerstart_loader():
            def make(dataset, **kwargs):
                raise AssertionError("never called")
            return make
    """)
    pytester.makepyfile(test_ours="from pytest_workerstart.conformance import test_default_serial  # noqa: F401\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--workerstart-context=forkserver")
    assert "define the factory at module level of an importable module" in result.stdout.str() + result.stderr.str()
    assert result.ret != 0


def test_each_module_judges_its_own_loader(pytester):
    """Two modules, two loaders, one session: the second is not compared with the first's results
    (the first alters its samples, so its first batch differs from the second's)."""
    for name, spec in (("test_torch_loader", "torch"),
                       ("test_altered", "pytest_workerstart.fixtures.broken.on_torch:AltersSamples")):
        pytester.makepyfile(**{name: f"""
            import pytest
            from pytest_workerstart.conformance.digest.test_digest import test_first_batch  # noqa: F401
            from pytest_workerstart.conformance.order.test_order import test_worker_seeds  # noqa: F401

            @pytest.fixture(scope="module")
            def workerstart_loader():
                return {spec!r}
        """})
    out = pytester.path / "verdict.json"
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--workerstart-context=forkserver",
                                           f"--workerstart-json={out}", "test_altered.py", "test_torch_loader.py")
    v = Verdict(out, result)
    outcome = {(c["nodeid"].partition(".py")[0], c["id"]): c["outcome"] for c in v.data["checks"]
               if "map_nested" in c["nodeid"] or c["id"] == "order.worker_seeds"}
    assert outcome == {("test_torch_loader", "digest.first_batch"): "passed",
                       ("test_torch_loader", "order.worker_seeds"): "passed",
                       ("test_altered", "digest.first_batch"): "failed",
                       ("test_altered", "order.worker_seeds"): "passed"}, result.stdout.str()[-3000:]
