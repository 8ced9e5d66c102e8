"""shardq's Python client: `Queue`/`Worker` and their asyncio twins, over TCP or ZeroMQ.

    from shardq.client import Queue, Worker

    with Queue("emails", url="tcp://127.0.0.1:6789") as queue:
        job_id = queue.add("welcome", {"to": "a@b.c"})

    def send(job):
        return f"sent to {job.data['to']}"

    Worker("emails", send, concurrency=10, url="zmq://127.0.0.1:6788").run_until_idle()

The transport follows the URL: `tcp://` speaks bunqueue's framing (`tls://` over TLS), `zmq://`
the same command maps over a ZeroMQ DEALER. `zmq_server_key=` (CURVE), `tls_ca_file=` and
`tls_context=` secure it, else `SHARDQ_ZMQ_SERVER_KEY` and `SHARDQ_TLS_CA_FILE`, read once when
a connection is made; its one `Transports` factory opens the command transports and the event
streams alike. A worker leases up to `prefetch` (64) jobs ahead of its free
handlers, renewing their leases while they wait, and ACKs in batches (`ack_batch`); both are
options of `WorkerConfig`. A sans-IO core (`ClientCore`) does request ids, reply matching and
error mapping; the blocking and asyncio transports are thin adapters around it. Several nodes
on one database: `ClusterConnection` / `AsyncClusterConnection` (pass one as a queue's
`connection=`) follow `MOVED` to the node holding a queue (docs/cluster.md). Errors are a
tree under `shardq.errors.ShardqError` (see `shardq.client._errors`).

Owns: the client's connections (one command transport each, its event streams), request ids
and reply matching, a worker's leases, prefetched jobs and batched ACKs.

Receives: the user's calls (`add`, a handler's return or exception); replies, pushed job
events and error replies from the server, mapped to `shardq.errors`.

Sends: bunqueue command maps to the server's TCP or ZeroMQ port (PUSH, PULL, ACK, FAIL, ...);
results and job handles back to the caller.
"""

from typing import TYPE_CHECKING

from shardq._lazy import lazy_exports

if TYPE_CHECKING:
    from ._async_cluster import AsyncClusterConnection
    from ._async_connection import AsyncConnection
    from ._async_events import AsyncEventStream
    from ._async_queue import AsyncQueue, async_join
    from ._async_worker import AsyncWorker, Handler
    from ._cluster import ClusterConnection
    from ._connection import Connection
    from ._core import ClientCore, Framing, checked
    from ._current import JobCancelled, RunningJob, current_job
    from ._errors import (
        TRANSIENT_ERRORS,
        AuthenticationFailed,
        ClientClosed,
        ClientError,
        CommandTimeout,
        ConnectionLost,
        DeadLettered,
        InternalServerError,
        JobFailed,
        LeaseLost,
        NotFound,
        RateLimited,
        SerializationError,
        ServerError,
        StorageUnavailable,
        TransientServerError,
        UnrecoverableError,
        WaitTimeout,
        error_from_reply,
        is_transient,
    )
    from ._events import EventStream, QueueEvent
    from ._models import DlqEntry, Job, JobCounts, JobOptions
    from ._ops import BulkJob
    from ._queue import Queue, join
    from ._retry import RetryPolicy
    from ._tcp import CommandFailed, ConnectionClosed, TcpConnection
    from ._url import DEFAULT_URL, Endpoint, parse_url
    from ._worker import Worker
    from ._worker_config import WorkerConfig, WorkerOptions
    from ._worker_state import WorkerStats

__all__ = [
    "DEFAULT_URL",
    "TRANSIENT_ERRORS",
    "AsyncClusterConnection",
    "AsyncConnection",
    "AsyncEventStream",
    "AsyncQueue",
    "AsyncWorker",
    "AuthenticationFailed",
    "BulkJob",
    "ClientClosed",
    "ClientCore",
    "ClientError",
    "ClusterConnection",
    "CommandFailed",
    "CommandTimeout",
    "Connection",
    "ConnectionClosed",
    "ConnectionLost",
    "DeadLettered",
    "DlqEntry",
    "Endpoint",
    "EventStream",
    "Framing",
    "Handler",
    "InternalServerError",
    "Job",
    "JobCancelled",
    "JobCounts",
    "JobFailed",
    "JobOptions",
    "LeaseLost",
    "NotFound",
    "Queue",
    "QueueEvent",
    "RateLimited",
    "RetryPolicy",
    "RunningJob",
    "SerializationError",
    "ServerError",
    "StorageUnavailable",
    "TcpConnection",
    "TransientServerError",
    "UnrecoverableError",
    "WaitTimeout",
    "Worker",
    "WorkerConfig",
    "WorkerOptions",
    "WorkerStats",
    "async_join",
    "checked",
    "current_job",
    "error_from_reply",
    "is_transient",
    "join",
    "parse_url",
]

# Where each name lives, imported on first use: `Queue` alone needs neither the asyncio
# classes, the worker, ZeroMQ's event streams nor structlog, and the `shardq` command line and
# web applications that only push paid for all of them at import
# (tests/test_import_boundary.py); the server's front end and HTTP process use a few of the
# client's modules and imported all of them at every start (tests/runtime/test_lean_processes.py).
_HOME = {
    "DEFAULT_URL": "_url",
    "TRANSIENT_ERRORS": "_errors",
    "AsyncClusterConnection": "_async_cluster",
    "AsyncConnection": "_async_connection",
    "AsyncEventStream": "_async_events",
    "AsyncQueue": "_async_queue",
    "AsyncWorker": "_async_worker",
    "AuthenticationFailed": "_errors",
    "BulkJob": "_ops",
    "ClientClosed": "_errors",
    "ClientCore": "_core",
    "ClientError": "_errors",
    "ClusterConnection": "_cluster",
    "CommandFailed": "_tcp",
    "CommandTimeout": "_errors",
    "Connection": "_connection",
    "ConnectionClosed": "_tcp",
    "ConnectionLost": "_errors",
    "DeadLettered": "_errors",
    "DlqEntry": "_models",
    "Endpoint": "_url",
    "EventStream": "_events",
    "Framing": "_core",
    "Handler": "_async_worker",
    "InternalServerError": "_errors",
    "Job": "_models",
    "JobCancelled": "_current",
    "JobCounts": "_models",
    "JobFailed": "_errors",
    "JobOptions": "_models",
    "LeaseLost": "_errors",
    "NotFound": "_errors",
    "Queue": "_queue",
    "QueueEvent": "_events",
    "RateLimited": "_errors",
    "RetryPolicy": "_retry",
    "RunningJob": "_current",
    "SerializationError": "_errors",
    "ServerError": "_errors",
    "StorageUnavailable": "_errors",
    "TcpConnection": "_tcp",
    "TransientServerError": "_errors",
    "UnrecoverableError": "_errors",
    "WaitTimeout": "_errors",
    "Worker": "_worker",
    "WorkerConfig": "_worker_config",
    "WorkerOptions": "_worker_config",
    "WorkerStats": "_worker_state",
    "async_join": "_async_queue",
    "checked": "_core",
    "current_job": "_current",
    "error_from_reply": "_errors",
    "is_transient": "_errors",
    "join": "_queue",
    "parse_url": "_url",
}


__getattr__ = lazy_exports(__name__, _HOME, globals())
