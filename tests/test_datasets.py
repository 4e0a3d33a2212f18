"""The suite's datasets end: a loader that iterates one by index until it fails
stops (observed: one that never raised let a wrong loader eat 22.8 GB)."""

import pytest

from pytest_workerstart import datasets

MAP_STYLE = [datasets.NestedMapDataset(5), datasets.WorkerTagDataset(5), datasets.AugmentedDataset(5),
             datasets.BigPickleDataset(5, payload_kib=1)]


@pytest.mark.parametrize("ds", MAP_STYLE, ids=lambda d: type(d).__name__)
def test_map_style_datasets_raise_index_error_past_their_length(ds):
    for bad in (5, 10**6, -1):
        with pytest.raises(IndexError, match="out of range"):
            ds[bad]
    assert len(list(ds)) == 5  # the legacy __getitem__ iteration protocol stops


def test_counting_dataset_ends_too(tmp_path):
    ds = datasets.CountingDataset(str(tmp_path / "log"), n=3)
    assert list(ds) == [0, 1, 2]
    assert ds.fetched() == 3
