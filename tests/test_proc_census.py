"""tools.proc_census: a command's descendants sampled and summed by kind."""

import sys

from tools import proc_census

BUSY = "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.0: pass\n"


def test_kinds_and_fork_children():
    fs = "/venv/bin/python -c from multiprocessing.forkserver import main; main(8, 9, ['__main__'], **{})"
    assert proc_census.kind_of(fs, "/venv/bin/python -m pytest -q") == "stdlib forkserver"
    assert proc_census.kind_of(fs, fs) == "stdlib forkserver (fork child)"
    assert proc_census.kind_of("/venv/bin/python -m pytest_workerstart.harness.runner --zygote torch", None) == \
        "scenario zygote"
    assert proc_census.kind_of("/venv/bin/python -c import torch.utils.data", None) == "boot probe"
    assert proc_census.kind_of("sleep 1", None) == "other"


def test_a_commands_descendants_are_counted_once_each_with_their_cpu(tmp_path):
    """Its child and grandchild are each seen once, with about the second of CPU each used."""
    child = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {BUSY!r}]); exec({BUSY!r})"
    rc, records = proc_census.sample([sys.executable, "-c", f"import subprocess, sys; "
                                                          f"subprocess.run([sys.executable, '-c', {child!r}])"])
    assert rc == 0
    assert len(records) == 2, records
    assert all(0.5 < r["cpu"] < 3.0 for r in records), records
    text = proc_census.summary(records)
    assert text.startswith("2 processes, ") and "other" in text, text


def test_a_process_is_counted_for_the_self_test_whose_directory_it_ran_in():
    assert proc_census.test_of("/tmp/pytest-of-root/pytest-7/popen-gw2/test_verdict_json_schema0/runpytest-0") == \
        "test_verdict_json_schema0"
    assert proc_census.test_of("/tmp/pytest-of-root/pytest-7/mutations-b000/batch") == "mutations-b000"
    assert proc_census.test_of("/work/main") == "(not in a test's directory)"
    records = [{"cwd": "/tmp/pytest-of-u/pytest-1/test_a0", "cpu": 2.0}, {"cwd": "/tmp/pytest-of-u/pytest-1/test_a0/x",
                                                                        "cpu": 1.0}, {"cwd": "/", "cpu": 0.5}]
    lines = proc_census.by_test(records).splitlines()
    assert "3.0 s" in lines[1] and lines[1].endswith("test_a0") and lines[2].endswith("directory)"), lines
