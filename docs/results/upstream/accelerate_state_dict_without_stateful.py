"""accelerate's DataLoaderShard has a state_dict() that raises AttributeError unless it wraps a
StatefulDataLoader.

Standalone: torch, accelerate and the standard library. Code that checkpoints any loader
offering ``state_dict()`` (``hasattr(loader, "state_dict")``) calls it; the script exits 1 when
the loader offers the method and calling it raises AttributeError, the error that
``hasattr``/``getattr`` treat as "no such attribute".

    python accelerate_state_dict_without_stateful.py
    python accelerate_state_dict_without_stateful.py torchdata.stateful_dataloader:StatefulDataLoader
"""

import importlib
import sys


def main() -> int:
    spec = sys.argv[1] if len(sys.argv) > 1 else "accelerate.data_loader:DataLoaderShard"
    module, _, name = spec.partition(":")
    cls = getattr(importlib.import_module(module), name)
    loader = cls(list(range(8)), batch_size=2)
    if not hasattr(loader, "state_dict"):
        print(f"{spec}: no state_dict(): ok (not checkpointable, and says so)")
        return 0
    for when in ("before iterating", "after one batch"):
        if when == "after one batch":
            it = iter(loader)
            next(it)
        try:
            state = loader.state_dict()
        except AttributeError as e:
            print(f"FAIL: {spec}.state_dict() {when}: AttributeError: {e}")
            return 1
        print(f"{spec}.state_dict() {when}: {type(state).__name__} with {len(state)} keys")
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
