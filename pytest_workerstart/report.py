"""The verdict in the terminal: a table of check x context, one line per failure with the
command that reruns it, the counts, skips, coverage and hints.

:func:`render` needs only ``write_line(text, **markup)`` and ``write_sep(sep, title, **markup)``
(pytest's terminal reporter has both), so it can be tested, or written elsewhere, without pytest.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pytest_workerstart import protocol, space
from pytest_workerstart.verdict import OUTCOMES, Verdict, case_key, cell


def render(tr, *, verdict: Verdict, loader: Any, coverage: dict[str, dict[str, str]],
           forked_by: dict[str, dict[str, int]], baseline: Any, preflight_failure: list[str],
           exitstatus: int, tb_hint: bool, explores: bool = False) -> None:
    """``loader``: the :class:`~pytest_workerstart.protocol.LoaderUnderTest`; ``baseline``: a
    :class:`~pytest_workerstart.baseline.Baseline` or None; ``tb_hint``: say how to see tracebacks."""
    records = list(verdict.records.values())
    if preflight_failure:  # nothing ran: what failed, the loader's error and the fix, not a table
        tr.write_sep("=", f"workerstart: preflight failed, none of {len(records)} selected checks ran", red=True)
        for line in preflight_failure:
            tr.write_line(line, red=True)
        return
    if not records:
        tr.write_sep("=", "workerstart: no conformance check ran", red=True)
        return
    _table(tr, records, loader)
    failures = [r for r in records if r.state == "finished" and r.outcome in ("failed", "error")]
    if failures:
        tr.write_line("")
        for r in sorted(failures, key=lambda r: r.nodeid):
            base = ""
            if baseline is not None:
                base = (f" [{baseline.loader.get('spec', 'baseline')}: {r.baseline_outcome}]"
                        if r.baseline_outcome else " [not in the baseline]")
            tr.write_line(f"{r.outcome.upper()} {case_key(r.nodeid, r.id)}{base}: {r.reason}"[:1000], red=True)
            if r.reproduce:
                tr.write_line(f"  reproduce: {r.reproduce}")
        if tb_hint:
            tr.write_line("(tracebacks: -v or --tb=short)")
    counts = verdict.summary()
    tr.write_line("")
    tr.write_line("workerstart: " + ", ".join(f"{counts[o]} {o}" for o in OUTCOMES)
                  + (f", {counts['not_run']} not run" if counts["not_run"] else ""))
    reasons: dict[str, int] = {}
    for r in records:
        if r.state == "finished" and r.outcome == "skipped":
            reasons[r.reason] = reasons.get(r.reason, 0) + 1
    for reason, n in sorted(reasons.items()):
        tr.write_line(f"  skipped {n}x: {reason}")
    if counts["not_run"]:
        why = verdict.not_run_reason or f"the session ended first (exit status {exitstatus})"
        why = why.removeprefix("workerstart: ")
        tr.write_line(f"workerstart: INCOMPLETE: {counts['not_run']} selected check(s) did not finish: {why}",
                      red=True)
    for ctx, clauses in coverage.items():
        parallel = [c for c, path in clauses.items() if path == "parallel"]
        tr.write_line(f"workerstart: coverage {ctx}: parallel start exercised in "
                      f"{', '.join(parallel) if parallel else 'no clause'}")
    for line in points_lines(verdict.judged_points(), explores):
        tr.write_line(line)
    differs = getattr(loader, "capabilities", {}).get("differs_from_torch")
    if differs:
        tr.write_line(f"workerstart: declared different from torch: {', '.join(differs)} (the data-path clauses "
                      "judge no point that sets them: skipped as declared different)", yellow=True)
    for ctx, who in forked_by.items():
        if ctx == "forkserver" or set(who) != {"driver"}:
            tr.write_line(f"workerstart: {ctx} workers forked by "
                          + ", ".join(f"{w} ({n} checks)" for w, n in sorted(who.items())))
    if loader.kwarg_not_found:
        tr.write_line(f"workerstart: no parallelism keyword found for {loader.spec}: parallel start was never "
                      f"exercised; name it with --workerstart-parallelism-kwarg=NAME "
                      f"(or --workerstart-parallelism-kwarg=none to silence this)", yellow=True)
    made = verdict.reproducers
    if made is not None and (made["written"] or made["none_for"]):
        tr.write_line(f"workerstart: standalone reproducers in {made['directory']}: "
                      + (", ".join(Path(p).name for p in made["written"].values()) or "none")
                      + (f"; none exists for {', '.join(made['none_for'])}" if made["none_for"] else ""))
    _baseline_summary(tr, records, failures, loader, baseline)
    if counts["passed"] == 0:
        tr.write_line("workerstart: WARNING: no check passed; this verdict covers nothing", red=True)


def _table(tr, records, loader) -> None:
    contexts = [c for c in protocol.KNOWN_CONTEXTS if any(r.context == c for r in records)]
    contexts += ["-"] if any(r.context is None for r in records) else []
    table: dict[str, dict[str, list[str]]] = {}
    for r in records:
        shown = r.outcome if r.state == "finished" else "not run"
        table.setdefault(r.id, {}).setdefault(r.context or "-", []).append(shown)
    tr.write_sep("=", f"workerstart verdict: {loader.spec} ({loader.label})")
    width = max(len(k) for k in table) + 2
    tr.write_line("check".ljust(width) + "".join(c.ljust(12) for c in contexts))
    for check_id in sorted(table):
        cells = [cell(table[check_id].get(c, [])).ljust(12) for c in contexts]
        tr.write_line(check_id.ljust(width) + "".join(cells))


def _baseline_summary(tr, records, failures, loader, baseline) -> None:
    if baseline is not None:
        cmp = baseline.compare(records)
        tr.write_line(f"workerstart: against {baseline.describe()}: {len(cmp['same'])} failure(s) the "
                      f"baseline shares, {len(cmp['new'])} new in this loader"
                      + (f", {len(cmp['unknown'])} the baseline did not run" if cmp["unknown"] else "")
                      + (f"; {len(cmp['fixed'])} case(s) the baseline fails pass here" if cmp["fixed"] else ""))
        for key in cmp["new"]:
            tr.write_line(f"  new in this loader: {key}", red=True)
    elif failures and loader.subclasses_torch:
        tr.write_line(f"workerstart: hint: {loader.qualname} subclasses torch's DataLoader; "
                      "--workerstart-baseline=torch shows which of these failures torch has too", yellow=True)


def points_lines(judged: dict[str, list[dict[str, Any]]], explores: bool) -> list[str]:
    """One line per clause: how many points its checks judged (fixed: the builds the checks
    make and the declared corners; explored: the explorer's) and the values each dimension
    took (the workers and the parallelism always, the others where they varied)."""
    by_clause: dict[str, dict[str, Any]] = {}
    for check_id, points in judged.items():
        entry = by_clause.setdefault(check_id.split(".")[0], {"fixed": set(), "explored": set(), "contexts": set(),
                                                             "explorable": False})
        sp = space.get(check_id)
        entry["explorable"] |= sp is not None and sp.explorable
        for p in points:
            fixed = p["origin"] in ("fixed", "corner")
            entry["fixed" if fixed else "explored"].add(p["point"])
            if not fixed:
                entry["contexts"].update(p["contexts"])
    lines: list[str] = []
    for clause, e in sorted(by_clause.items()):
        counts = f"{len(e['fixed'])} fixed"
        if e["explored"]:
            counts += f", {len(e['explored'])} explored in {', '.join(sorted(e['contexts']))}"
        elif e["explorable"]:
            counts += ", none explored" + ("" if explores else " (--workerstart-explore=0)")
        lines.append(f"workerstart: points {clause}: {counts}; {_ranges(e['fixed'] | e['explored'])}")
    return lines


def _ranges(texts: set[str]) -> str:
    """The values each dimension took over ``texts`` (a few listed, more as their range: not
    every value in it was judged); a text with a value of the wrong type (a build that tests
    argument validation) counts only where it parses."""
    values: dict[str, set[Any]] = {}
    for text in texts:
        try:
            point = space.parse(text, judgeable=False)
        except space.PointError:
            continue
        for key in (part.partition("=")[0] for part in text.split(",")):
            name = space.BY_KEY[key]
            values.setdefault(name, set()).add(getattr(point, name))
    parts = []
    for name, (key, _) in space.DIMENSIONS.items():
        seen = values.get(name, set())
        if not seen or (len(seen) == 1 and name not in ("num_workers", "parallelism")):
            continue
        ints = sorted(v for v in seen if isinstance(v, int) and not isinstance(v, bool))
        shown = [f"{ints[0]}..{ints[-1]}" if len(ints) > 4 else "/".join(map(str, ints))] if ints else []
        shown += sorted(str(int(v)) if isinstance(v, bool) else str(v).lower() for v in seen
                        if v is None or isinstance(v, (bool, str)))
        parts.append(f"{key} {'/'.join(shown)}")
    return ", ".join(parts)
