"""The report: ratios against the targets of issue 5, the JSON file and the Markdown table."""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.compare._model import SCENARIOS, Row, Scenario

__all__ = ["Ratio", "markdown", "ratios", "write"]

PY_PEERS = ("huey", "rq", "celery", "dramatiq", "arq", "saq", "taskiq")
STANDIN = "standin"  # bench.bq_ceiling's stand-in: the client's ceiling, not a queue
_KIND = {s.key: s.kind for s in SCENARIOS}
SHARDQ_CLIENT_PREFERENCE = ("shardq-sdk", "bunqueue-client", "raw", "shardq-tasks")


@dataclass
class Ratio:
    """shardq against one other contestant on one scenario; > 1 means shardq is better."""

    scenario: str
    against: str  # "bunqueue", "fastest Python peer", or one peer (issue 15's task rows)
    client: str
    shardq: float
    other: float
    other_peer: str
    ratio: float
    target: float | None  # None: reported for information (shardq's SDK against another client)
    per_round: list[float] = field(default_factory=list)  # --interleave: the ratio of each round

    @property
    def met(self) -> bool | None:
        return None if self.target is None else self.ratio >= self.target

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "met": self.met}


def _better(sc: Scenario, shardq: float, other: float) -> float:
    """Throughput: shardq / other; latency (lower is better): other / shardq."""
    if sc.unit == "ms":
        return other / shardq if shardq > 0 else float("inf")
    return shardq / other if other > 0 else float("inf")


def _bunqueue_target(sc: Scenario) -> float:
    return 1.5 if sc.kind in ("pipelined", "drain", "rawdrain") and sc.mode != "durable" else 1.0


def _python_target(sc: Scenario) -> float:
    return 5.0 if sc.kind == "drain" else 1.0


def _per_round(sc: Scenario, mine: Row, theirs: Row) -> list[float]:
    """The ratio of each round both sides measured (rows of an --interleave run), in order."""
    if not mine.rounds or not theirs.rounds:
        return []
    other = dict(zip(theirs.rounds, theirs.samples, strict=True))
    return [_better(sc, s, other[r]) for r, s in zip(mine.rounds, mine.samples, strict=True)
            if r in other and s > 0 and other[r] > 0]  # fmt: skip


def _find(rows: list[Row], scenario: str, peer: str, client: str | None = None) -> Row | None:
    for row in rows:
        wanted = client is None or row.client.startswith(client)
        if row.scenario == scenario and row.peer == peer and row.median is not None and wanted:
            return row
    return None


def _vs_bunqueue(sc: Scenario, rows: list[Row]) -> Iterable[Ratio]:
    for client in ("bunqueue-client", "raw", "shardq-sdk"):
        mine = _find(rows, sc.key, "shardq", client)
        # shardq's own SDK against bunqueue driven by bunqueue-client: reported, but the
        # same-client ratio is the one the target is about.
        theirs = _find(rows, sc.key, "bunqueue", "bunqueue-client" if client == "shardq-sdk"
                       else client)  # fmt: skip
        if mine and theirs and mine.median and theirs.median:
            same = client != "shardq-sdk"
            label = client if same else "shardq-sdk vs bunqueue-client"
            yield Ratio(sc.key, "bunqueue", label, mine.median, theirs.median, "bunqueue",
                        _better(sc, mine.median, theirs.median),
                        _bunqueue_target(sc) if same else None,
                        _per_round(sc, mine, theirs))  # fmt: skip


def _vs_python(sc: Scenario, rows: list[Row]) -> Iterable[Ratio]:
    peers = [r for r in rows if r.scenario == sc.key and r.peer in PY_PEERS and r.median]
    mine = next((r for c in SHARDQ_CLIENT_PREFERENCE if (r := _find(rows, sc.key, "shardq", c))),
                None)  # fmt: skip
    if not peers or mine is None or not mine.median:
        return
    scored = [(_better(sc, mine.median, p.median or 0.0), p) for p in peers]
    ratio, best = min(scored, key=lambda pair: pair[0])  # the fastest peer = shardq's worst ratio
    yield Ratio(sc.key, "fastest Python peer", mine.client, mine.median, best.median or 0.0,
                best.peer, ratio, _python_target(sc), _per_round(sc, mine, best))  # fmt: skip


