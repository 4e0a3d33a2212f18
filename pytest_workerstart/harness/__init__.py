"""What runs the checks' processes, and cleans up after them.

* :mod:`.runner` — the one child launcher: a scenario in its own session, under a hard
  timeout and a memory bound, its leftovers killed and unlinked
* :mod:`.zygote` — a parent that imported torch once and forks scenario processes
* :mod:`.reaper` — the guard process and session-end cleanup of what the suite started
* :mod:`.cleanup` — killing and unlinking what a loader's tree left (attributed by the probes)
* :mod:`.trials` — timing trials, alternated, each in a fresh process
* :mod:`.clean_exit`, :mod:`.driver_death` — what outlives an interpreter, or a killed driver
* :mod:`.lookahead` — scenarios of consecutive checks run ahead, two at a time
"""
