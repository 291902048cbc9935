"""Run reports: one self-contained HTML page (inline SVG charts, no JavaScript) of the metrics a run logged.

A run is read back from its own files: the JSON Lines log that :class:`~tune.training.metric_logging.DiskLogger`
writes (``metric_logger.log_dir``, ``output_dir/logs`` in the shipped configs), the resolved ``config.yaml`` in
``output_dir``, and ``run.json``, where ``tune run`` records how it ran. ``run.json`` and ``report.html`` live in
the log directory (so that moving an earlier run's logs aside moves them too), or in ``output_dir`` when the log
directory lies outside it (shared by several runs). Every numeric metric gets a chart with the
step on the x axis (``val_<name>`` shares the chart of ``<name>``); several runs overlay one line each.
"""

import html
import json
import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tune.utils import TuneError

__all__ = [
    "RUN_INFO_FILE",
    "RunLog",
    "RunLogError",
    "read_run_log",
    "read_run_logs",
    "render_report",
    "write_report",
]

RUN_INFO_FILE = "run.json"  # written by `tune run`: {"runs": [{recipe, config, wall_seconds, ...}]}
REPORT_FILE = "report.html"
_CONFIG_FILE = "config.yaml"  # tune.config.save_config's file in output_dir
_LOGGER_CONFIG_FILE = "config.json"  # DiskLogger.log_config's file in its log_dir
_NOT_METRICS = ("step", "time")
_MAX_DRAWN_POINTS = 1500  # a longer series is drawn from the min and max of each of 750 buckets
_MAX_MARKERS = 60  # series with at most this many points get a marker (with a hover title) per point
# the peak memory keys of tune.training.memory.get_memory_stats, the most telling first
_PEAK_MEMORY_KEYS = ("peak_memory_reserved", "peak_memory_alloc", "peak_memory_active", "peak_memory_rss")
_COLOURS = (
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22",
)  # fmt: skip


class RunLogError(TuneError):
    """A path holds no metric log to report on (or does not exist); the message says where it looked."""


@dataclass
class RunLog:
    """The metrics of one run, read back from its log files.

    Attributes:
        name (str): how the report names the run (legend, table).
        path (Path): the directory (or log file) it was read from.
        report_dir (Path): where ``run.json`` and the run's own ``report.html`` are: the log directory, or
            ``output_dir`` when the log directory is outside it.
        log_files (list[Path]): the JSON Lines files read, oldest first.
        metrics (dict[str, dict[int, float]]): metric name -> step -> value, steps in logging order; when a step
            was logged twice (a resumed run repeats the steps after its checkpoint) the later value wins.
        times (dict[int, float]): step -> unix time of its last record.
        config (dict[str, Any]): the saved config (empty when none was found).
        info (dict[str, Any]): what ``tune run`` recorded in ``run.json`` (empty when there is none).
        skipped_lines (int): lines of the logs that are not JSON records (a line cut short by a crash).
    """

    name: str
    path: Path
    report_dir: Path
    log_files: list[Path]
    metrics: dict[str, dict[int, float]]
    times: dict[int, float] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    skipped_lines: int = 0

    def summary(self) -> dict[str, str]:
        """The run's header row: recipe, config, model, steps, final loss, best val loss, run time, peak memory.

        Returns:
            dict[str, str]: column name -> text (``"-"`` where the run's files do not say).
        """
        runs = self.info.get("runs") or [{}]
        last = runs[-1]
        loss = self.metrics.get("loss", {})
        val_loss = {step: v for step, v in self.metrics.get("val_loss", {}).items() if math.isfinite(v)}
        steps = [step for values in self.metrics.values() for step in values]
        best_val = min(val_loss.items(), key=lambda item: item[1]) if val_loss else None
        return {
            "recipe": str(last.get("recipe") or "-"),
            "config": str(last.get("config") or "-"),
            "model": _model_name(self.config),
            "steps": str(max(steps)) if steps else "-",
            "final loss": _number(loss[max(loss)]) if loss else "-",
            "best val loss": f"{_number(best_val[1])} (step {best_val[0]})" if best_val else "-",
            "run time": _run_time(runs, self.times),
            "peak memory": _peak_memory(self.metrics),
        }


