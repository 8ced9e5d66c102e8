"""shardq: a durable job-queue server built from operating-system processes."""

__version__ = "0.1.0"

__all__ = ["__version__"]
