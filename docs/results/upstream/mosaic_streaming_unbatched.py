"""mosaicml-streaming's StreamingDataLoader fails on unbatched samples (``batch_size=None``).

Standalone: torch, streaming and the standard library. torch's DataLoader with
``batch_size=None`` yields each sample as it is (automatic batching off); the script reads one
epoch of ``range(8)`` with the loader under test and exits 1 when it raises or does not deliver
every sample once. Where the loader counts what it yielded (streaming's ``num_samples_yielded``,
what its ``state_dict()`` resumes from), it also reads eight 1-D tensor samples and wants the
count to be 8.

    python mosaic_streaming_unbatched.py                                 # StreamingDataLoader
    python mosaic_streaming_unbatched.py torch.utils.data:DataLoader     # the baseline
"""

import importlib
import sys

import torch


def main() -> int:
    spec = sys.argv[1] if len(sys.argv) > 1 else "streaming:StreamingDataLoader"
    module, _, name = spec.partition(":")
    cls = getattr(importlib.import_module(module), name)
    failed = False
    try:
        got = [int(x) for x in cls(list(range(8)), batch_size=None)]
    except Exception as e:  # the finding: report it, do not crash
        print(f"FAIL: {spec} with batch_size=None over int samples raised {type(e).__name__}: {e}")
        failed = True
    else:
        if sorted(got) != list(range(8)):
            print(f"FAIL: {spec} with batch_size=None delivered {got}, expected each of 0..7 once")
            failed = True
        else:
            print(f"{spec} with batch_size=None over int samples: {got}")
    loader = cls([torch.arange(3) + i for i in range(8)], batch_size=None)
    served = sum(1 for _ in loader)
    if hasattr(loader, "num_samples_yielded"):
        if loader.num_samples_yielded != served:
            print(f"FAIL: {spec} served {served} tensor samples of shape (3,) and counted "
                  f"num_samples_yielded={loader.num_samples_yielded}")
            failed = True
        else:
            print(f"{spec} counted {served} tensor samples")
    if failed:
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
