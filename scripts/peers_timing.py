"""peers.py's timing loop: src/timing.cpp's time_gpu for a Python callable, through the same stream
hold and L2 flush (libflashattn_capi), so a PyTorch call is timed exactly as our kernels are.

Warm-up: `warmup` calls (each after a flush when cold), then a synchronize. Timed loop, in
batches: the stream is held, then every repetition of the batch is enqueued (flush when cold,
outside the events; start event; the call; end event), then the hold is released. The GPU runs
the whole batch only once the host has enqueued all of it, so host time (Python, PyTorch's
dispatch) cannot fall between a repetition's events, however fast the GPU drains the stream. A
hold that ended by its timeout (the host took HOLD_TIMEOUT_S to enqueue, or the call waited for
the GPU) may have let host time in: that batch is discarded and rerun with at most half as many
repetitions; after MAX_RERUNS the loop stops ("hold_timeout").

Batch size: 1 first, then about BATCH_MS of GPU time (at most MAX_BATCH), never past MAX_SAMPLES
and, while fewer than min_samples were taken, landing on min_samples exactly. Stopping rule: at
least min_samples, then until the relative stddev is at most max_noise (a fraction; <= 0: no rule)
or max_time seconds of wall time were spent in the timed loop.
"""

import math
import time

MAX_BATCH, BATCH_MS, MAX_SAMPLES = 32, 2.0, 10000
HOLD_TIMEOUT_S, MAX_RERUNS = 2.0, 8


class HoldTimedOut(RuntimeError):
    """Every batch's hold timed out: the call cannot be timed behind a hold (it waits for the GPU)."""


class Running:
    """Running mean and squared deviations (Welford), as time_gpu keeps them."""

    def __init__(self):
        self.n, self.mean, self.m2 = 0, 0.0, 0.0

    def add(self, x):
        self.n += 1
        d = x - self.mean
        self.mean += d / self.n
        self.m2 += d * (x - self.mean)

    def rel_stddev(self):
        if self.n < 2 or self.mean <= 0:
            return math.inf
        return math.sqrt(self.m2 / (self.n - 1)) / self.mean


def rel_stddev(samples):
    r = Running()
    for x in samples:
        r.add(x)
    return r.rel_stddev()


