"""Fixtures for the soak tests."""

