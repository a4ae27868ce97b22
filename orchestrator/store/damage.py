"""The damage report of an event log: which sequence numbers a read of the log could not keep, and why.

docs/event-log.md "How the log is written": a segment that cannot be read loses only the rows that cannot be
decoded, and the report names exactly the sequence numbers dropped (known from the segment's name); a hole in
the numbers is a segment file deleted; two segments that disagree on a number are two writers on one run. The
functions here turn what `SegmentLog` read into those lines; they read nothing themselves.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping

#: segment name -> (first, last, rows read) of every segment read
Segments = Mapping[str, tuple[int, int, int]]
#: damaged segment name -> (first, last, what is wrong with it)
Damaged = Mapping[str, tuple[int, int, str]]


def _holes(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """The numbers from 0 to the last span's end that no (first, last) span holds, as (a, b) ranges: the log's
    sequence numbers have none unless a segment file was deleted."""
    holes, expected = [], 0
    for first, last in sorted(spans):
        if first > expected:
            holes.append((expected, first - 1))
        expected = max(expected, last + 1)
    return holes


def _ranges(seqs: Iterable[int]) -> str:
    """Compact text of a set of integers: '3-7, 12'."""
    s = sorted(seqs)
    parts: list[str] = []
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and s[j + 1] == s[j] + 1:
            j += 1
        parts.append(str(s[i]) if i == j else f"{s[i]}-{s[j]}")
        i = j + 1
    return ", ".join(parts)



def with_short_segments(segments: Segments, damaged: Damaged,
                        rows: Container[int]) -> dict[str, tuple[int, int, str]]:
    """`damaged` plus every segment that reads without error but lacks rows its name promises (a damaged
    footer that still parses): such a segment is damaged too. A missing row is reported once, by the first
    damaged segment that covers it."""
    out = dict(damaged)
    covered: set[int] = set()
    for first, last, _ in out.values():
        covered.update(range(first, last + 1))
    for name, (first, last, _) in segments.items():
        if name not in out and any(s not in rows and s not in covered for s in range(first, last + 1)):
            out[name] = (first, last, "fewer rows than its name says")
            covered.update(range(first, last + 1))
    return out


def damage_lines(segments: Segments, damaged: Damaged, rows: Container[int],
                 conflicts: Mapping[str, Mapping[str, list[int]]]) -> list[str]:
    """One line per hole in the sequence numbers, per damaged segment and per conflict.

    Args:
        segments: every segment read.
        damaged: the damaged ones (`with_short_segments` included).
        rows: the sequence numbers read intact.
        conflicts: segment -> the segment whose rows won -> the sequence numbers on which the two differ.
    """
    lines: list[str] = []
    # sequence numbers run from 0 without holes (`append` takes the next only once a segment is written):
    # a hole no segment's name covers is a segment file deleted, whose results a resume would run again
    # (unchecked, it reads as an intact log)
    holes = _holes((first, last) for first, last, _ in segments.values())
    if holes:
        n = sum(b - a + 1 for a, b in holes)
        spans = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in holes)
        lines.append(f"events/: no segment holds {n} event(s) with sequence number(s) {spans} (a segment "
                     "file deleted?); their results are not in the log")
    for name, (first, last, problem) in sorted(damaged.items()):
        lost = [s for s in range(first, last + 1) if s not in rows]
        lines.append(
            f"events/{name}: {problem}; dropped {len(lost)} event(s)"
            + (f" with sequence number(s) {_ranges(lost)}" if lost else "")
            + f", kept {last - first + 1 - len(lost)}"
        )
    for name, by_winner in sorted(conflicts.items()):
        for winner, seqs in sorted(by_winner.items()):
            lines.append(
                f"events/{name}: {len(seqs)} event(s) with sequence number(s) {_ranges(seqs)} differ from "
                f"those in events/{winner} (two writers on one run?); kept events/{winner}'s"
            )
    return lines
