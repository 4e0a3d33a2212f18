"""What runs the checks' processes, and cleans up after them.

* :mod:`.runner` — the one child launcher: a scenario in its own session, under a hard
  timeout and a memory bound, its leftovers killed and unlinked
* :mod:`.zygote` — a parent that imported torch once and forks scenario processes
* :mod:`.reaper` — the guard process and session-end cleanup of what the suite started
* :mod:`.lookahead` — scenarios of consecutive checks run ahead, two at a time
"""
