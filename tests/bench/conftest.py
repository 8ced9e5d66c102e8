"""Fixtures for the bench tools' smoke tests."""

