"""Beneath the design: how a tool runs (cli, runtime, machine), its errors, files read and written,
and the ids every vocabulary reserves. Imports nothing of the design's files."""
