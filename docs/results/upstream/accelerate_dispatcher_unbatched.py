"""accelerate's DataLoaderDispatcher fails on unbatched samples (``batch_size=None``).

Standalone: torch, accelerate and the standard library. torch's DataLoader with
``batch_size=None`` yields each sample as it is (automatic batching off); the script reads one
epoch of ``range(8)`` with the loader under test and exits 1 when it raises or does not deliver
every sample once.

    python accelerate_dispatcher_unbatched.py                                # DataLoaderDispatcher
    python accelerate_dispatcher_unbatched.py torch.utils.data:DataLoader    # the baseline
"""

import importlib
import sys


def main() -> int:
    spec = sys.argv[1] if len(sys.argv) > 1 else "accelerate.data_loader:DataLoaderDispatcher"
    module, _, name = spec.partition(":")
    cls = getattr(importlib.import_module(module), name)
    loader = cls(list(range(8)), batch_size=None)
    try:
        got = [int(x) for x in loader]
    except Exception as e:  # the finding: report it, do not crash
        print(f"FAIL: {spec} with batch_size=None raised {type(e).__name__}: {e}")
        return 1
    if sorted(got) != list(range(8)):
        print(f"FAIL: {spec} with batch_size=None delivered {got}, expected each of 0..7 once")
        return 1
    print(f"{spec} with batch_size=None: {got}\nok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
