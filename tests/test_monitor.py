"""`pdraft monitor` and the metrics stream: a recorded stream rendered once shows the window's values with the
health colours and hints (checked in the text and in the ANSI styles); --json gives the same figures as
metrics.summarize; the follower picks up appended lines, waits for a partial line, survives a file that does
not exist yet, truncation and rotation; the window keeps only the current run (and the last N rounds or
seconds); the Prometheus endpoint serves vLLM-style spec_decode names with the right counts."""

import io
import json
import os
import urllib.request

import pytest
from rich.console import Console

from pdraft.metrics import RoundRecord, summarize
from pdraft.bench.monitor import PrometheusExporter, Window, judge, render, snapshot
from pdraft.bench.stream import MetricsStream, StreamFollower
from pdraft.cli.monitor import monitor, parse_window
from pdraft.errors import PdraftError
from reliability_support import invoke_command

# 10 rounds at gamma 4: two whole blocks accepted, eight rejected at position 1.
BAD = [4, 4, 0, 0, 0, 0, 0, 0, 0, 0]
# 10 rounds at gamma 4: token acceptance 28/40 = 70%, block acceptance 5/10 = 50%.
GOOD = [4, 4, 4, 4, 4, 1, 2, 2, 3, 0]


def records(accepted, gamma=4, verified=None, start_round=0):
    verified = verified or [gamma] * len(accepted)
    return [RoundRecord(0, start_round + i, gamma, v, a, a + 1, 0.001, 0.002, 0.004)
            for i, (a, v) in enumerate(zip(accepted, verified))]


def write_stream(path, runs):
    with MetricsStream(path) as stream:
        for header, recs in runs:
            stream.begin_run(**header)
            for r in recs:
                stream.write_round(r)
    return path


def invoke(args):
    return invoke_command("monitor", monitor, args)


def test_once_renders_values_colours_and_hints(tmp_path):
    path = write_stream(tmp_path / "m.jsonl", [({"drafter": "dflash-x (dflash)", "gamma": 4, "domain": "code"},
                                                records(BAD))])
    code, out, _ = invoke([str(path), "--once"])
    assert code == 0
    assert "dflash-x (dflash), γ=4" in out and "domain code" in out
    assert "20.0%" in out  # token and block acceptance: 8/40 and 2/10
    assert "red" in out and "position 1 already fails" in out and "another domain" in out
    assert "full verification" in out  # every draft verified
    assert "1.80" in out  # tau = mean(a + 1) = 18 / 10

    console = Console(file=io.StringIO(), force_terminal=True, color_system="standard", width=200)
    window = Window()
    window.feed(StreamFollower(path).poll())
    console.print(render(window, str(path)))
    ansi = console.file.getvalue()
    assert "\x1b[1;31m20.0%" in ansi  # red, bold: far below the healthy range

    good = write_stream(tmp_path / "g.jsonl", [({"drafter": "d", "gamma": 4}, records(GOOD))])
    window = Window()
    window.feed(StreamFollower(good).poll())
    console = Console(file=io.StringIO(), force_terminal=True, color_system="standard", width=200)
    console.print(render(window))
    ansi = console.file.getvalue()
    assert "\x1b[32m70.0%" in ansi and "\x1b[32m50.0%" in ansi  # green inside 60-80% and 40-60%


def test_json_matches_summarize(tmp_path):
    recs = records(GOOD, verified=[4, 4, 4, 4, 4, 2, 3, 3, 4, 1])
    path = write_stream(tmp_path / "m.jsonl", [({"drafter": "d", "gamma": 4}, recs)])
    code, out, _ = invoke([str(path), "--once", "--json"])
    assert code == 0
    snap = json.loads(out)
    assert snap["summary"] == json.loads(json.dumps(summarize(recs).to_dict()))
    assert snap["health"]["verification_utilization"]["value"] == pytest.approx(33 / 40)
    assert snap["health"]["verification_utilization"]["status"] == "ok"
    assert snap["health"]["token_acceptance"]["status"] == "yellow"  # 28/33 = 85%, above the range
    assert snap["health"]["block_acceptance"]["status"] == "ok"


def test_health_judgement_and_hints():
    assert judge("token_acceptance", 0.55)[0] == "yellow" and judge("token_acceptance", 0.3)[0] == "red"
    status, hint = judge("verification_utilization", 0.5)
    assert status == "red" and "prunes too hard" in hint
    assert judge("verification_utilization", 0.65)[0] == "yellow"
    # without a scheduler only the token budget trims a block: not the scheduler's fault
    assert judge("verification_utilization", 0.5, verify="full")[0] == "ok"
    assert judge("verification_utilization", 0.5, verify="scheduler")[0] == "red"
    assert judge("block_acceptance", 0.2) == ("red", judge("block_acceptance", 0.2)[1])
    assert "gamma too large" in judge("block_acceptance", 0.2)[1]
    assert judge("token_acceptance", None) == ("n/a", "")
    # acceptance fine at position 1 and decaying afterwards: the cause is the block length
    decaying = summarize(records([1, 1, 1, 2, 1, 1, 1, 0, 1, 2], gamma=8))
    status, hint = judge("token_acceptance", decaying.token_acceptance, decaying)
    assert status == "red" and "gamma too large" in hint