def read_run_log(path: str | Path, name: str | None = None) -> RunLog:
    """Reads a run's metric log, config and ``run.json``.

    ``path`` is a run's ``output_dir`` (its log is found through the saved config's ``metric_logger.log_dir``,
    else in ``path/logs`` or ``path`` itself), a log directory, or one ``.jsonl`` file. Every ``*.jsonl`` file of
    the log directory is read (a run resumed with the default file name writes a second one), oldest first.

    Args:
        path (str | Path): the directory or file.
        name (str | None): the run's name in the report; default: the directory's name.

    Returns:
        RunLog: the run.

    Raises:
        RunLogError: when ``path`` does not exist or holds no JSON Lines log with records; the message says where
            it looked.
    """
    path = Path(path)
    if not path.exists():
        raise RunLogError(
            f"{path} does not exist: pass a run's output_dir (the directory holding config.yaml and logs/)"
        )
    home = _run_home(path)
    config = _read_config(home)
    if path.is_file():
        looked, files = [path], [path]
    else:
        looked = list(dict.fromkeys([*([path] if path != home else []), *_log_dirs(home, config)]))
        files = next((found for found in (sorted(d.glob("*.jsonl")) for d in looked if d.is_dir()) if found), [])
    if not config and files:
        config = _read_json(files[0].parent / _LOGGER_CONFIG_FILE)
    logs = sorted((_read_records(f) + (f,) for f in files), key=_first_time)
    metrics: dict[str, dict[int, float]] = {}
    times: dict[int, float] = {}
    for records, _, _ in logs:
        for record in records:
            step = record["step"]
            if _is_number(record.get("time")):
                times[step] = float(record["time"])
            for key, value in record.items():
                if key not in _NOT_METRICS and _is_number(value):
                    metrics.setdefault(key, {})[step] = float(value)
    if not metrics:
        where = ", ".join(str(p) for p in looked)
        what = "no metric records in" if files else "no metric log (*.jsonl) in"
        raise RunLogError(
            f"{what} {where}: `tune report` reads the JSON Lines log of tune.training.metric_logging.DiskLogger "
            "(metric_logger.log_dir in the run's config, ${output_dir}/logs in the shipped configs). Pass a run's "
            "output_dir, its log directory or a .jsonl file."
        )
    report_dir = _report_dir(home, files[0].parent)
    info = _read_json(report_dir / RUN_INFO_FILE)
    return RunLog(
        name=name or _default_name(path),
        path=path,
        report_dir=report_dir,
        log_files=[f for _, _, f in logs],
        metrics=metrics,
        times=times,
        config=config,
        info=info if isinstance(info.get("runs"), list) else {},
        skipped_lines=sum(skipped for _, skipped, _ in logs),
    )


def read_run_logs(paths: Sequence[str | Path]) -> list[RunLog]:
    """Reads several runs (see :func:`read_run_log`), named by their directories (with parents where two share a
    name).

    Raises:
        RunLogError: naming the first path that holds no metric log, or when ``paths`` is empty.
    """
    if not paths:
        raise RunLogError("no run to report on: pass at least one output_dir")
    return [read_run_log(path, name) for path, name in zip(paths, _run_names([Path(p) for p in paths]))]


