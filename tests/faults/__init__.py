"""Fault-tolerance tests: worker and node loss during real runs, and the safety of
local runs (loopback-only Ray, run directories that are never unpickled and cannot escape their folder)."""