def test_window_keeps_the_current_run_and_its_last_rounds():
    window = Window(size=5)
    rows = [{"type": "run", "drafter": "a", "gamma": 4}]
    rows += [{"type": "round", **r.to_dict()} for r in records(GOOD)]
    window.feed(rows)
    assert [r.accepted for r in window.records()] == GOOD[-5:]
    window.feed([{"type": "run", "drafter": "b", "gamma": 2}] +
                [{"type": "round", **r.to_dict()} for r in records([2, 1], gamma=2)])
    assert window.header["drafter"] == "b" and len(window.records()) == 2
    assert [h["drafter"] for h, _ in window.recent] == ["a"]
    timed = Window(size=100, seconds=10)
    timed.feed([{"type": "run", "drafter": "a", "gamma": 4}] +
               [{"type": "round", "t": 100.0 + 4 * i, **r.to_dict()} for i, r in enumerate(records(GOOD))])
    assert len(timed.records()) == 3  # t = 128, 132, 136: within 10 s of the newest


def test_follower_tails_appends_partial_lines_truncation_and_rotation(tmp_path):
    path = tmp_path / "later" / "m.jsonl"
    follower, window = StreamFollower(path), Window()
    assert follower.poll() == []  # not there yet
    stream = MetricsStream(path)
    stream.begin_run(drafter="d", gamma=4)
    for r in records(GOOD[:3]):
        stream.write_round(r)
    window.feed(follower.poll())
    assert len(window.records()) == 3
    with open(path, "a") as f:  # a writer caught mid-line
        line = json.dumps({"type": "round", **records([1])[0].to_dict()})
        f.write(line[:10])
    window.feed(follower.poll())
    assert len(window.records()) == 3
    with open(path, "a") as f:
        f.write(line[10:] + "\n")
    window.feed(follower.poll())
    assert [r.accepted for r in window.records()] == GOOD[:3] + [1]
    for r in records([2, 2]):  # the writer appends more: picked up
        stream.write_round(r)
    window.feed(follower.poll())
    assert len(window.records()) == 6
    stream.close()

    write_stream(path.with_suffix(".tmp"), [({"drafter": "rotated", "gamma": 2}, records([1], gamma=2))])
    os.replace(path.with_suffix(".tmp"), path)  # rotation: a new file under the same name
    rows = follower.poll()
    assert follower.reset
    window.reset()
    window.feed(rows)
    assert window.header["drafter"] == "rotated" and len(window.records()) == 1

    path.write_text("")  # truncation
    assert follower.poll() == [] and follower.reset
    write_stream(path, [({"drafter": "again", "gamma": 4}, records([3]))])
    assert [row["type"] for row in follower.poll()] == ["run", "round"]
    with open(path, "a") as f:
        f.write("not json\n")
    assert follower.poll() == [] and follower.bad_lines == 1


def test_stream_keeps_rounds_unique_across_batches(tmp_path):
    path = tmp_path / "m.jsonl"
    with MetricsStream(path) as stream:
        with pytest.raises(ValueError, match="before begin_run"):
            stream.write_round(records([1])[0])
        stream.begin_run(drafter="d", gamma=4)
        for r in records([1, 2]):
            stream.write_round(r)
        stream.next_batch()
        for r in records([3]):
            stream.write_round(r)
    rows = [json.loads(line) for line in path.read_text().splitlines()][1:]
    assert [(r["round"], r["request"]) for r in rows] == [(0, 0), (1, 0), (2, 1)]


def test_prometheus_names_and_counts(tmp_path):
    exporter = PrometheusExporter(0, "127.0.0.1")
    try:
        window = Window()
        rows = [{"type": "run", "drafter": "dspark-x (dspark)", "gamma": 4}]
        rows += [{"type": "round", **r.to_dict()} for r in records(BAD)]
        exporter.observe(window.feed(rows))
        exporter.update(window)
        with urllib.request.urlopen(f"http://127.0.0.1:{exporter.port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    finally:
        exporter.close()
    label = 'drafter="dspark-x (dspark)"'
    expected = {
        f"pdraft:spec_decode_num_drafts_total{{{label}}}": 10.0,
        f"pdraft:spec_decode_num_draft_tokens_total{{{label}}}": 40.0,
        f"pdraft:spec_decode_num_verified_tokens_total{{{label}}}": 40.0,
        f"pdraft:spec_decode_num_accepted_tokens_total{{{label}}}": 8.0,
        f'pdraft:spec_decode_num_accepted_tokens_per_pos_total{{{label},position="0"}}': 2.0,
        f'pdraft:spec_decode_num_accepted_tokens_per_pos_total{{{label},position="3"}}': 2.0,
        f"pdraft:generation_tokens_total{{{label}}}": 18.0,
        f"pdraft:spec_decode_window_token_acceptance_rate{{{label}}}": 0.2,
        f"pdraft:spec_decode_window_mean_acceptance_length{{{label}}}": 1.8,
    }
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    for name, value in expected.items():
        assert values.get(name) == pytest.approx(value), name


def test_window_option_and_missing_file(tmp_path):
    assert parse_window("200") == (200, None) and parse_window("30s") == (30, 30.0)
    for bad in ("0", "-3", "abc", "2.5"):
        with pytest.raises(PdraftError, match="--window"):
            parse_window(bad)
    code, _, msg = invoke([str(tmp_path / "none.jsonl"), "--once"])
    assert code == 2 and "not found" in msg
    assert snapshot(Window())["health"]["token_acceptance"]["status"] == "n/a"