def write_report(runs: Sequence[RunLog | str | Path], out: str | Path | None = None, title: str | None = None) -> Path:
    """Writes the report of ``runs`` (see :func:`render_report`) as one HTML file, atomically.

    Args:
        runs (Sequence[RunLog | str | Path]): runs read by :func:`read_run_logs`, or their paths (output
            directories, log directories or ``.jsonl`` files), read here.
        out (str | Path | None): the file to write; default ``report.html`` in the run's ``report_dir`` for one
            run, in the working directory for several.
        title (str | None): the page's title; default names the runs.

    Returns:
        Path: the file written.

    Raises:
        RunLogError: naming the first path that holds no metric log.
        OSError: when the file cannot be written.
    """
    paths = [r for r in runs if not isinstance(r, RunLog)]
    read = iter(read_run_logs(paths)) if paths else iter(())
    runs = [r if isinstance(r, RunLog) else next(read) for r in runs]
    if not runs:
        raise RunLogError("no run to report on: pass at least one output_dir")
    if out is None:
        out = runs[0].report_dir / REPORT_FILE if len(runs) == 1 else Path(REPORT_FILE)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{out.name}.tmp")
    partial.write_text(render_report(runs, title), encoding="utf-8")
    partial.replace(out)  # a reader never sees half a page
    return out


def render_report(runs: Sequence[RunLog], title: str | None = None) -> str:
    """The report page of ``runs``: a table of the runs, then one chart per metric (loss first).

    Each chart is a ``<figure class="chart" data-metrics="...">`` holding an inline SVG with one
    ``<polyline class="series" data-run=... data-metric=... data-points=N>`` per run and metric (``N`` counts the
    finite values logged; a series longer than 1500 points is drawn from bucket minima and maxima), followed by a
    table of each series' last, minimum and maximum values.

    Args:
        runs (Sequence[RunLog]): the runs, drawn in this order (colour by run).
        title (str | None): the page's title; default names the runs.

    Returns:
        str: the HTML document.
    """
    title = title or "Run report: " + ", ".join(run.name for run in runs)
    generated = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{_esc(title)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>{_esc(title)}</h1>",
        f'<p class="note">Written by tune on {generated} (<code>tune report</code> rebuilds it). '
        "x axis: optimizer step. Hover a point for its value.</p>",
        _runs_table(runs),
        '<section class="charts">',
    ]
    used_ids: set[str] = set()
    for metrics in _chart_groups(runs):
        parts.append(_chart(metrics, runs, used_ids))
    parts += ["</section>", "</body></html>", ""]
    return "\n".join(parts)


# ---------------------------------------------------------------------------------------------------- reading


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _read_records(path: Path) -> tuple[list[dict[str, Any]], int]:
    records, skipped = [], 0
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as error:
        raise RunLogError(f"cannot read the metric log {path}: {error}") from error
    for line in lines:
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            skipped += 1
            continue
        if isinstance(record, dict) and _is_number(record.get("step")):
            record["step"] = int(record["step"])
            records.append(record)
        else:
            skipped += 1
    return records, skipped


def _first_time(log: tuple[list[dict[str, Any]], int, Path]) -> tuple[float, str]:
    # logs in the order they were written: by their first record's time, then by name
    records, _, path = log
    first = records[0].get("time") if records else None
    return (float(first) if _is_number(first) else 0.0, path.name)


def _run_home(path: Path) -> Path:
    """The run's output_dir for ``path``: itself, or the parent of a log directory or file."""
    directory = path if path.is_dir() else path.parent
    for candidate in (directory, directory.parent):
        if (candidate / _CONFIG_FILE).is_file():
            return candidate
    return directory


def _report_dir(home: Path, log_dir: Path) -> Path:
    try:
        log_dir.resolve().relative_to(home.resolve())
    except ValueError:  # a log directory outside output_dir may hold other runs' logs too
        return home
    return log_dir


def _default_name(path: Path) -> str:
    return (path.resolve().name or str(path)) if path.is_dir() else path.stem


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _read_config(run_dir: Path) -> dict[str, Any]:
    path = run_dir / _CONFIG_FILE
    if not path.is_file():
        return {}
    import yaml  # a dependency of omegaconf; only needed here

    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return {}
    return config if isinstance(config, dict) else {}