def _vs_each_peer(sc: Scenario, rows: list[Row]) -> Iterable[Ratio]:
    """Issue 15 asks for shardq/peer for every task peer, not only the fastest."""
    mine = _find(rows, sc.key, "shardq", "shardq-tasks")
    if not sc.tasks or mine is None or not mine.median:
        return
    for p in rows:
        if p.scenario == sc.key and p.peer in PY_PEERS and p.median:
            yield Ratio(sc.key, p.peer, mine.client, mine.median, p.median, p.peer,
                        _better(sc, mine.median, p.median), None,
                        _per_round(sc, mine, p))  # fmt: skip


def _vs_standin(sc: Scenario, rows: list[Row]) -> Iterable[Ratio]:
    """shardq against the stand-in, both through bunqueue-client: the share of the client's own
    ceiling that shardq reaches (for information: the stand-in is not a queue)."""
    mine = _find(rows, sc.key, "shardq", "bunqueue-client")
    ceiling = _find(rows, sc.key, STANDIN)
    if mine and ceiling and mine.median and ceiling.median:
        yield Ratio(sc.key, "stand-in (the client's ceiling)", "bunqueue-client", mine.median,
                    ceiling.median, STANDIN, _better(sc, mine.median, ceiling.median), None,
                    _per_round(sc, mine, ceiling))  # fmt: skip


def ratios(rows: list[Row]) -> list[Ratio]:
    out: list[Ratio] = []
    for sc in SCENARIOS:
        out.extend(_vs_bunqueue(sc, rows))
        out.extend(_vs_python(sc, rows))
        out.extend(_vs_each_peer(sc, rows))
        out.extend(_vs_standin(sc, rows))
    return out


CEILING_TEXT = (
    "The `standin` rows are a measuring device, not a queue: `python -m bench.bq_ceiling`'s "
    "stand-in server answers every request at once from memory, with replies of the shape and "
    "size shardq sends (the same job fields, ids and lease tokens), and stores nothing. "
    "Driven by the same bunqueue-client as shardq and bunqueue, its rate is what that client "
    "reaches on this machine against a server that costs next to nothing: no server, however "
    "fast, goes past it with this client. 'of the ceiling' is a row's rate over the stand-in's; "
    "'at most' is the stand-in's rate over bunqueue's, the highest ratio against bunqueue this "
    "client can show. The CPU figures are the client's own (the worker process for a drain, "
    "the pushing process for a single push), per job, from the kernel's counters."
)


def _cpu_note(row: Row) -> str:
    cpu = row.extra.get("client_cpu_us")
    return f" (client CPU {cpu['median']:,.0f} µs a job)" if cpu else ""


def _ceiling_lines(rows: list[Row]) -> list[str]:
    lines: list[str] = []
    for ceiling in rows:
        if ceiling.peer != STANDIN or not ceiling.median:
            continue
        parts = [f"stand-in {_num(ceiling.median, ceiling.unit)} {ceiling.unit}"
                 f"{_cpu_note(ceiling)}"]  # fmt: skip
        for peer in ("shardq", "bunqueue"):
            row = _find(rows, ceiling.scenario, peer, "bunqueue-client")
            if row and row.median:
                parts.append(f"{peer} {row.median / ceiling.median:.2f} of the ceiling"
                             f"{_cpu_note(row)}")  # fmt: skip
        theirs = _find(rows, ceiling.scenario, "bunqueue", "bunqueue-client")
        if theirs and theirs.median:
            parts.append(f"at most {ceiling.median / theirs.median:.2f}x bunqueue with this client")
        lines.append(f"- {ceiling.scenario}, {ceiling.client}: " + "; ".join(parts))
    return ["## The client's ceiling (stand-in)", "", CEILING_TEXT, "", *lines, ""] if lines else []


