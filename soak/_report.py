"""The checks at the end of a run, the JSON report and the plot.

Every check reads the ledger, so it judges what the server acknowledged, not what the soak
meant to send. A loss or a rerun is excused only inside a recorded fault's window: from
`loss_window_s` before a kill started to its recovery, the time a kill may catch an answer
the writer had not committed yet (docs/runtime.md, "Durability in the shard").
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, Final

from soak._config import SoakConfig
from soak._ledger import Ledger
from soak._progress import Sample

__all__ = ["check_ledger", "check_rss", "plot_faults", "write_plot", "write_report"]


def _in_window(t: float, faults: Sequence[tuple[str, float, float]], window: float) -> bool:
    return any(started - window <= t <= ended for _, started, ended in faults)


# Only a kill can lose an answer: a SIGTERM restart writes everything it answered first
# (docs/runtime.md, "Graceful shutdown"), so it excuses nothing.
LOSSY_FAULTS = frozenset({"kill_shard", "kill_writer", "kill_server"})


def check_ledger(ledger: Ledger, cfg: SoakConfig) -> dict[str, Any]:
    """Durable losses, buffered losses (excused or not) and reruns after a completion."""
    faults = [f for f in ledger.faults() if f[0] in LOSSY_FAULTS]
    window = cfg.loss_window_s
    durable_lost = [i for i, _ in ledger.unacked(durable=True)]
    buffered = ledger.unacked(durable=False)
    buffered_excused = [i for i, t in buffered if _in_window(t, faults, window)]
    buffered_lost = [i for i, t in buffered if not _in_window(t, faults, window)]
    reruns = ledger.reruns()
    reruns_excused = [i for i, t in reruns if _in_window(t, faults, window)]
    reruns_bad = [i for i, t in reruns if not _in_window(t, faults, window)]
    return {
        "pushes_acknowledged": ledger.scalar("SELECT COUNT(*) FROM pushes"),
        "durable_pushes": ledger.scalar("SELECT COUNT(*) FROM pushes WHERE durable = 1"),
        "deliveries": ledger.scalar("SELECT COUNT(*) FROM runs"),
        "completions_acknowledged": ledger.scalar("SELECT COUNT(DISTINCT job_id) FROM acks"),
        "durable_lost": len(durable_lost),
        "durable_lost_ids": durable_lost[:20],
        "buffered_lost_in_fault_window": len(buffered_excused),
        "buffered_lost_outside_window": len(buffered_lost),
        "buffered_lost_ids": buffered_lost[:20],
        "reruns_after_completion_in_fault_window": len(reruns_excused),
        "reruns_after_completion_outside_window": len(reruns_bad),
        "rerun_ids": reruns_bad[:20],
    }


def check_rss(samples: Sequence[Sample], cfg: SoakConfig) -> dict[str, Any]:
    """Total server RSS: the mean of the last fifth against the mean of the second fifth."""
    totals = [(s.elapsed_s, sum(s.rss.values())) for s in samples if s.rss]
    span = totals[-1][0] - totals[0][0] if len(totals) > 1 else 0.0
    if span / 5 < cfg.rss_min_fifth_s or len(totals) < 10:
        return {
            "checked": False,
            "reason": f"run too short: a fifth is {span / 5:.1f} s of samples, "
            f"under the {cfg.rss_min_fifth_s:g} s a plateau needs",
        }
    fifth = len(totals) // 5
    second = [v for _, v in totals[fifth : 2 * fifth]]
    last = [v for _, v in totals[-fifth:]]
    base, end = sum(second) / len(second), sum(last) / len(last)
    growth = (end - base) / base if base else 0.0
    return {
        "checked": True,
        "second_fifth_mean_bytes": int(base),
        "last_fifth_mean_bytes": int(end),
        "growth": round(growth, 4),
        "ok": growth <= cfg.rss_growth_max,
    }


def violations(ledger_check: dict[str, Any], rss: dict[str, Any], drain: dict[str, Any],
               fault_failures: list[str]) -> list[str]:  # fmt: skip
    """Every broken invariant, in words; empty when the run passed."""
    broken: list[str] = []
    if ledger_check["durable_lost"]:
        broken.append(f"{ledger_check['durable_lost']} acknowledged durable jobs never completed")
    if ledger_check["buffered_lost_outside_window"]:
        n = ledger_check["buffered_lost_outside_window"]
        broken.append(f"{n} buffered jobs lost outside any fault window")
    if ledger_check["reruns_after_completion_outside_window"]:
        n = ledger_check["reruns_after_completion_outside_window"]
        broken.append(f"{n} jobs ran again after an acknowledged completion")
    if rss.get("checked") and not rss.get("ok"):
        broken.append(f"RSS grew {rss['growth']:.1%} from the second fifth to the last")
    if not drain.get("drained"):
        broken.append(f"queues did not drain to zero: {drain.get('left')}")
    elif not drain.get("baseline"):
        broken.append(f"server collections not back to baseline after the drain: {drain['stats']}")
    broken += [f"fault without recovery: {f}" for f in fault_failures]
    return broken


def write_report(path: Path, report: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, default=str) + "\n")


# One colour per kind of fault, so the plot's legend names what each band was.
FAULT_COLOURS: Final = {
    "kill_shard": "tab:red", "kill_writer": "tab:purple", "kill_server": "black",
    "rolling_restart": "tab:orange",
}  # fmt: skip
PLOT_MISSING: Final = "soak.png not written: matplotlib is missing (pip install 'shardq[plot]')"


def write_plot(
    path: Path,
    samples: Sequence[Sample],
    faults: Sequence[tuple[str, float, float]] = (),
    title: str = "shardq soak",
) -> bool:
    """Throughput, push-to-completion latency and RSS per process over time, one PNG, under
    `title`; each fault (kind, start and end in seconds since the first sample) is a shaded
    band on every panel. False, with a line on stderr, when matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        print(PLOT_MISSING, file=sys.stderr, flush=True)
        return False
    matplotlib.use("Agg")  # no display: the soak runs in CI and over ssh
    import matplotlib.pyplot as plt

    t = [s.elapsed_s for s in samples]
    fig, (ax1, ax2, ax3) = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
    fig.suptitle(title)
    ax1.plot(t, [s.jobs_per_s for s in samples])
    ax1.set_ylabel("completions/s")
    for label, key in (("p50", "latency_p50_ms"), ("p99", "latency_p99_ms")):
        ax2.plot(t, [getattr(s, key) if getattr(s, key) is not None else float("nan")
                     for s in samples], label=label)  # fmt: skip
    ax2.set_ylabel("push→ack ms")
    names = sorted({n for s in samples for n in s.rss})
    for name in names:
        ax3.plot(t, [s.rss.get(name, 0) / 2**20 for s in samples], label=name)
    ax3.set_ylabel("RSS MiB")
    ax3.set_xlabel("elapsed s")
    _mark_faults((ax1, ax2, ax3), faults)
    if faults:
        ax1.legend(fontsize="small", loc="upper right")
    ax2.legend()
    if names:
        ax3.legend(fontsize="small")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    # The title and the marked faults also go into the PNG's text chunks, for tools and tests.
    marked = "; ".join(f"{k} {a:.1f}-{b:.1f} s" for k, a, b in faults)
    fig.savefig(path, dpi=80, metadata={"Title": title, "Description": f"faults: {marked}"})
    plt.close(fig)
    return True


