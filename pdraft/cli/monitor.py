"""`pdraft monitor PATH`: a live view of a metrics stream written by decode or bench (`--metrics PATH`),
followed like `tail -f`, with every metric judged against the healthy ranges; `--once` renders one frame and
exits, `--json` prints the window's summary, `--prometheus-port` also serves the metrics to Prometheus."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from pdraft.cli.common import JsonOpt, out, print_json
from pdraft.errors import PdraftError


MAX_WINDOW = 10_000_000  # rounds or seconds; a window is held in memory


def parse_window(text: str) -> tuple[int, float | None]:
    """'200' -> the last 200 request-rounds; '30s' -> the last 30 seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(s?)\s*", text or "")
    if not m or float(m.group(1)) <= 0 or (not m.group(2) and "." in m.group(1)):
        raise PdraftError(f"--window {text!r}: give a number of rounds (200) or of seconds (30s)")
    if float(m.group(1)) > MAX_WINDOW:
        raise PdraftError(f"--window {text!r}: at most {MAX_WINDOW} rounds or seconds")
    return (int(float(m.group(1))), float(m.group(1))) if m.group(2) else (int(m.group(1)), None)


def monitor(
    path: Annotated[Path, typer.Argument(help="Metrics stream (JSONL) written with --metrics by decode or bench.")],
    window: Annotated[str, typer.Option("--window", help="Sliding window: N request-rounds (200) or seconds (30s).")] = "200",
    prometheus_port: Annotated[int | None, typer.Option("--prometheus-port", help="Also serve Prometheus metrics (pdraft:spec_decode_*) on this port.")] = None,
    prometheus_addr: Annotated[str, typer.Option("--prometheus-addr", help="Address the Prometheus endpoint binds to.")] = "127.0.0.1",
    once: Annotated[bool, typer.Option("--once", help="Render one frame from what the stream holds now and exit.")] = False,
    refresh: Annotated[float, typer.Option("--refresh", help="Seconds between refreshes.")] = 1.0,
    json_out: JsonOpt = False,
) -> None:
    """Watch acceptance, tau, verification utilisation and TPOT live, against the healthy ranges.

    Example: pdraft monitor runs/metrics.jsonl --window 500 --prometheus-port 9400
    """
    from rich.live import Live

    from pdraft.bench.monitor import PrometheusExporter, Window, render, snapshot
    from pdraft.bench.stream import StreamFollower

    size, seconds = parse_window(window)
    if not 0 < refresh <= 3600:  # also refuses nan and inf, which time.sleep would choke on
        raise PdraftError(f"--refresh must be > 0 and at most 3600 seconds, got {refresh}")
    if once and not path.exists():
        raise PdraftError(f"metrics stream {str(path)!r} not found", hint="write one with --metrics PATH")
    if path.is_dir():
        raise PdraftError(f"metrics stream {str(path)!r} is a folder", hint="give the JSONL file written with --metrics")
    # --once reads what the stream holds now, so it returns even while a writer keeps appending.
    follower = StreamFollower(path, until=path.stat().st_size if once else None)
    win = Window(size, seconds)
    exporter = None
    if prometheus_port is not None:
        if not 0 <= prometheus_port <= 65535:
            raise PdraftError(f"--prometheus-port must be in 0..65535, got {prometheus_port}")
        try:
            exporter = PrometheusExporter(prometheus_port, prometheus_addr)
        except OSError as e:  # port in use, address not on this machine
            raise PdraftError(f"cannot serve Prometheus metrics on {prometheus_addr}:{prometheus_port} "
                              f"({e.strerror or e})") from None

    def step() -> None:
        while True:  # slice by slice: the window holds what is needed, never the whole file
            rows = follower.poll()
            if follower.reset:
                win.reset()
            fed = win.feed(rows)
            if exporter is not None:
                exporter.observe(fed)
            if not follower.more:
                break
        if exporter is not None:
            exporter.update(win)

    try:
        step()
        if once and follower.bad_lines and not follower.good_rounds:
            raise PdraftError(f"{path}: no readable round in the metrics stream, {follower.bad_lines} malformed "
                              f"line(s) (last: {follower.last_problem})",
                              hint="give the JSONL file written with --metrics by decode or bench")
        if once:
            if json_out:
                print_json(snapshot(win, str(path)))
            else:
                out.print(render(win, str(path)))
            return
        if json_out:  # one compact summary line per refresh, for scripts
            while True:
                sys.stdout.write(json.dumps(snapshot(win, str(path))) + "\n")
                sys.stdout.flush()
                time.sleep(refresh)
                step()
        with Live(render(win, str(path)), console=out, refresh_per_second=max(1.0, 1.0 / refresh)) as live:
            while True:
                time.sleep(refresh)
                step()
                live.update(render(win, str(path)))
    except KeyboardInterrupt:
        pass
    finally:
        if exporter is not None:
            exporter.close()
