"""Fixtures for the soak tests."""

from _bytecode import subprocess_bytecode  # noqa: F401  (autouse: see tests/_bytecode.py)
