"""pswitch.BubbleReporter (main-job helper) and the torch.distributed example with fill work."""
import json
import os
import subprocess
import sys
import warnings

import pytest

import pswitch
from conftest import BIN, Daemon, ROOT


class FakeClient:
    def __init__(self):
        self.calls = []

    def register_bubble_cycle(self, gpu, cycle, origin_ns=0):
        self.calls.append(("cycle", gpu, cycle, origin_ns))

    def bubble_begin(self, gpu, expected, free_bytes=0, began_ns=0):
        self.calls.append(("begin", gpu, expected, free_bytes, began_ns))

    def bubble_end(self, gpu):
        self.calls.append(("end", gpu))


class FakeClock:
    def __init__(self):
        self.now = 1_000_000_000

    def __call__(self):
        return self.now

    def advance(self, ms):
        self.now += int(ms * 1e6)


MS = 1_000_000


def iteration(reporter, clock, waits, extra_wait=None):
    """One iteration: 10 ms compute, then each wait (ms) followed by 5 ms compute."""
    reporter.iteration_start()
    clock.advance(10)
    for k, w in enumerate(waits):
        with reporter.idle(free_bytes=(1 << 30) - k):
            clock.advance(w)
        clock.advance(5)
        if extra_wait is not None and k == 0:
            with reporter.idle(free_bytes=1 << 30):
                clock.advance(extra_wait)


def test_warmup_measures_the_cycle_then_announces_each_bubble():
    client, clock = FakeClient(), FakeClock()
    reporter = pswitch.BubbleReporter(client, gpu=3, warmup_iterations=3, clock=clock)
    for waits in ([8, 4], [9, 4], [7, 30]):  # one disturbed wait: the median ignores it
        iteration(reporter, clock, waits)
    assert client.calls == []  # warm-up only measures
    origin = clock.now
    iteration(reporter, clock, [8, 4])  # its start completes the warm-up
    kind, gpu, cycle, origin_ns = client.calls[0]
    assert (kind, gpu, origin_ns) == ("cycle", 3, origin)
    assert cycle["period_ns"] == 33 * MS  # the median of 32, 33 and 57 ms
    assert cycle["bubbles"] == [
        {"offset_ns": 10 * MS, "duration_ns": 8 * MS, "free_bytes": (1 << 30)},
        {"offset_ns": 23 * MS, "duration_ns": 4 * MS, "free_bytes": (1 << 30) - 1},
    ]
    begins = [c for c in client.calls if c[0] == "begin"]
    ends = [c for c in client.calls if c[0] == "end"]
    assert [b[2] for b in begins] == [0.008, 0.004] and len(ends) == 2
    assert begins[0][4] == origin + 10 * MS  # began_ns: when the wait began


def test_waits_that_come_and_go_are_not_part_of_the_cycle():
    client, clock = FakeClient(), FakeClock()
    reporter = pswitch.BubbleReporter(client, gpu=0, warmup_iterations=3, clock=clock)
    iteration(reporter, clock, [8], extra_wait=2)  # an extra wait in one iteration of three
    iteration(reporter, clock, [8])
    iteration(reporter, clock, [8])
    reporter.iteration_start()
    cycle = client.calls[0][2]
    assert [b["duration_ns"] for b in cycle["bubbles"]] == [8 * MS]


def test_bubbles_too_short_to_use_are_reported_not_hidden():
    client, clock = FakeClient(), FakeClock()
    reporter = pswitch.BubbleReporter(client, gpu=0, warmup_iterations=1, clock=clock)
    reporter.iteration_start()
    with reporter.idle(0):
        clock.advance(0.1)
    with pytest.warns(RuntimeWarning, match="no idle wait"):
        reporter.iteration_start()
    with pytest.raises(ValueError):
        pswitch.BubbleReporter(client, gpu=0, warmup_iterations=0)


def test_the_gloo_example_fills_its_bubbles(tmp_path):
    pytest.importorskip("torch")
    d = Daemon("--preload=", "--gpus=2", "--fill-grace-ms=30")
    try:
        report = tmp_path / "report.json"
        env = dict(os.environ)
        run = subprocess.run(
            [sys.executable, os.path.join(ROOT, "python", "examples", "gloo_pipeline.py"),
             "--server", d.address, "--iterations", "12", "--report", str(report)],
            env=env, capture_output=True, text=True, timeout=240)
        assert run.returncode == 0, run.stdout + run.stderr
        result = json.loads(report.read_text())
        assert result["cycle"]["bubbles"], result  # the warm-up measured real waits
        assert result["job"] is not None
        assert result["steps_done"] > 0 and result["bubbles"] > 0, result
        assert result["fill_step_time_s"] <= result["bubble_time_s"]  # only inside bubbles
    finally:
        d.stop()
