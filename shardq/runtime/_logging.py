"""The server processes' logging setup; the code lives in `shardq._logging`, which the task
worker shares (it sits below both, so `shardq.tasks` never imports `shardq.runtime`)."""

from shardq._logging import configure

__all__ = ["configure"]
