"""shardq's pure core: the queue engine. It does no I/O and never reads the clock."""

from ._config import EngineConfig
from ._effects import Event, Outcome
from ._engine import COMMANDS, INTERNAL_COMMANDS, Engine
from ._flows import FLOW_HELD, FLOW_NOTIFY, FLOW_RELEASE
from ._ids import IdFactory
from ._job import CompactJobs, Job
from ._lifecycle import STATES, next_state
from ._mutations import Mutation, Record, fold_mutations, job_id_of
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