def _log_dirs(path: Path, config: Mapping[str, Any]) -> list[Path]:
    """Where a run's JSON Lines log may be, most likely first."""
    loggers = config.get("metric_logger")
    loggers = loggers if isinstance(loggers, list) else [loggers]
    configured = [Path(lg["log_dir"]) for lg in loggers if isinstance(lg, dict) and isinstance(lg.get("log_dir"), str)]
    candidates = []
    output_dir = config.get("output_dir")
    for log_dir in configured:
        if isinstance(output_dir, str) and log_dir.is_relative_to(output_dir):
            # the run's directory may have moved since: look under the path given first
            candidates.append(path / log_dir.relative_to(output_dir))
        candidates.append(log_dir if log_dir.is_absolute() else path / log_dir)
    return list(dict.fromkeys([*candidates, path / "logs", path]))


def _run_names(paths: Sequence[Path]) -> list[str]:
    """The directory names, with their parents where two runs share a name."""
    names = [_default_name(p) if p.exists() else p.name for p in paths]
    for depth in (2, 3):
        if len(set(names)) == len(names):
            break
        names = ["/".join(p.resolve().parts[-depth:]) if names.count(n) > 1 else n for p, n in zip(paths, names)]
    return [n if names.count(n) == 1 else f"{n} #{i + 1}" for i, n in enumerate(names)]


# --------------------------------------------------------------------------------------------------- summary


def _number(value: float) -> str:
    if not math.isfinite(value):
        return str(value)
    if 1e4 <= abs(value) < 1e9:
        return f"{value:.0f}"  # tokens per second, token counts: whole numbers read best
    return f"{value:.4g}"


def _model_name(config: Mapping[str, Any]) -> str:
    model = config.get("model")
    component = model.get("_component_") if isinstance(model, dict) else None
    name = str(component).rsplit(".", 1)[-1] if component else "-"
    checkpointer = config.get("checkpointer")
    weights = checkpointer.get("checkpoint_dir") if isinstance(checkpointer, dict) else None
    return f"{name} ({Path(weights).name})" if isinstance(weights, str) and weights else name


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}h {minutes:02d}m {seconds:02d}s" if hours else f"{minutes}m {seconds:02d}s"


def _run_time(runs: list[dict[str, Any]], times: Mapping[int, float]) -> str:
    recorded = [r.get("wall_seconds") for r in runs]
    if recorded and all(_is_number(s) for s in recorded):
        return _duration(sum(recorded)) + (f" ({len(recorded)} invocations)" if len(recorded) > 1 else "")
    if len(times) > 1:  # the log alone: from the first logged step to the last (setup and step 1 not counted)
        return _duration(max(times.values()) - min(times.values())) + " (logged steps)"
    return "-"


def _peak_memory(metrics: Mapping[str, Mapping[int, float]]) -> str:
    for key in _PEAK_MEMORY_KEYS:
        values = [v for v in metrics.get(key, {}).values() if math.isfinite(v)]
        if values:
            return f"{max(values):.2f} GiB ({key.removeprefix('peak_memory_')})"
    return "-"


def _runs_table(runs: Sequence[RunLog]) -> str:
    rows = [run.summary() for run in runs]
    columns = ["run", *rows[0]]
    head = "".join(f"<th>{_esc(c)}</th>" for c in columns)
    body = []
    for index, (run, row) in enumerate(zip(runs, rows)):
        colour = _COLOURS[index % len(_COLOURS)]
        cells = [
            f'<td><span class="swatch" style="background:{colour}"></span>{_esc(run.name)}'
            f'<div class="path">{_esc(str(run.path))}</div></td>'
        ]
        cells += [f"<td>{_esc(value)}</td>" for value in row.values()]
        body.append(f'<tr data-run="{_esc(run.name)}">{"".join(cells)}</tr>')
    notes = [
        f"{run.name}: {run.skipped_lines} line(s) of its log are not JSON records and were skipped."
        for run in runs
        if run.skipped_lines
    ]
    note = "".join(f'<p class="note">{_esc(n)}</p>' for n in notes)
    return f'<table class="runs"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>{note}'


# ---------------------------------------------------------------------------------------------------- charts


