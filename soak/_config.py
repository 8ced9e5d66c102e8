"""`SoakConfig`: the load mix, the fault schedule and the check thresholds of one soak run.

Defaults are the profile of `configs/soak.toml`; a TOML file overrides them per section and the
CLI flags override the file. Every rate and period is bounded below so no loop can spin.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

__all__ = ["FaultConfig", "LoadConfig", "SoakConfig", "load_soak_config"]


@dataclass(frozen=True)
class LoadConfig:
    """What producers and workers do; shares are fractions of the pushes."""

    producers: int = 2
    rate: float = 200.0  # pushes per second, all producers together
    queues: int = 4
    workers: int = 4
    batch: int = 16  # PULLB count
    bulk_share: float = 0.2  # pushes that go in a PUSHB of `bulk_size`
    bulk_size: int = 8
    durable_share: float = 0.3
    delay_share: float = 0.1
    max_delay_ms: int = 300
    priority_share: float = 0.2
    fail_share: float = 0.05  # jobs whose first attempt fails (FAIL), to exercise retries
    max_attempts: int = 50  # high: restarts charge attempts, and no job should reach the DLQ
    backoff_ms: int = 50
    bunqueue_share: float = 0.0  # single pushes sent through bunqueue-client instead


@dataclass(frozen=True)
class FaultConfig:
    """The fault schedule. A period of 0 turns that fault off."""

    worker_churn: bool = True
    churn_interval_ms: int = 400
    kill_shard_every_s: float = 0.0
    kill_writer_every_s: float = 0.0
    kill_server_every_s: float = 0.0
    rolling_restart_every_s: float = 0.0


@dataclass(frozen=True)
class SoakConfig:
    """One soak run. `seconds` is the load phase; the drain and the checks come after it."""

    seconds: float = 72.0
    seed: int = 1
    shards: int = 2
    url: str | None = None  # target a running server instead of starting one
    out_dir: Path = Path("soak-out")
    ledger_path: Path | None = None  # default: out_dir / "ledger.sqlite3"
    progress_interval_s: float = 1.0
    loss_window_s: float = 2.0  # how long after an answer a kill may still lose it
    drain_timeout_s: float = 60.0
    rss_growth_max: float = 0.10
    rss_min_fifth_s: float = 60.0  # shorter fifths measure start-up, not a plateau
    load: LoadConfig = field(default_factory=LoadConfig)
    faults: FaultConfig = field(default_factory=FaultConfig)

    @property
    def ledger(self) -> Path:
        return self.ledger_path or self.out_dir / "ledger.sqlite3"

    def with_overrides(self, **values: Any) -> SoakConfig:
        """A copy with the non-None `values` set; keys of `LoadConfig`/`FaultConfig` go there."""
        top, load, faults = {}, {}, {}
        load_keys = {f.name for f in fields(LoadConfig)}
        fault_keys = {f.name for f in fields(FaultConfig)}
        for key, value in values.items():
            if value is None:
                continue
            if key in load_keys:
                load[key] = value
            elif key in fault_keys:
                faults[key] = value
            else:
                top[key] = value
        return replace(
            self, load=replace(self.load, **load), faults=replace(self.faults, **faults), **top
        )


def load_soak_config(path: Path | None) -> SoakConfig:
    """The defaults, overridden by the TOML file at `path` (sections `[load]`, `[faults]`)."""
    if path is None:
        return SoakConfig()
    with path.open("rb") as f:
        raw = tomllib.load(f)
    values: dict[str, Any] = {k: v for k, v in raw.items() if not isinstance(v, dict)}
    values.update(raw.get("load", {}))
    values.update(raw.get("faults", {}))
    known = {f.name for cls in (SoakConfig, LoadConfig, FaultConfig) for f in fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"{path}: unknown soak settings {unknown}")
    if "out_dir" in values:
        values["out_dir"] = Path(values["out_dir"])
    return SoakConfig().with_overrides(**values)
