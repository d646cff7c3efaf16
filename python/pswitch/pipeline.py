"""The main job's side: tell pswitchd when a pipeline stage sits idle, so fill work runs there.

    reporter = pswitch.BubbleReporter(client, gpu=stage, warmup_iterations=3)
    for step in range(steps):
        reporter.iteration_start()
        ...
        with reporter.idle(free_bytes):          # around every wait for a neighbour
            activation = recv(...)
        ...

During the warm-up iterations it only measures: each idle wait's offset from its iteration's
start and its length, by position (the k-th wait of the iteration). It then registers the
stage's bubble cycle, as fill/bubble_cycle.h's profiler builds it in C++ (pipetrain does the
same): positions seen in more than half the iterations, the median offset and length of each,
the smallest free memory, the median iteration as the period; anchored at an iteration's start.
From then on each idle() announces its bubble (expected: the measured length at that position)
and ends it when the wait returns.
"""
import contextlib
import statistics
import time
import warnings

# Bubbles shorter than this give fill work nothing to do (a step must fit, and pausing costs).
MIN_USEFUL_BUBBLE_S = 1e-3


class BubbleReporter:
    def __init__(self, client, gpu, warmup_iterations=3, clock=time.monotonic_ns):
        if warmup_iterations < 1:
            raise ValueError("warmup_iterations must be >= 1")
        self._client = client
        self._gpu = int(gpu)
        self._warmup = int(warmup_iterations)
        self._clock = clock
        self._iterations = []  # warm-up: [start_ns, [(position, begin_ns, end_ns, free)]]
        self._position = 0
        self.cycle = None  # the registered cycle (dict), once warm-up is over

    def iteration_start(self):
        """Marks the start of an iteration of the training loop."""
        now = self._clock()
        self._position = 0
        if self.cycle is None:
            self._iterations.append([now, []])
            # The warm-up is complete once `warmup` iterations have ended.
            if len(self._iterations) > self._warmup:
                self._register(now)

    @contextlib.contextmanager
    def idle(self, free_bytes):
        """Wraps one idle wait of the stage, which leaves `free_bytes` of device memory to fill
        work meanwhile (on a GPU, what torch.cuda.mem_get_info reports free)."""
        if not self._iterations and self.cycle is None:
            raise RuntimeError("call iteration_start() before idle()")
        position = self._position
        self._position += 1
        begin = self._clock()
        announced = False
        if self.cycle is not None:
            expected = self._expected.get(position)
            if expected is not None:
                self._client.bubble_begin(self._gpu, expected, free_bytes, began_ns=begin)
                announced = True
        try:
            yield
        finally:
            end = self._clock()
            if announced:
                self._client.bubble_end(self._gpu)
            elif self.cycle is None:
                self._iterations[-1][1].append((position, begin, end, int(free_bytes)))

    def _register(self, now):
        complete = self._iterations[:-1]
        periods = [b[0] - a[0] for a, b in zip(self._iterations, self._iterations[1:])]
        by_position = {}
        for start, bubbles in complete:
            for position, begin, end, free in bubbles:
                by_position.setdefault(position, []).append((begin - start, end - begin, free))
        bubbles = []
        self._expected = {}
        for position in sorted(by_position):
            seen = by_position[position]
            if len(seen) * 2 <= len(complete):
                continue  # a wait that comes and goes
            offset = int(statistics.median_low([s[0] for s in seen]))
            duration = int(statistics.median_low([s[1] for s in seen]))
            if duration <= 0:
                continue
            bubbles.append({"offset_ns": offset, "duration_ns": duration,
                            "free_bytes": min(s[2] for s in seen), "position": position})
        bubbles.sort(key=lambda b: b["offset_ns"])
        # Bubbles must not overlap: a later one starts after the earlier one ends.
        kept = []
        for b in bubbles:
            if kept and b["offset_ns"] < kept[-1]["offset_ns"] + kept[-1]["duration_ns"]:
                continue
            kept.append(b)
        period = int(statistics.median_low(periods))
        kept = [b for b in kept if b["offset_ns"] + b["duration_ns"] <= period]
        useful = [b for b in kept if b["duration_ns"] >= MIN_USEFUL_BUBBLE_S * 1e9]
        if not useful:
            warnings.warn(f"stage {self._gpu}: no idle wait of {MIN_USEFUL_BUBBLE_S * 1e3:.0f} "
                          "ms or more in the warm-up iterations; fill work will not run here",
                          RuntimeWarning, stacklevel=3)
        for b in kept:
            self._expected[b["position"]] = b["duration_ns"] / 1e9
        self.cycle = {"period_ns": period,
                      "bubbles": [{k: b[k] for k in ("offset_ns", "duration_ns", "free_bytes")}
                                  for b in kept]}
        self._client.register_bubble_cycle(self._gpu, self.cycle, origin_ns=now)
        self._iterations = []
