"""The circuit breaker: a loader that fails the same way in N checks in a row stops the run."""

from __future__ import annotations


class CircuitBreaker:
    def __init__(self, limit: int | None):
        self.limit = limit  # None or 0: never trips
        self._streak: list[tuple[str, str]] = []  # (nodeid, failure signature) of the current run of failures

    def clear(self) -> None:
        self._streak.clear()

    def observe(self, nodeid: str, signature: str | None) -> str | None:
        """Note a failed check; the reason to stop the run if this failure trips the breaker."""
        if signature is None or (self._streak and self._streak[-1][1] != signature):
            self._streak.clear()
        if signature is None:
            return None
        self._streak.append((nodeid, signature))
        if self.limit and len(self._streak) >= self.limit:
            return (f"circuit breaker: the loader failed the same way ({signature}) in {len(self._streak)} "
                    f"checks in a row; the remaining checks were not run")
        return None
