"""shardq's pure core: the queue engine. It does no I/O and never reads the clock.

`Engine` builds one job store (`JobStore`: the jobs, queues, leases and the transitions that
alone change them) and the components over it: the job operations (produce, consume, control,
admin, query, introspect, timers) and the parts that own a feature's tables (the queue
limiter, the job groups, cron, flows, the webhook registry and the dead letters). A registry
maps each command to its schema entry, its field check and the component's handler;
`Engine.apply(command, now, conn)` returns an `Outcome`.

Owns: one shard's queues, jobs, leases, groups, limits, cron schedules, flows, webhook
registry and dead-letter queues, in memory.

Receives: one command map at a time with the current time and the client connection (from the
shard process), timer ticks, commit confirmations, and the stored records at recovery.

Sends: nothing itself; each call returns the reply, the mutations the writer must store and the
job events for listeners.
"""

from typing import TYPE_CHECKING

from shardq._lazy import lazy_exports

if TYPE_CHECKING:
    from ._compact import CompactJobs
    from ._config import EngineConfig
    from ._effects import Event, Outcome
    from ._engine import Engine
    from ._ids import IdFactory
    from ._job import Job
    from ._lifecycle import STATES, next_state
    from ._mutations import Mutation, Record, fold_mutations, job_id_of
    from ._names import COMMANDS, FLOW_HELD, FLOW_NOTIFY, FLOW_RELEASE, INTERNAL_COMMANDS
    from ._query import job_view

__all__ = [
    "COMMANDS",
    "FLOW_HELD",
    "FLOW_NOTIFY",
    "FLOW_RELEASE",
    "INTERNAL_COMMANDS",
    "STATES",
    "CompactJobs",
    "Engine",
    "EngineConfig",
    "Event",
    "IdFactory",
    "Job",
    "Mutation",
    "Outcome",
    "Record",
    "fold_mutations",
    "job_id_of",
    "job_view",
    "next_state",
]

# Where each name lives, imported on first use: the supervisor and the HTTP process read the
# engine's settings (`_config`) and the mutation shapes without needing the engine itself, and
# importing it (croniter and dateutil with it) costs each of them some 4 MB for good.
_HOME = {
    "CompactJobs": "_compact",
    "EngineConfig": "_config",
    "Event": "_effects",
    "Outcome": "_effects",
    "COMMANDS": "_names",
    "INTERNAL_COMMANDS": "_names",
    "Engine": "_engine",
    "FLOW_HELD": "_names",
    "FLOW_NOTIFY": "_names",
    "FLOW_RELEASE": "_names",
    "IdFactory": "_ids",
    "Job": "_job",
    "STATES": "_lifecycle",
    "next_state": "_lifecycle",
    "Mutation": "_mutations",
    "Record": "_mutations",
    "fold_mutations": "_mutations",
    "job_id_of": "_mutations",
    "job_view": "_query",
}


__getattr__ = lazy_exports(__name__, _HOME, globals())
