"""The speed clause: parallel start pays off and costs nothing afterwards (timing, so judged
from medians of fresh-process trials).

Spawn only (the clause is about boots that block `start()`), full profile
only, never under xdist (skipped with that reason), and never judged on a
busy machine: when other processes use more than a quarter of all CPUs (sampled
for 2 s before the trials and accounted over the whole measurement as the
machine's CPU time minus this process tree's), the three ids are skipped with
the numbers. Beside two CPU hogs on this 2-core machine the reference measured
p=4 no faster than p=1 (0.98×): concurrent boots that share the CPU with other
jobs finish late together, which says nothing about the loader. One measurement serves
the three ids: the [benchmark's](benchmark.md) trial on a reduced EuroSAT-like
set (2,000 JPEGs, a ~100 KB dataset pickle), batch 32, one epoch (63 batches), each
trial a fresh driver process (forked from the suite's zygote, so the driver's own
import of torch, in no measured span, is not paid per trial; its workers boot as
usual), in rounds alternated order for order, each round one trial of: 1 worker; N = 4 workers
serial (p=1); N workers with p = N. **Two rounds, and a third only where it could
change a decision**: after two, each id's decision is taken on the two trials and on
every completion by a third trial whose values (metric by metric) are either extreme
of the two, their midpoint, or an outlier beyond either (the median of three lies
between the two already measured; an outlier widens a noise band to its clamp); if
any differs, another round runs, up to five, each after the same question (the fifth decides); a
round runs only the configurations the undecided ids read (steady state and memory read p=1 and
p = N, not the single worker). Five at most, not three: three trials that a slow minute of a
shared VM had spread failed the reference's steady state in a clean-clone CI run; the median of
five alternated pairs outvotes two slow ones. On every recorded
series (tests/data/speed/), a decision called settled after two trials is the one three
gave. Measured here (2026-12-03, quiet 2-core machine, `pytest --workerstart
--workerstart-profile=full --workerstart-context=spawn -k speed`): the reference passed all
three ids in each of 5 runs (4 timed: two settled in two rounds, the measurement 93 s each;
two needed a third, 138 and 141 s; the fifth is CI's speed stage); each of the six speed
broken loaders, run once, failed its target and nothing unrelated (four in two rounds,
97-121 s; `FakeParallel` and `KeepsWarmSpares` in three, 145 and 148 s). No false failure
and no false pass in these runs; so few runs do not bound either rate tightly (none in 5
runs still allows a rate of up to about half, at 95 % confidence). Steady-state throughput is
what most often needs the third round: its trials
spread by up to 30 % here. Every item carries the pid of the process
that computed it (added by the test's dataset wrapper, not by the loader), so
the time until every worker has delivered a batch is known from outside.

**The startup threshold** is derived from what this run measured, so a 2-core
machine is not asked for 8× and an 88-core one cannot pass with 1.1×. Serial
start makes the first batch wait for N boots in a row, `serial = F + N·B`;
one worker gives `one = F + B`. Hence the per-worker boot cost
`B = (serial − one)/(N − 1)` and the fixed part `F = one − B`. N concurrent
boots on C usable cores (`os.sched_getaffinity`) end no sooner than
`F + B·N/min(N, C)`, so the ideal speedup is
`E = serial / (F + B·N/min(N, C))`, and the check asks for half the ideal
gain: **threshold = 1 + (E − 1)/2**. The same model, with the median time
until every worker has delivered under p=1 as `serial`, gives the second
threshold of `speed.startup`. Here (2 cores, B ≈ 3 s) that is about
1.4×; on the seed's 88-core host with N = 8 it would be about 4×.
`--workerstart-min-speedup=X` replaces the derived value; the failure message
always shows B, F, C and E.
"""
