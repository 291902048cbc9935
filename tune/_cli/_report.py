"""``tune report OUTPUT_DIR [OUTPUT_DIR ...] [--out FILE]``: an HTML report of runs' metrics, read from their logs."""

import argparse

from tune._cli._common import HelpFormatter, examples

_DESCRIPTION = """\
Write one self-contained HTML page (charts drawn as inline SVG: no JavaScript, nothing fetched) of what runs
logged: a table of the runs (recipe, config, model, steps, final loss, best validation loss, run time, peak
memory) and a chart per logged metric against the step, with val_<name> drawn with <name>. Several
OUTPUT_DIRs overlay one line per run.

  OUTPUT_DIR  a run's output_dir: its JSON Lines log is found through the saved config.yaml
              (metric_logger.log_dir, ${output_dir}/logs in the shipped configs); a log directory or a
              .jsonl file works too. The log is written by tune.training.metric_logging.DiskLogger.

`tune run` writes the report beside the log itself when a run ends (OUTPUT_DIR/logs/report.html with the
shipped configs); this command rebuilds it (of a run still training, say) or compares runs."""


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "report",
        help="write an HTML report (charts of every logged metric) of one run or several",
        description=_DESCRIPTION,
        formatter_class=HelpFormatter,
        epilog=examples(
            "tune report /tmp/llama3_2_1B/lora_single_device",
            "tune report runs/lr_1e-4 runs/lr_3e-4 --out lr_sweep.html",
        ),
    )
    parser.add_argument(
        "output_dirs", nargs="+", metavar="OUTPUT_DIR", help="a run's output_dir (or log directory), e.g. /tmp/my_run"
    )
    parser.add_argument(
        "--out",
        metavar="FILE",
        default=None,
        help="the HTML file to write (default: report.html beside the log for one run, ./report.html for several), "
        "e.g. --out compare.html",
    )
    parser.add_argument(
        "--title", default=None, help="the page's title (default: names the runs), e.g. --title 'lr sweep'"
    )


def run(args: argparse.Namespace) -> int:
    from tune.training import read_run_logs, write_report  # imports torch: only when a report is asked for

    runs = read_run_logs(args.output_dirs)
    out = write_report(runs, out=args.out, title=args.title)
    metrics = list(dict.fromkeys(name for r in runs for name in r.metrics))
    shown = ", ".join(metrics[:8]) + (f" and {len(metrics) - 8} more" if len(metrics) > 8 else "")
    print(f"Wrote {out}: {len(runs)} run{'s' if len(runs) > 1 else ''}, {len(metrics)} metrics ({shown}).")
    return 0
