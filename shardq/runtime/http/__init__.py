"""The HTTP process: health, Prometheus, bunqueue's REST API and the dashboard (docs/http.md).

Owns: the HTTP listener (`http_port`, aiohttp; HTTPS with `tls_cert_file`, `_tls_site.py`),
bunqueue's CORS answers and per-IP rate limit (`_edge.py`), the samples behind the per-queue
rates (`_rates.py`), the pending webhook deliveries and their retries, the SSE and WebSocket
streams, and its client connections to the front end (over TLS when the TCP port speaks it).

Receives: HTTP requests; replies and job events from the front end (the events feed SSE, /ws
and webhooks; `WebhookSync` brings the registry); among the replies `Stats`, whose
`storageStalled` says whether shards see their writer stalled, and `Metrics`, which carries
latency histograms and each shard's requests in flight; the writer's status file
(`<run dir>/writer-status.json`: storage degraded, flush sizes and durations); the other
processes' resident memory and the database's file sizes, read from /proc and the file system.

Sends: bunqueue commands to the front end, as any TCP client does (every REST route is one
command the TCP port serves); webhook requests to their receivers; `ready` to the supervisor
once it listens (`fatal` if it cannot). It never talks to a shard or the writer: a stuck
monitoring request cannot slow the queues down.
"""

# Nothing imported here: `python -m` imports this package before its `__main__`, which
# must first leave out the optional extras (`shardq.runtime._lean`).
