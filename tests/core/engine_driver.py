"""A thin test driver over `Engine`: commands in, replies and mutations out, time passed in.

Every helper takes the time explicitly (`at`, milliseconds). Nothing here reads the clock.
"""

from __future__ import annotations

from typing import Any

from shardq.core import Engine, Mutation

Reply = dict[str, Any]


class Driver:
    """Wraps one engine and remembers the mutations and job events of the last call."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.mutations: list[Mutation] = []
        self.events: list[tuple[str, str, str]] = []
        self.cancels: list[dict[str, Any]] = []

    # -- raw access ------------------------------------------------------------------------

    def run(
        self, cmd: dict[str, Any], at: int = 0, conn: str | None = None
    ) -> tuple[Reply, list[Mutation]]:
        """Run `cmd` at `at` for connection `conn` (as the shard passes a request's)."""
        outcome = self.engine.apply(cmd, at, conn)
        self.mutations, self.events = list(outcome.mutations), outcome.events
        self.cancels = outcome.cancels or []
        return outcome.reply, self.mutations

    def ok(self, cmd: dict[str, Any], at: int = 0, conn: str | None = None) -> Reply:
        """Run `cmd` and assert it succeeded; returns the reply."""
        reply, _ = self.run(cmd, at, conn)
        assert reply.get("ok") is True, (cmd, reply)
        return reply

    def err(self, cmd: dict[str, Any], at: int = 0, *, mutates: bool = False) -> str:
        """Run `cmd`, assert it was refused, and return the error string.

        A refused command changes nothing, so no mutation may come out unless `mutates`.
        """
        reply, mutations = self.run(cmd, at)
        assert reply.get("ok") is False, (cmd, reply)
        assert set(reply) == {"ok", "error"}, reply
        if not mutates:
            assert mutations == [], mutations
        error = reply["error"]
        assert isinstance(error, str)
        return error

    def tick(self, at: int) -> tuple[list[tuple[str, str, str]], list[Mutation]]:
        events, mutations = self.engine.tick(at)
        self.mutations = list(mutations)
        return list(events), self.mutations

    # -- producing and consuming -----------------------------------------------------------

    def push(self, queue: str = "q", at: int = 0, **fields: Any) -> str:
        fields.setdefault("data", {})
        reply = self.ok({"cmd": "PUSH", "queue": queue, **fields}, at)
        job_id = reply["id"]
        assert isinstance(job_id, str)
        return job_id

    def pushb(self, jobs: list[dict[str, Any]], queue: str = "q", at: int = 0) -> list[str]:
        reply = self.ok({"cmd": "PUSHB", "queue": queue, "jobs": jobs}, at)
        return list(reply["ids"])

    def pull(
        self,
        queue: str = "q",
        at: int = 0,
        owner: str | None = "w1",
        conn: str | None = None,
        **fields: Any,
    ) -> tuple[Reply | None, str | None]:
        """PULL one job for connection `conn`; returns (job, token). The token is None
        without an owner."""
        cmd: dict[str, Any] = {"cmd": "PULL", "queue": queue, **fields}
        if owner is not None:
            cmd["owner"] = owner
        reply = self.ok(cmd, at, conn)
        return reply["job"], reply.get("token")

    def pull_id(
        self,
        queue: str = "q",
        at: int = 0,
        owner: str | None = "w1",
        conn: str | None = None,
        **fields: Any,
    ) -> tuple[str, str | None]:
        """PULL one job that must exist; returns (id, token)."""
        job, token = self.pull(queue, at, owner, conn, **fields)
        assert job is not None, "expected a job"
        return job["id"], token

    def ack(self, job_id: str, token: str | None = None, at: int = 0, **fields: Any) -> Reply:
        cmd: dict[str, Any] = {"cmd": "ACK", "id": job_id, **fields}
        if token is not None:
            cmd["token"] = token
        return self.ok(cmd, at)

    def fail(self, job_id: str, token: str | None = None, at: int = 0, **fields: Any) -> Reply:
        cmd: dict[str, Any] = {"cmd": "FAIL", "id": job_id, **fields}
        if token is not None:
            cmd["token"] = token
        return self.ok(cmd, at)

    def run_to_completion(self, queue: str = "q", at: int = 0, result: Any = None) -> str:
        """Pull the next job and ACK it with `result`; returns its id."""
        job_id, token = self.pull_id(queue, at)
        self.ack(job_id, token, at, result=result)
        return job_id

    def run_to_dlq(self, queue: str = "q", at: int = 0, error: str = "boom") -> str:
        """Pull the next job and fail it unrecoverably; returns its id."""
        job_id, token = self.pull_id(queue, at)
        self.fail(job_id, token, at, error=error, unrecoverable=True)
        return job_id

    # -- queries ---------------------------------------------------------------------------

    def job(self, job_id: str, at: int = 0) -> Reply:
        job = self.ok({"cmd": "GetJob", "id": job_id}, at)["job"]
        assert isinstance(job, dict)
        return job

    def state(self, job_id: str, at: int = 0) -> str:
        state = self.ok({"cmd": "GetState", "id": job_id}, at)["state"]
        assert isinstance(state, str)
        return state

    def counts(self, queue: str = "q", at: int = 0) -> dict[str, int]:
        return dict(self.ok({"cmd": "GetJobCounts", "queue": queue}, at)["counts"])

    def dlq_ids(self, queue: str = "q", at: int = 0) -> list[str]:
        return [j["id"] for j in self.ok({"cmd": "Dlq", "queue": queue}, at)["jobs"]]


def kinds(mutations: list[Mutation]) -> list[str]:
    """The kind of each mutation, in order ("put", "upd", "del", "queue", "qdel")."""
    return [m[0] for m in mutations]


def upd_states(mutations: list[Mutation], job_id: str) -> list[str]:
    """The states an "upd" moved `job_id` to, in order."""
    return [
        m[2]["state"] for m in mutations if m[0] == "upd" and m[1] == job_id and "state" in m[2]
    ]
