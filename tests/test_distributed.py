"""The multi-node entry point, as documented: torchrun on one node, 2 ranks."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TORCHRUN = shutil.which("torchrun") or str(Path(sys.executable).parent / "torchrun")


def _torchrun(*args):
    proc = subprocess.run([TORCHRUN, "--standalone", "--nproc-per-node=2", "-m", "pytest_workerstart.distributed",
                           "--context", "forkserver", "--num-workers", "2", "--samples", "48", *args],
                          capture_output=True, text=True, timeout=300)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    return proc, (json.loads(lines[-1]) if lines else None)


@pytest.mark.suite
@pytest.mark.timeout(400)
def test_torchrun_reference_covers_every_index_once():
    proc, verdict = _torchrun()
    assert proc.returncode == 0 and verdict and verdict["verdict"] == "passed", (
        proc.stdout[-2000:] + proc.stderr[-3000:])
    assert verdict["ranks"] == 2 and verdict["workers_per_rank"] == 2


@pytest.mark.suite
@pytest.mark.timeout(400)
def test_torchrun_catches_a_loader_that_does_not_shard():
    proc, verdict = _torchrun("--loader", "pytest_workerstart.fixtures.broken.loaders:NoShardInfo")
    assert proc.returncode != 0 and verdict and verdict["verdict"] == "failed", proc.stdout[-2000:]
    factors = [float(re.search(r"duplication factor ([0-9.]+)", p).group(1)) for p in verdict["problems"]
               if p.startswith("iterable dataset over 2 ranks x 2 workers")]
    assert factors and factors[0] >= 1.9, verdict["problems"]  # each rank's 2 workers yield the rank's whole shard
