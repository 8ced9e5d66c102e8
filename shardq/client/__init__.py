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

from shardq.client._async_queue import AsyncQueue, async_join
from shardq.client._async_worker import AsyncWorker, Handler
from shardq.client._cluster import AsyncClusterConnection, ClusterConnection
from shardq.client._connection import AsyncConnection, Connection
from shardq.client._core import ClientCore, Framing, checked
from shardq.client._current import JobCancelled, RunningJob, current_job
from shardq.client._errors import (
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
from shardq.client._events import AsyncEventStream, EventStream, QueueEvent
from shardq.client._models import DlqEntry, Job, JobCounts, JobOptions
from shardq.client._ops import BulkJob
from shardq.client._queue import Queue, join
from shardq.client._retry import RetryPolicy
from shardq.client._tcp import CommandFailed, ConnectionClosed, TcpConnection
from shardq.client._url import DEFAULT_URL, Endpoint, parse_url
from shardq.client._worker import Worker
from shardq.client._worker_config import WorkerConfig, WorkerOptions
from shardq.client._worker_state import WorkerStats

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
