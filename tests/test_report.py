"""The terminal report needs only ``write_line`` and ``write_sep``, and says only what happened."""

from types import SimpleNamespace

from pytest_workerstart import report
from pytest_workerstart.verdict import Verdict


class Lines:
    def __init__(self):
        self.lines: list[str] = []

    def write_line(self, text, **markup):
        self.lines.append(text)

    def write_sep(self, sep, title, **markup):
        self.lines.append(f"{sep * 3} {title} {sep * 3}")


LOADER = SimpleNamespace(spec="mypkg:Loader", label="mypkg.Loader 1.0", kwarg_not_found=False,
                         subclasses_torch=True, qualname="mypkg.Loader")


def _verdict() -> Verdict:
    v = Verdict({"spec": LOADER.spec}, {})
    passed = v.select("conformance/test_order.py::test_registration[order.registration-fork]", "order.registration",
                      "fork")
    passed.state, passed.outcome = "finished", "passed"
    failed = v.select("conformance/test_start.py::test_default_serial[start.default_serial-fork]",
                      "start.default_serial", "fork")
    failed.state, failed.outcome, failed.reason = "finished", "failed", "the loader hung: iter() did not return"
    failed.reproduce = "pytest --workerstart -k x"
    v.select("conformance/test_leaks.py::test_clean_exit[leaks.clean_exit-fork-exhaustion]", "leaks.clean_exit",
             "fork")  # never finished
    return v


def test_table_failures_counts_and_what_did_not_finish():
    out = Lines()
    report.render(out, verdict=_verdict(), loader=LOADER, coverage={"fork": {"order": "serial"}}, forked_by={},
                  baseline=None, preflight_failure=[], exitstatus=2, tb_hint=True)
    text = "\n".join(out.lines)
    assert "=== workerstart verdict: mypkg:Loader (mypkg.Loader 1.0) ===" in text
    assert any(ln.startswith("leaks.clean_exit") and "not run" in ln for ln in out.lines), text
    assert "FAILED start.default_serial[fork]: the loader hung: iter() did not return" in text
    assert "  reproduce: pytest --workerstart -k x" in text
    assert "workerstart: 1 passed, 1 failed, 0 skipped, 0 xfailed, 0 error, 1 not run" in text
    assert "INCOMPLETE: 1 selected check(s) did not finish: the session ended first (exit status 2)" in text
    assert "--workerstart-baseline=torch shows which" in text  # a subclass of torch's DataLoader that failed


def test_a_preflight_failure_is_only_its_lines():
    out = Lines()
    report.render(out, verdict=_verdict(), loader=LOADER, coverage={}, forked_by={}, baseline=None,
                  preflight_failure=["workerstart: preflight: it hung", "workerstart: fix: adapt it"], exitstatus=4,
                  tb_hint=True)
    assert out.lines == ["=== workerstart: preflight failed, none of 3 selected checks ran ===",
                         "workerstart: preflight: it hung", "workerstart: fix: adapt it"]