class Timer:
    """Times fn() on torch's current stream; returns the "timing" object of flashattn's JSON."""

    def __init__(self, torch, capi, warmup, min_samples, flush, max_noise=0.005, max_time=1.0):
        self.torch, self.warmup, self.min_samples = torch, warmup, min_samples
        self.max_noise, self.max_time = max_noise, max_time
        self.hold = capi.hold()
        self.flusher = capi.flush(0) if flush else None
        self.events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                       for _ in range(MAX_BATCH)]
        self.clock_note = ""
        try:  # torch reads the SM clock through pynvml when it is installed
            torch.cuda.clock_rate()
        except Exception as e:  # noqa: BLE001 (any failure means: no clock readings)
            self.clock_note = f"SM clock not sampled: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"

    def close(self):
        self.hold.close()
        if self.flusher is not None:
            self.flusher.close()

    def stop_reason(self, n, noise, wall):
        if n >= MAX_SAMPLES:
            return "max_samples"
        if n < self.min_samples:
            return ""
        if self.max_noise <= 0:
            return "min_samples"
        if n >= 2 and noise <= self.max_noise:
            return "noise"
        if wall >= self.max_time:
            return "max_time"
        return ""

    def batch_size(self, n, batch, max_batch):
        b = min(batch, max_batch, MAX_SAMPLES - n)
        if n < self.min_samples:
            b = min(b, self.min_samples - n)  # an exact min_samples when the rule is off
        return max(b, 1)

    def run_batch(self, fn, stream, b, clocks):
        """Enqueues b repetitions behind the hold and waits for them; True if the hold timed out."""
        before = self.hold.timeouts()
        self.hold.enqueue(stream, HOLD_TIMEOUT_S)
        try:
            for start, end in self.events[:b]:
                if self.flusher is not None:
                    self.flusher.enqueue(stream)  # outside the events
                start.record()
                fn()
                end.record()
        finally:
            self.hold.release()  # whatever happens, the stream must not stay held
        if not self.clock_note:
            clocks.append(self.torch.cuda.clock_rate())  # while the batch runs
        self.events[b - 1][1].synchronize()
        return self.hold.timeouts() > before

    def __call__(self, fn):
        cuda = self.torch.cuda
        stream = cuda.current_stream().cuda_stream
        for _ in range(self.warmup):
            if self.flusher is not None:
                self.flusher.enqueue(stream)
            fn()
        cuda.synchronize()
        timeouts0 = self.hold.timeouts()
        samples, clocks, run = [], [], Running()
        reason, batch, max_batch, reruns = "", 1, MAX_BATCH, 0
        t0 = time.monotonic()
        wall = 0.0
        while not reason:
            b = self.batch_size(len(samples), batch, max_batch)
            timed_out = self.run_batch(fn, stream, b, clocks)
            wall = time.monotonic() - t0
            if timed_out:  # the batch may hold host time: discard it, rerun smaller
                reruns += 1
                max_batch = max(1, max_batch // 2)
                if reruns >= MAX_RERUNS:
                    reason = "hold_timeout"
                continue
            for start, end in self.events[:b]:
                ms = start.elapsed_time(end)
                samples.append(ms)
                run.add(ms)
            reason = self.stop_reason(len(samples), run.rel_stddev(), wall)
            batch = max(1, min(MAX_BATCH, int(BATCH_MS / max(run.mean, 1e-3))))
        if not samples:
            raise HoldTimedOut(f"every batch's stream hold timed out ({reruns} batches): the call waits for the GPU "
                               f"or takes the host over {HOLD_TIMEOUT_S} s to enqueue")
        return self.summary(samples, clocks, reason, wall, self.hold.timeouts() - timeouts0, reruns)

    def summary(self, samples, clocks, reason, wall, timeouts, reruns):
        s = sorted(samples)
        n = len(s)
        noise = rel_stddev(samples) if n > 1 else 0.0
        rule = None if self.max_noise <= 0 else bool(n >= 2 and noise <= self.max_noise)
        clocks = [c for c in clocks if c and c > 0]
        cold = self.flusher is not None
        return {"unit": "ms", "clock": "cuda_events", "method": "held_stream",
                "mode": "cold" if cold else "hot", "l2_flush": cold,
                "flush_method": "write_then_read" if cold else None,
                "warmup": self.warmup, "repeat": n, "min_samples": self.min_samples,
                "median_ms": s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2]),
                "min_ms": s[0], "max_ms": s[-1], "mean_ms": sum(s) / n, "rel_stddev": noise, "noise": noise,
                "max_noise": self.max_noise if self.max_noise > 0 else None,
                "max_time_s": self.max_time if self.max_noise > 0 else None,
                "noise_rule_met": rule, "stop_reason": reason, "wall_s": wall,
                "hold_timeouts": int(timeouts), "batches_rerun": reruns, "samples_ms": samples,
                "sm_clock_start_mhz": clocks[0] if clocks else None, "sm_clock_end_mhz": clocks[-1] if clocks else None,
                "sm_clock_samples": len(clocks), "sm_clock_min_mhz": min(clocks) if clocks else None,
                "sm_clock_max_mhz": max(clocks) if clocks else None,
                "sm_clock_mean_mhz": sum(clocks) / len(clocks) if clocks else None,
                "throttled": (min(clocks) < 0.9 * clocks[0]) if clocks else None, "throttle_reasons": []}


def timing_notes(timing, clock_note, prefix=""):
    """The run's notes about its timing: noise rule not met, batches rerun, throttling."""
    notes = []
    if timing["noise_rule_met"] is False:
        notes.append(f"noise {100 * timing['noise']:.2f}% above --max-noise {100 * timing['max_noise']:.2f}% "
                     f"after {timing['repeat']} samples (stopped at {timing['stop_reason']})")
    if timing["batches_rerun"]:
        notes.append(f"{timing['batches_rerun']} batch(es) discarded and rerun: the stream hold timed out "
                     f"({timing['hold_timeouts']} timeout(s))" +
                     (f"; stopped after {MAX_RERUNS} reruns with {timing['repeat']} samples"
                      if timing["stop_reason"] == "hold_timeout" else ""))
    if clock_note:
        notes.append(clock_note)
    elif timing["throttled"]:
        notes.append(f"throttled: SM clock {timing['sm_clock_start_mhz']} MHz at start, "
                     f"{timing['sm_clock_min_mhz']}..{timing['sm_clock_max_mhz']} MHz during timing")
    return [prefix + n for n in notes]
