"""``torchrun ... -m pytest_workerstart.distributed``: ``sharding.exactly_once`` over the ranks of a
real ``torch.distributed`` group (the check's scenario and judge live in its room,
:mod:`pytest_workerstart.conformance.sharding.ranks`)."""

import sys

from pytest_workerstart.conformance.sharding.ranks import main

if __name__ == "__main__":
    sys.exit(main())
