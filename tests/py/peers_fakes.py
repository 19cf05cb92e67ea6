"""Stand-ins for peers.py's tests: a simulated CUDA stream with a stream hold, the C API's
methods on it, and the parts of torch that peers.py uses."""
import sys
import types

import numpy as np

import peers_timing


class Sim:
    """One stream on two clocks (ms): the host enqueues, the GPU runs what was enqueued in order,
    never before it was enqueued. A hold keeps the GPU from starting what follows it until
    release(), or until the host passed the hold's start + timeout (counted)."""

    def __init__(self):
        self.host, self.gpu, self.hold_at, self.pending, self.timeouts = 0.0, 0.0, None, [], 0
        self.flushes = 0

    def _run(self, dur, event, start):
        self.gpu = max(self.gpu, start) + dur
        if event is not None:
            event.t = self.gpu

    def _expire(self):
        if self.hold_at is not None and self.host > self.hold_at + 1000 * peers_timing.HOLD_TIMEOUT_S:
            self.timeouts += 1
            start, self.hold_at = self.hold_at + 1000 * peers_timing.HOLD_TIMEOUT_S, None
            for dur, event in self.pending:
                self._run(dur, event, start)
            self.pending = []

    def submit(self, dur, event=None, host_cost=0.0):
        self.host += host_cost
        self._expire()
        if self.hold_at is not None:
            self.pending.append((dur, event))
        else:
            self._run(dur, event, self.host)

    def hold(self):
        assert self.hold_at is None
        self.hold_at = max(self.gpu, self.host)

    def release(self):
        self._expire()
        if self.hold_at is not None:
            self.hold_at = None
            for dur, event in self.pending:
                self._run(dur, event, self.host)
            self.pending = []

    def sync(self):
        assert not self.pending, "waiting for work behind a hold that was never released"
        self.host = max(self.host, self.gpu)


class FakeEvent:
    def __init__(self, sim):
        self.sim, self.t = sim, None

    def record(self):
        self.sim.submit(0.0, self)

    def synchronize(self):
        self.sim.sync()

    def elapsed_time(self, end):
        return end.t - self.t


class FakeHold:
    def __init__(self, sim):
        self.sim, self.closed = sim, False

    def enqueue(self, stream, timeout_s):
        assert stream == 7 and timeout_s == peers_timing.HOLD_TIMEOUT_S
        self.sim.hold()

    def release(self):
        self.sim.release()

    def timeouts(self):
        return self.sim.timeouts

    def close(self):
        self.closed = True


class FakeFlush:
    def __init__(self, sim):
        self.sim = sim

    def enqueue(self, stream):
        self.sim.flushes += 1
        self.sim.submit(3.0)  # slow on purpose: it must never land inside the events

    def close(self):
        pass


class FakeCApi:
    """The C API's methods on the simulated stream; the checks answer `passed` and record what
    they were given."""

    def __init__(self, sim, passed=True):
        self.sim, self.passed, self.checks, self.fills, self.holds = sim, passed, [], [], []

    def hold(self):
        self.holds.append(FakeHold(self.sim))
        return self.holds[-1]

    def flush(self, l2_bytes=0):
        return FakeFlush(self.sim)

    def fill_normal(self, ptr, dtype, n, seed, tensor, stream):
        self.fills.append({"dtype": dtype, "n": n, "seed": seed, "tensor": tensor})

    def check_attention(self, problem, tensors):
        self.checks.append({"problem": problem, "tensors": {k: v for k, v in tensors.items() if v is not None}})
        outs = [k for k in ("O", "lse", "dQ", "dK", "dV") if tensors.get(k) is not None]
        return {"performed": True, "passed": self.passed, "reference": "cpu-fp64", "rows_checked": problem["S_q"],
                "outputs": {k: {"metric": "max_abs", "measured": 0.5 if not self.passed else 1e-3, "tolerance": 1e-2,
                                "passed": self.passed} for k in outs}}


def timer_torch(sim):
    """Just enough of torch for the timer."""
    cuda = types.SimpleNamespace(Event=lambda enable_timing: FakeEvent(sim), synchronize=sim.sync,
                                 clock_rate=lambda: 1980, current_stream=lambda: types.SimpleNamespace(cuda_stream=7))
    return types.SimpleNamespace(cuda=cuda)


def kernel(sim, durations, host_cost=0.0, stall_at=None):
    """fn() for the timer: the next GPU duration, after host_cost ms of host time (2.5 s at call
    number `stall_at`, past the hold's timeout)."""
    it = iter(durations)
    calls = [0]

    def fn():
        calls[0] += 1
        cost = 2500.0 if calls[0] == stall_at else host_cost
        sim.submit(next(it), host_cost=cost)
    return fn


