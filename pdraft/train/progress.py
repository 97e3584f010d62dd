"""The training progress bar `pdraft train` and the quickstart share: loss, the acceptance the losses imply
and the accepted length it predicts for sampled and for greedy decoding (and, for DFlash2, the selector's
candidate recall and teacher-forced accuracy against the unary top-1)."""

from __future__ import annotations

from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


@contextmanager
def train_bar(console: Console, kind: str, total: int):
    """Yield a `progress(step, total, stats)` callback for pdraft.train.loop.train."""
    columns = [TextColumn(f"train {kind}", style="bold", markup=False), BarColumn(), MofNCompleteColumn(),
               TextColumn("loss {task.fields[loss]}  accept {task.fields[accept]}  "
                          "tau~ {task.fields[tau]} (greedy {task.fields[greedy]}){task.fields[selector]}", markup=False),
               TimeElapsedColumn(), TimeRemainingColumn()]
    with Progress(*columns, console=console) as bar:
        task = bar.add_task(kind, total=total, loss="-", accept="-", tau="-", greedy="-", selector="")

        def progress(step, _total, stats):
            greedy = stats.get("greedy_tau_est")
            bar.update(task, completed=step, loss=f"{stats['loss']:.3f}", accept=f"{stats['accept']:.3f}",
                       tau=f"{stats['tau_est']:.2f}", greedy="-" if greedy is None else f"{greedy:.2f}",
                       selector=selector_text(stats))

        yield progress


def selector_text(stats: dict) -> str:
    """DFlash2's selector figures ('' for the other kinds): recall of the gold in the top-K, then the selector's
    and the unary top-1's teacher-forced accuracy."""
    if "selector_accuracy" not in stats:
        return ""
    return (f"  recall@K {stats['candidate_recall']:.2f}  selector acc {stats['selector_accuracy']:.2f} "
            f"(unary {stats['unary_accuracy']:.2f}, lift {stats['selector_lift']:+.2f})")


def validation_line(kind: str, val: dict) -> str:
    greedy = val.get("greedy_tau_est")
    per_pos = " ".join(f"{a:.2f}" for a in val.get("accept_per_position", [])[:16])
    return (f"{kind} validation: accept (1 - TV) {val['accept']:.3f}, tau estimate {val['tau_est']:.2f} sampled"
            + ("" if greedy is None else f", {greedy:.2f} greedy") + f"; 1 - TV per position: {per_pos}"
            + selector_text(val).replace("  ", "; ", 1))
