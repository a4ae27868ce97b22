"""The documentation of the event log and of the trials DataFrame says what the code does: docs/event-log.md's
schema table is the Arrow schema of a segment (names in order, types, nullability, the JSON columns), its
kinds table the kinds the log accepts, and docs/library.md's DataFrame table the columns `read_trials`
gives."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa

from orchestrator.store import EVENT_KINDS
from orchestrator.store.frame import COLUMNS, METRIC_PREFIX, PARAM_PREFIX
from orchestrator.store.schema import _JSON_FIELDS, _SCHEMA

DOCS = Path(__file__).resolve().parents[1] / "docs"
EVENT_LOG = (DOCS / "event-log.md").read_text()
LIBRARY = (DOCS / "library.md").read_text()

#: the documented type -> the Arrow type
_TYPES = {"int64": pa.int64(), "float64": pa.float64(), "string": pa.string(), "string (JSON "
                                                                               "object)": pa.string(),
          "list of float64": pa.list_(pa.float64())}


def _section(text: str, title: str) -> str:
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def _table(text: str) -> list[list[str]]:
    """The rows of the first Markdown table in `text`, cells stripped, header and rule left out."""
    lines = [ln for ln in text.splitlines() if ln.startswith("|")]
    rows = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]
    return rows[2:]


def test_the_schema_table_is_the_segment_schema():
    rows = _table(_section(EVENT_LOG, "Schema"))
    documented = [re.fullmatch(r"`(\w+)`", r[0]).group(1) for r in rows]
    assert documented == _SCHEMA.names  # every column, in the file's order
    for name, (_, kind, null, _) in zip(documented, rows):
        field = _SCHEMA.field(name)
        assert _TYPES[kind] == field.type, f"`{name}` is documented as {kind}, the schema has {field.type}"
        assert {"yes": True, "no": False}[null] == field.nullable, f"`{name}`: null {null}"
        assert ("JSON" in kind) == (name in _JSON_FIELDS), name


def test_the_kinds_table_is_the_kinds_the_log_accepts():
    section = EVENT_LOG.split("\n## Event kinds\n", 1)[1].split("\n### ", 1)[0]
    kinds = [re.fullmatch(r"`(\w+)`", r[0]).group(1) for r in _table(section)]
    assert kinds == list(EVENT_KINDS)


def test_the_reading_rule_is_documented_with_the_reader_that_applies_it():
    section = _section(EVENT_LOG, "Reading a log")
    assert "`seq`" in section and "once" in section and "first `completed` or `failed`" in section
    assert "qbatch.read_trials(" in section


def test_the_dataframe_table_is_the_columns_read_trials_gives():
    rows = _table(_section(LIBRARY, "Trials as a DataFrame"))
    documented = [re.fullmatch(r"`([\w<>]+)`", r[0]).group(1) for r in rows]
    expected = [*COLUMNS[:4], f"{PARAM_PREFIX}<name>", *COLUMNS[4:], f"{METRIC_PREFIX}<name>"]
    assert documented == expected
