"""The event log's segments: appending one per write, reading them all back, and compacting small ones.

docs/event-log.md "How the log is written". Every event gets a global sequence number ``seq``; an append
writes one segment, ``events/seg-<first>-<last>.parquet``, atomically and (on a local folder) durably before
it returns. Compaction merges small segments into one; it is crash-safe because the merge is written before
its sources are deleted and readers drop rows whose ``seq`` they have already seen. Where segments overlap,
the same segment wins on every read (names sorted). The damage a read finds is described by
`orchestrator.store.damage`.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from orchestrator.store.damage import _holes, damage_lines, with_short_segments
from orchestrator.store.errors import _first_line
from orchestrator.store.schema import _SCHEMA, Event, _decode, _encode, _parquet_bytes

#: auto-compaction: once this many segments hold fewer than `_SMALL_ROWS` events each, merge them
_COMPACT_FILES = 64
_SMALL_ROWS = 1024

_SEGMENT_RE = re.compile(r"^seg-(\d{12})-(\d{12})\.parquet$")


class SegmentLog:
    """The segments under ``events/`` of the run directory on `backend`.

    Attributes:
        damage: one line per damaged segment, naming the sequence numbers of the events dropped when the
            log was last read (empty if the log is intact).
    """

    def __init__(self, backend: Any) -> None:
        self._fs = backend
        self.damage: list[str] = []
        self._next_seq = 0
        self._damaged: set[str] = set()
        self._segments: dict[str, tuple[int, int, int]] = {}  # name -> (first, last, rows)

    @property
    def segment_count(self) -> int:
        """How many segments the log had when it was last read or written."""
        return len(self._segments)

    def has_segments(self) -> bool:
        """Whether events/ holds at least one file named as a log segment (`seg-<first>-<last>.parquet`)."""
        return any(_SEGMENT_RE.match(n) for n in self._fs.listdir("events"))

    # ------------------------------------------------------------------ writing
    def append(self, events: Sequence[Event]) -> None:
        """Write `events` as one segment numbered on from the last one written or read.

        Raises:
            StoreError: an event field has the wrong type (the message names it); nothing is written then.
        """
        if not events:
            return
        first = self._next_seq
        table = _encode(events, first)  # validates before anything touches the disk
        last = first + len(events) - 1
        name = f"seg-{first:012d}-{last:012d}.parquet"
        self._fs.write_atomic(f"events/{name}", _parquet_bytes(table), exclusive=True)
        self._segments[name] = (first, last, len(events))
        self._next_seq = last + 1

    # ------------------------------------------------------------------ compaction
    def small_segments(self) -> list[str]:
        """Segments worth merging: small, and neither damaged nor in conflict (`compact` skips those, and
        counting them would make every append compact once 64 exist)."""
        return [
            n for n, (_, _, rows) in self._segments.items() if rows < _SMALL_ROWS and n not in self._damaged
        ]

    def _hole_free_groups(self, names: list[str]) -> list[list[str]]:
        """`names` (sorted by first sequence number) cut where some number between two of them is held by no
        segment at all: a merge spanning it would be named for events it does not hold, and the hole (reported
        as missing events) would then read as that intact merge being short of rows."""
        holes = _holes((first, last) for first, last, _ in self._segments.values())
        groups: list[list[str]] = []
        for n in names:
            if groups and not any(self._segments[groups[-1][-1]][1] < a and b < self._segments[n][0]
                                  for a, b in holes):
                groups[-1].append(n)
            else:
                groups.append([n])
        return groups

    def foreign_overlap(self) -> bool:
        """Whether a segment this log has not read overlaps the sequence numbers of one it has (one listing,
        no reads: the cheap test before an auto-compaction)."""
        known = [(first, last) for first, last, _ in self._segments.values()]
        for name in self._fs.listdir("events"):
            m = _SEGMENT_RE.match(name)
            if m is None or name in self._segments:
                continue
            first, last = int(m.group(1)), int(m.group(2))
            if any(first <= k_last and k_first <= last for k_first, k_last in known):
                return True
        return False

    def compact(self, names: Sequence[str] | None = None) -> int:
        """Merge segments (default: all intact ones) into one; returns how many files were merged.

        Crash-safe: the merged segment is written atomically before the old ones are deleted, and readers
        drop rows whose sequence number they have already read. Damaged segments are left in place.
        """
        if names is None:
            self.events()  # refresh the segment table and the list of damaged segments
        names = sorted(self._segments if names is None else names)
        names = [n for n in names if n in self._segments and n not in self._damaged]
        groups = self._hole_free_groups(names)
        if len(groups) > 1:  # a merge across a hole (a deleted segment) would claim its numbers
            return sum(self.compact(g) for g in groups if len(g) > 1)
        if len(names) < 2:
            return 0
        first, last = min(self._segments[n][0] for n in names), max(self._segments[n][1] for n in names)
        merged = f"seg-{first:012d}-{last:012d}.parquet"
        if merged not in names and merged in self._segments and merged not in self._damaged:
            # a merge of these segments written before a crash (it is no longer small, so auto-compaction did
            # not pick it): merge it in, or the new merge would collide with it and drop the rows only it
            # holds
            names.append(merged)
        tables, readable = [], []
        for n in names:
            try:
                pf = pq.ParquetFile(io.BytesIO(self._fs.read(f"events/{n}")), page_checksum_verification=True)
                tables.append(pf.read().cast(_SCHEMA))
                readable.append(n)
            # damaged since it was last read: leave it for the reader to report
            except Exception:  # noqa: BLE001
                continue
        names = readable
        if len(names) < 2:
            return 0
        table = pa.concat_tables(tables).sort_by("seq")
        seqs = table.column("seq").to_pylist()
        keep = np.ones(len(seqs), dtype=bool)
        seen: set[int] = set()
        for i, s in enumerate(seqs):
            if s in seen:
                keep[i] = False
            seen.add(s)
        table = table.filter(pa.array(keep))
        first, last = min(self._segments[n][0] for n in names), max(self._segments[n][1] for n in names)
        merged = f"seg-{first:012d}-{last:012d}.parquet"
        # `merged` is among `names` only after a crash between writing a merge and deleting its sources:
        # the new table is a superset of it, so replacing it atomically is safe.
        self._fs.write_atomic(f"events/{merged}", _parquet_bytes(table), exclusive=merged not in names)
        for n in names:
            if n != merged:
                self._fs.delete(f"events/{n}")
            self._segments.pop(n, None)
        self._fs.sync_dir("events")
        self._segments[merged] = (first, last, table.num_rows)
        return len(names)

    # ------------------------------------------------------------------ reading
    def events(self, kinds: Iterable[str] | None = None) -> list[Event]:
        """All intact events in append order (optionally only the given kinds); refreshes `damage`."""
        for _ in range(5):
            try:
                pairs = self._read_all()
                break
            except FileNotFoundError:  # a segment vanished under a concurrent compaction: list again
                continue
        else:
            pairs = self._read_all()
        wanted = None if kinds is None else set(kinds)
        return [ev for _, ev in pairs if wanted is None or ev.kind in wanted]

    def _read_all(self) -> list[tuple[int, Event]]:
        """Every segment read once: the intact rows by sequence number; refreshes the segment table, the
        damaged segments (never compacted) and `damage`."""
        # sorted: where segments overlap (a compaction that died before deleting its inputs) the same
        # segment wins on every read
        names = sorted(n for n in self._fs.listdir("events") if _SEGMENT_RE.match(n))
        segments: dict[str, tuple[int, int, int]] = {}
        damaged: dict[str, tuple[int, int, str]] = {}
        rows: dict[int, Event] = {}
        source: dict[int, str] = {}
        conflicts: dict[str, dict[str, list[int]]] = {}  # segment -> the segment whose rows won -> seqs
        for name in names:
            m = _SEGMENT_RE.match(name)
            first, last = int(m.group(1)), int(m.group(2))
            decoded, problem = self._read_segment(name)
            for seq, ev in decoded:
                if not first <= seq <= last:
                    continue
                if seq not in rows:
                    rows[seq], source[seq] = ev, name
                elif repr(rows[seq]) != repr(ev):  # overlaps must repeat a row exactly: else two writers
                    conflicts.setdefault(name, {}).setdefault(source[seq], []).append(seq)
            if problem is not None:
                damaged[name] = (first, last, problem)
            segments[name] = (first, last, len(decoded))
        damaged = with_short_segments(segments, damaged, rows)
        self.damage = damage_lines(segments, damaged, rows, conflicts)
        # a conflicting segment is never compacted: compaction would drop its rows without a trace;
        # nor is the segment that won: renamed by a merge, it could sort after the loser and stop winning
        self._damaged = set(damaged) | set(conflicts) | {w for by in conflicts.values() for w in by}
        self._segments = segments
        all_last = [last for first, last, _ in segments.values()]
        self._next_seq = max([self._next_seq - 1, *all_last]) + 1 if all_last else self._next_seq
        return sorted(rows.items())

    def _read_segment(self, name: str) -> tuple[list[tuple[int, Event]], str | None]:
        """Decoded rows of one segment and a description of its damage (None if intact)."""
        try:
            data = self._fs.read(f"events/{name}")
        # no file to read: damage, not the log's failure
        except (IsADirectoryError, NotADirectoryError) as exc:
            return [], f"unreadable ({type(exc).__name__}: {_first_line(exc)})"
        # any other OSError (merged away meanwhile: the caller lists again; a transient EIO, ESTALE, EMFILE)
        # is raised: read as damage, its results would be dropped and a resume would run their trials again
        try:
            pf = pq.ParquetFile(io.BytesIO(data), page_checksum_verification=True)
        except Exception as exc:  # noqa: BLE001 -- any decoding failure means the footer is unusable
            return [], f"unreadable ({type(exc).__name__}: {_first_line(exc)}; {len(data)} bytes)"
        out: list[tuple[int, Event]] = []
        bad: list[str] = []
        for i in range(pf.num_row_groups):
            try:
                table = pf.read_row_group(i)
                if not table.schema.equals(_SCHEMA, check_metadata=False):
                    table = table.cast(_SCHEMA)
                rows, bad_rows = _decode(table)
                out.extend(rows)
                bad.extend(bad_rows)
            except Exception as exc:  # noqa: BLE001 -- a corrupt row group: keep the others
                bad.append(f"row group {i}: {type(exc).__name__}: {_first_line(exc)}")
        return out, ("; ".join(bad) if bad else None)
