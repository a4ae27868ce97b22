"""Run directory: the config, an append-only Parquet event log, and model checkpoints (ARCHITECTURE.md).

ARCHITECTURE.md "The path of one evaluation", steps 4 and 6; docs/event-log.md. Layout of a run directory::

    config.yaml                      the validated experiment config (plain YAML)
    events/seg-<first>-<last>.parquet  segments of the event log; <first>/<last> are 12-digit sequence numbers
    checkpoints/<name>.pt | .json    state dicts (torch.save, loaded with weights_only=True) or plain JSON
    writer.lock                      held by the process that writes the run (local folders)

Every event gets a global sequence number ``seq``. `RunStore.append` writes one segment to a temporary
name, fsyncs it, renames it into place and fsyncs the folder before it returns, so a segment is complete
or absent. Compaction merges small segments into one; it is crash-safe because readers drop rows whose
``seq`` they have already seen. A segment that cannot be read (torn, corrupted) loses only the rows that
cannot be decoded: the rest of its row groups are kept, and `RunStore.damage` lists exactly which
sequence numbers were dropped (known from the segment's name). Nothing in a run directory is unpickled.

The modules:

- `run_store`: `RunStore`, the facade the actor, the runner, the CLI and the report use.
- `schema`: `Event` (and `TrialFields`, the fields it shares with `TrialRecord`), the Parquet schema of a
  segment, and the encoding and decoding of rows.
- `segments`: `SegmentLog`, appending, reading and compacting the segments under ``events/``.
- `damage`: the damage report of a read (dropped rows, holes, conflicting writers).
- `filesystems`: a local folder (fsynced) or any pyarrow filesystem behind one interface.
- `new_run`: whether a folder can take a new run, and the claim of its ``config.yaml``.
- `lock`: `WriterLock`, one writer per run directory.
- `checkpoints`: state dicts saved and loaded without unpickling.
- `trials`: `TrialRecord` and `trials_table`, the log replayed one record per trial.
- `frame`: `read_trials`, a run's trials as a pandas DataFrame (`qbatch.read_trials`).
- `errors`: `StoreError` and `RunDirError`.

Tunables are set in the module that reads them: `filesystems.GCS_RETRY_LIMIT_S`, `lock.LOCK_TRIES` and
`lock.LOCK_RETRY_S`, `RunStore.compact_files`.
"""

from __future__ import annotations

from orchestrator.store.errors import RunDirError, StoreError

# internal names that other modules of the library (`runner` uses `_plain`) and the tests import from here
from orchestrator.store.filesystems import _Local as _Local
from orchestrator.store.new_run import _check_new as _check_new
from orchestrator.store.run_store import RunStore
from orchestrator.store.schema import _EVENT_FIELDS as _EVENT_FIELDS
from orchestrator.store.schema import _ROW_GROUP as _ROW_GROUP
from orchestrator.store.schema import _SCHEMA as _SCHEMA
from orchestrator.store.schema import EVENT_KINDS, Event, TrialFields
from orchestrator.store.schema import _encode as _encode
from orchestrator.store.schema import _parquet_bytes as _parquet_bytes
from orchestrator.store.schema import _plain as _plain
from orchestrator.store.schema import _to_json as _to_json
from orchestrator.store.segments import _COMPACT_FILES as _COMPACT_FILES
from orchestrator.store.trials import TrialRecord, status_counts, trials_table

__all__ = [
    "EVENT_KINDS",
    "Event",
    "RunDirError",
    "RunStore",
    "StoreError",
    "TrialFields",
    "TrialRecord",
    "status_counts",
    "trials_table",
]