def _num(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    return f"{value:,.1f}" if unit == "ms" else f"{value:,.0f}"


def _short_mode(mode: str) -> str:
    return mode.split(":", 1)[0]


def _results_table(rows: list[Row]) -> list[str]:
    lines = [
        "| # | scenario | q | peer | client | mode | median | min | max | unit | notes |",
        "|---:|---|---:|---|---|---|---:|---:|---:|---|---|",
    ]
    for row in rows:
        notes = [row.note] if row.note else []
        if "p50_us" in row.extra:
            notes.append(f"p50 {row.extra['p50_us']['median']:,.0f} µs a call (median of repeats)")
        if "client_cpu_us" in row.extra:
            who = "worker" if _KIND.get(row.scenario) == "drain" else "client"
            notes.append(f"{who} CPU {row.extra['client_cpu_us']['median']:,.0f} µs a job")
        if "p99_ms" in row.extra:
            notes.append(f"p99 {row.extra['p99_ms']['median']:,.1f} ms (median of repeats)")
        unit = "ms p50" if row.unit == "ms" else row.unit
        if "completed" in row.extra and row.extra["completed"]["min"] < row.jobs:
            notes.append(f"window cut: {row.extra['completed']['min']:,.0f} of {row.jobs:,} done")
        lines.append(
            f"| {row.group} | {row.title} | {row.queues} | {row.peer} | {row.client} | "
            f"{_short_mode(row.mode)} | {_num(row.median, row.unit)} | {_num(row.min, row.unit)} | "
            f"{_num(row.max, row.unit)} | {unit} | {'; '.join(notes)} |"
        )
    return lines


def _ratio_table(items: list[Ratio]) -> list[str]:
    rounds = any(r.per_round for r in items)
    head = "| scenario | against | client | shardq | other | ratio | target | met |"
    rule = "|---|---|---|---:|---:|---:|---:|---|"
    if rounds:
        head += " per round | median per round |"
        rule += "---|---:|"
    lines = [head, rule]
    for r in items:
        other = f"{r.other_peer} {r.other:,.1f}" if r.other_peer else f"{r.other:,.1f}"
        target = "-" if r.target is None else f"{r.target:.1f}x"
        met = {None: "(info)", True: "yes", False: "**no**"}[r.met]
        line = (
            f"| {r.scenario} | {r.against} | {r.client} | {r.shardq:,.1f} | {other} | "
            f"{r.ratio:.2f}x | {target} | {met} |"
        )
        if rounds:
            each = " ".join(f"{x:.2f}" for x in r.per_round) or "-"
            middle = f"{statistics.median(r.per_round):.2f}x" if r.per_round else "-"
            line += f" {each} | {middle} |"
        lines.append(line)
    return lines


def markdown(report: dict[str, Any], rows: list[Row], items: list[Ratio]) -> str:
    machine = report["machine"]
    out = [
        f"# shardq comparison, {report['date']}",
        "",
        f"Command: `{report['command']}`",
        "",
        f"Machine: {machine['cpu_model']}, {machine['cpu_count']} CPUs, "
        f"{machine['memory_gib']} GiB, {machine['os']}, Python {machine['python']}; load average "
        f"at start {', '.join(f'{x:.2f}' for x in machine['load_average_at_start'])}.",
        "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in report["versions"].items()) + ".",
        "",
        "Settings: " + ", ".join(f"{k}={v}" for k, v in report["settings"].items()) + ".",
        "",
        "## Results (median, min, max of the repeats)",
        "",
        *_results_table(rows),
        "",
        "## Ratios (above 1 = shardq better; latency compares p50)",
        "",
        *_ratio_table(items),
        "",
        *_ceiling_lines(rows),
        "## Durability modes",
        "",
        *[f"- {peer}: {mode}" for peer, mode in report["modes"].items()],
        "",
        "## Commands (ports and temporary paths vary per run)",
        "",
        *[f"- {name}: `{cmd}`" for name, cmd in report["commands"].items()],
        "",
        "## Notes",
        "",
        *[f"- {note}" for note in report["notes"]],
        "",
    ]
    return "\n".join(out)


def write(out_dir: Path, stem: str, report: dict[str, Any], text: str) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / f"{stem}.json", out_dir / f"{stem}.md"
    json_path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    md_path.write_text(text)
    return json_path, md_path
