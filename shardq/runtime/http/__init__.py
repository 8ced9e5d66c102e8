"""The HTTP process: health, Prometheus, bunqueue's REST API and the dashboard (docs/http.md).

Owns: the HTTP listener (`http_port`, aiohttp; HTTPS with `tls_cert_file`, `_tls_site.py`),
bunqueue's CORS answers and per-IP rate limit (`_edge.py`), the samples behind the per-queue
rates (`_rates.py`), and one client connection to the front end (over TLS when the TCP port
speaks it).

Receives: HTTP requests; replies from the front end on its connection (among them `Stats`,
whose `storageStalled` says whether shards see their writer stalled, and `Metrics`, which
carries latency histograms and each shard's requests in flight); the writer's status file
(`<run dir>/writer-status.json`: storage degraded, flush sizes and durations); the other
processes' resident memory and the database's file sizes, read from /proc and the file system.

Sends: bunqueue commands to the front end, as any TCP client does (every REST route is one
command the TCP port serves); `ready` to the supervisor once it listens. It never talks to a
shard or the writer: a stuck monitoring request cannot slow the queues down.
"""

from shardq.runtime.http._process import main

__all__ = ["main"]