def install_fake_torch(monkeypatch, sim):
    """A stand-in for the parts of torch that peers.py uses, on the simulated stream: every SDPA
    call takes GPU time proportional to its FLOPs (100 TFLOP/s); the flash backend refuses fp32,
    as PyTorch's does."""
    state = types.SimpleNamespace(peak=0, backend=None, assigns=0)

    class Tensor:
        def __init__(self, shape, dtype):
            self.shape, self.dtype = tuple(shape), dtype

        def detach(self):
            return self

        def requires_grad_(self, flag=True):
            return self

        def to(self, device, dtype):
            return Tensor(self.shape, dtype)

        def transpose(self, a, b):
            s = list(self.shape)
            s[a], s[b] = s[b], s[a]
            return Tensor(s, self.dtype)

        def contiguous(self):
            return self

        def view(self, dtype):
            return Tensor(self.shape, dtype)

        def cpu(self):
            return self

        def numpy(self):
            return np.zeros(self.shape, dtype={"float32": np.float32, "int16": np.int16}.get(self.dtype, np.float64))

        def data_ptr(self):
            return 0x1000

        def numel(self):
            return int(np.prod(self.shape))

        def __getitem__(self, idx):
            return Tensor([len(range(*s.indices(n))) if isinstance(s, slice) else n
                           for s, n in zip(idx + (slice(None),) * (len(self.shape) - len(idx)), self.shape)], self.dtype)

        def __setitem__(self, idx, value):
            state.assigns += 1
            sim.submit(0.001)

    class NoGrad:
        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

    def sdpa(q, k, v, scale=None, is_causal=False, attn_mask=None, enable_gqa=False):
        if state.backend == "flash" and q.dtype == "float32":
            raise RuntimeError("No available kernel. Aborting execution.")
        B, H, S, D = q.shape
        sim.submit(4.0 * B * H * S * k.shape[2] * D / 1e11, host_cost=0.05)  # ms at 100 TFLOP/s
        state.peak = max(state.peak, B * H * S * k.shape[2] * 4 if state.backend == "math" else 0)
        return Tensor(q.shape, q.dtype)

    def grad(out, inputs, grad_out, retain_graph):
        sdpa(out, out, out)
        return tuple(Tensor(t.shape, t.dtype) for t in inputs)

    class Kernel:
        def __init__(self, backends):
            self.b = backends[0]

        def __enter__(self):
            state.backend = self.b
            return self

        def __exit__(self, *a):
            return False

    backend = types.SimpleNamespace(FLASH_ATTENTION="flash", CUDNN_ATTENTION="cudnn", EFFICIENT_ATTENTION="efficient",
                                    MATH="math")
    attention = types.ModuleType("torch.nn.attention")
    attention.SDPBackend, attention.sdpa_kernel = backend, Kernel
    bias = types.ModuleType("torch.nn.attention.bias")
    bias.causal_lower_right = lambda s_q, s_k: ("lower_right", s_q, s_k)
    functional = types.ModuleType("torch.nn.functional")
    functional.scaled_dot_product_attention = sdpa
    nn = types.ModuleType("torch.nn")
    nn.functional, nn.attention, attention.bias = functional, attention, bias
    props = types.SimpleNamespace(L2_cache_size=50 << 20, name="Fake GPU", multi_processor_count=132, major=9,
                                  minor=0, total_memory=80 << 30)
    cuda = types.SimpleNamespace(
        is_available=lambda: True, current_device=lambda: 0, get_device_properties=lambda i: props,
        Event=lambda enable_timing: FakeEvent(sim), synchronize=sim.sync, clock_rate=lambda: 1980,
        current_stream=lambda: types.SimpleNamespace(cuda_stream=7),
        reset_peak_memory_stats=lambda: setattr(state, "peak", 0), memory_allocated=lambda: 0,
        max_memory_allocated=lambda: state.peak, empty_cache=lambda: None, OutOfMemoryError=MemoryError)
    torch = types.ModuleType("torch")
    torch.__version__ = "0.0-fake"
    torch.cuda, torch.nn = cuda, nn
    torch.float32, torch.float16, torch.bfloat16, torch.int16 = "float32", "float16", "bfloat16", "int16"
    torch.version = types.SimpleNamespace(cuda="13.0")
    torch.backends = types.SimpleNamespace(cuda=types.SimpleNamespace(matmul=types.SimpleNamespace(allow_tf32=True)),
                                           cudnn=types.SimpleNamespace(allow_tf32=True, version=lambda: 90000))
    torch.from_numpy = lambda a: Tensor(a.shape, "float64")
    torch.empty = torch.zeros = lambda shape, dtype=None, device=None: Tensor(shape, dtype)
    torch.no_grad = NoGrad
    torch.autograd = types.SimpleNamespace(grad=grad)
    for name, mod in (("torch", torch), ("torch.nn", nn), ("torch.nn.functional", functional),
                      ("torch.nn.attention", attention), ("torch.nn.attention.bias", bias)):
        monkeypatch.setitem(sys.modules, name, mod)
    return state