def _chart_groups(runs: Sequence[RunLog]) -> list[list[str]]:
    """The metrics of each chart: every metric once, ``val_<name>`` with ``<name>`` when both are logged."""
    names = list(dict.fromkeys(name for run in runs for name in run.metrics))
    groups: dict[str, list[str]] = {}
    for name in names:
        base = name.removeprefix("val_")
        if name.startswith("val_") and base in names:
            groups.setdefault(base, [base]).append(name)
        else:
            groups.setdefault(name, [name])
    order = sorted(groups, key=lambda base: (base != "loss", names.index(base)))
    return [groups[base] for base in order]


def _nice_step(span: float, ticks: int) -> float:
    raw = span / max(ticks, 1)
    magnitude = 10 ** math.floor(math.log10(raw))
    return next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)


def _ticks(low: float, high: float, count: int, integer: bool = False) -> list[float]:
    step = _nice_step(high - low, count)
    if integer:
        step = max(1, round(step))
    first = math.ceil(low / step - 1e-9) * step
    ticks, value = [], first
    while value <= high + step * 1e-9:
        ticks.append(round(value, 12))
        value += step
    return ticks


def _downsample(points: list[tuple[int, float]]) -> list[tuple[int, float]]:
    if len(points) <= _MAX_DRAWN_POINTS:
        return points
    size = math.ceil(len(points) / (_MAX_DRAWN_POINTS // 2))
    drawn = []
    for start in range(0, len(points), size):
        bucket = points[start : start + size]
        low, high = min(bucket, key=lambda p: p[1]), max(bucket, key=lambda p: p[1])
        drawn += sorted({low, high})  # in step order, so a spike keeps its place
    return drawn


def _element_id(name: str, used: set[str]) -> str:
    base = "metric-" + (re.sub(r"[^A-Za-z0-9_-]+", "-", name).strip("-") or "x")
    candidate, index = base, 2
    while candidate in used:
        candidate, index = f"{base}-{index}", index + 1
    used.add(candidate)
    return candidate


def _chart(metrics: list[str], runs: Sequence[RunLog], used_ids: set[str]) -> str:
    width, height = 640, 260
    left, right, top, bottom = 68, 16, 12, 38
    plot_w, plot_h = width - left - right, height - top - bottom
    series = []  # (run index, run, metric, finite points, non-finite count)
    for index, run in enumerate(runs):
        for metric in metrics:
            values = run.metrics.get(metric)
            if values:
                points = sorted((s, v) for s, v in values.items() if math.isfinite(v))
                series.append((index, run, metric, points, len(values) - len(points)))
    finite = [p for *_, points, _ in series for p in points]
    steps = [s for s, _ in finite] or [0]
    ys = [v for _, v in finite] or [0.0]
    x_low, x_high = min(steps), max(steps)
    if x_low == x_high:
        x_low, x_high = x_low - 1, x_high + 1
    y_low, y_high = min(ys), max(ys)
    pad = (y_high - y_low) * 0.05 or (abs(y_high) * 0.1 or 1.0)
    y_low, y_high = y_low - pad, y_high + pad

    def x_at(step: float) -> float:
        return left + (step - x_low) / (x_high - x_low) * plot_w

    def y_at(value: float) -> float:
        return top + (y_high - value) / (y_high - y_low) * plot_h

    svg = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        f'role="img" aria-label="{_esc(", ".join(metrics))} by step">',
        f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" class="plot"/>',
    ]
    for tick in _ticks(y_low, y_high, 5):
        y = y_at(tick)
        svg.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
        svg.append(f'<text x="{left - 6}" y="{y + 4:.1f}" class="tick" text-anchor="end">{_number(tick)}</text>')
    for tick in _ticks(x_low, x_high, 6, integer=True):
        x = x_at(tick)
        svg.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{top + plot_h}" class="grid"/>')
        svg.append(f'<text x="{x:.1f}" y="{top + plot_h + 16}" class="tick" text-anchor="middle">{int(tick)}</text>')
    svg.append(f'<text x="{left + plot_w / 2:.1f}" y="{height - 4}" class="axis" text-anchor="middle">step</text>')
    legend, rows = [], []
    for index, run, metric, points, non_finite in series:
        colour = _COLOURS[index % len(_COLOURS)]
        dash = ' stroke-dasharray="6 4"' if metric.startswith("val_") and len(metrics) > 1 else ""
        drawn = _downsample(points)
        coords = " ".join(f"{x_at(s):.1f},{y_at(v):.1f}" for s, v in drawn)
        svg.append(
            f'<polyline class="series" data-run="{_esc(run.name)}" data-metric="{_esc(metric)}" '
            f'data-points="{len(points)}" points="{coords}" stroke="{colour}"{dash}/>'
        )
        if len(drawn) <= _MAX_MARKERS:
            for s, v in drawn:
                svg.append(
                    f'<circle cx="{x_at(s):.1f}" cy="{y_at(v):.1f}" r="2.6" fill="{colour}">'
                    f"<title>{_esc(run.name)} · {_esc(metric)} · step {s}: {_number(v)}</title></circle>"
                )
        label = f"{run.name} · {metric}" if len(runs) > 1 else metric
        sample = (
            f'<svg width="26" height="10"><line x1="1" x2="25" y1="5" y2="5" stroke="{colour}" stroke-width="2.5"'
            f"{dash}/></svg>"
        )
        legend.append(f"<li>{sample}{_esc(label)}</li>")
        rows.append(_value_row(run.name, metric, points, non_finite, colour))
    svg.append("</svg>")
    element_id = _element_id(metrics[0], used_ids)
    caption = ", ".join(metrics)
    table = (
        '<table class="values"><thead><tr><th>run</th><th>metric</th><th>points</th><th>last</th><th>min</th>'
        f"<th>max</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )
    return (
        f'<figure class="chart" id="{element_id}" data-metrics="{_esc(" ".join(metrics))}">'
        f"<figcaption>{_esc(caption)}</figcaption>{''.join(svg)}"
        f'<ul class="legend">{"".join(legend)}</ul>{table}</figure>'
    )


def _value_row(run: str, metric: str, points: list[tuple[int, float]], non_finite: int, colour: str) -> str:
    if points:
        last_step, last = points[-1]
        values = [v for _, v in points]
        cells = [f"{_number(last)} (step {last_step})", _number(min(values)), _number(max(values))]
    else:
        cells = ["-", "-", "-"]
    count = str(len(points)) + (f" (+{non_finite} nan/inf, not drawn)" if non_finite else "")
    swatch = f'<span class="swatch" style="background:{colour}"></span>'
    return (
        f"<tr><td>{swatch}{_esc(run)}</td><td>{_esc(metric)}</td><td>{_esc(count)}</td>"
        + "".join(f"<td>{_esc(c)}</td>" for c in cells)
        + "</tr>"
    )


def _esc(text: str) -> str:
    return html.escape(str(text), quote=True)


_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px;color:#222;background:#fff}
h1{font-size:1.3em;margin:0 0 4px}
.note{color:#666;font-size:.85em;margin:4px 0 12px}
table{border-collapse:collapse;font-size:.85em}
th,td{border-bottom:1px solid #e3e3e3;padding:4px 10px;text-align:left;vertical-align:top}
th{background:#f6f6f6}
.runs .path{color:#888;font-size:.85em}
.swatch{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:6px}
.charts{display:flex;flex-wrap:wrap;gap:20px;margin-top:20px}
.chart{margin:0;padding:10px;border:1px solid #e3e3e3;border-radius:6px}
figcaption{font-weight:600;margin-bottom:4px}
.plot{fill:#fff;stroke:#bbb}
.grid{stroke:#eee}
.tick{font-size:11px;fill:#555}
.axis{font-size:12px;fill:#333}
.series{fill:none;stroke-width:1.8;stroke-linejoin:round}
.legend{list-style:none;padding:0;margin:4px 0;font-size:.85em;display:flex;flex-wrap:wrap;gap:4px 14px}
.legend svg{vertical-align:middle;margin-right:4px}
.values{margin-top:6px}
"""