def _mark_faults(axes: Sequence[Any], faults: Sequence[tuple[str, float, float]]) -> None:
    """A shaded band per process fault; worker churn, which comes every few hundred ms and
    would shade everything, as ticks along the bottom of the first panel."""
    churn = [start for kind, start, _ in faults if kind == "worker_churn"]
    if churn:
        axes[0].plot(churn, [0] * len(churn), "|", color="tab:green", markersize=8,
                     label=f"worker_churn ({len(churn)})")  # fmt: skip
    labelled: set[str] = set()
    for kind, start, end in faults:
        if kind == "worker_churn":
            continue
        colour = FAULT_COLOURS.get(kind, "tab:gray")
        for ax in axes:
            # A band at least a visible sliver wide: a kill recovers in well under a second.
            label = kind if ax is axes[0] and kind not in labelled else None
            ax.axvspan(start, max(end, start + 0.2), color=colour, alpha=0.25, label=label)
        labelled.add(kind)


def plot_faults(
    faults: Sequence[tuple[str, float, float]], started_wall: float
) -> list[tuple[str, float, float]]:
    """The ledger's faults of this run (wall-clock times) as seconds since its start."""
    return [(k, s - started_wall, e - started_wall) for k, s, e in faults if s >= started_wall]


def samples_json(samples: Sequence[Sample]) -> list[dict[str, Any]]:
    return [asdict(s) for s in samples]
