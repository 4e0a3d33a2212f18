"""exit.clean_interpreter judges what a program writes from the loader's first build on: a
package that prints a warning when it is imported is reported beside the case, not failed;
the same words written at exit fail it."""

import pytest

FAST = ("--workerstart-context=fork", "--workerstart-profile=quick", "--workerstart-preflight=false",
        "-k", "clean_interpreter")
SAID = "FutureWarning: a dependency's deprecation"


@pytest.mark.timeout(600)
def test_output_before_the_first_build_is_reported_not_judged(pytester, run_suite):
    pytester.makepyfile(noisyimport=f"""
        import sys

        from torch.utils.data import DataLoader  # noqa: F401

        sys.stderr.write("{SAID}\\n")
    """, noisyexit=f"""
        import atexit
        import sys

        from torch.utils.data import DataLoader  # noqa: F401

        atexit.register(lambda: sys.stderr.write("{SAID}\\n"))
    """)
    imported = run_suite(*FAST, "--workerstart-loader=noisyimport:DataLoader")
    (case,) = [c for c in imported.data["checks"] if c["outcome"] != "skipped"]
    assert case["outcome"] == "passed", case
    assert SAID in case["measurements"]["stderr_before_build"]
    at_exit = run_suite(*FAST, "--workerstart-loader=noisyexit:DataLoader")
    (case,) = [c for c in at_exit.data["checks"] if c["outcome"] != "skipped"]
    assert case["outcome"] == "failed" and "stderr is not empty" in case["reason"] and SAID in case["reason"], case
