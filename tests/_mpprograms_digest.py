def digest_of_fixed_batch():
    import torch

    from pytest_workerstart.probes.digest import batch_digest

    return batch_digest({"a": torch.arange(10, dtype=torch.int64), "b": [torch.ones(2, 2) / 3, "x"]})
