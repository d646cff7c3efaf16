"""pswitch.Client: submit inference and training to pswitchd, run fill jobs, report bubbles.

A thin layer over the C++ client library (the compiled pswitch._pswitch): one connection, shared
by every call and thread; each call waits at most the client's timeout and releases the GIL
while it waits. Errors raise pswitch.errors classes. Tensors go in as numpy arrays or torch
tensors (CPU; float32, int64 or int32) and come back as numpy arrays, or torch tensors when the
input was one (torch is imported only then).

With a local pswitchd the client talks over its Unix socket and tensors travel through a shared
transfer area instead of the socket (docs/python.md): Client.tensor gives an array to fill in
place (sent with no copy), any other input is copied into the area once, and outputs are arrays
viewing the area. Such an output stays valid as long as it, or any view or torch tensor made from
it, is referenced; its space goes back to the client when the last reference goes. Keep the data
while giving the space back with .copy() (or TaskResult.copy()).
"""
import concurrent.futures
import contextlib
import dataclasses
import json
import sys
import typing

import numpy as np

try:
    from . import _pswitch
except ImportError as error:  # the package used from its sources, unbuilt
    raise ImportError("pswitch._pswitch, the compiled client, is missing: build it (cmake, see "
                      "python/README.md) or pip install ./python") from error


@dataclasses.dataclass
class RegisteredModel:
    name: str
    layers: int
    groups: int
    param_bytes: int
    # (phase, seconds) in the order they ran: read, inspect, profile, plan, pin, load
    phases: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class ModelInfo:
    name: str
    architecture: str  # a zoo architecture, or "torchscript" for your own (pswitch.export)
    param_bytes: int
    output_dtype: str = ""  # numpy's name; "" when pswitchd did not record it
    output_shape: list = dataclasses.field(default_factory=list)  # -1 = the input's batch
    # The GPUs whose weights cache holds it now: a task there copies nothing.
    resident_gpus: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class TaskResult:
    task_id: int
    outputs: dict  # name -> array (numpy, or torch when the input was torch)
    latency_s: float  # server-side, submission to completion
    switch_time_s: float  # the model's copy; 0 when it was resident
    # Over the Unix socket: name -> (area, offset, length), the slice each input was sent as
    # (an array from Client.tensor is sent as its own bytes: Client.area_slice(array)).
    sent_inputs: dict = dataclasses.field(default_factory=dict)

    @property
    def output(self):
        """The model's output ("output")."""
        return self.outputs["output"]

    def copy(self):
        """A TaskResult whose outputs are copies, independent of the transfer area."""
        return dataclasses.replace(self, outputs={k: v.copy() if hasattr(v, "copy")
                                                  else v.clone()
                                                  for k, v in self.outputs.items()})

    def release(self):
        """Drops this result's references to its outputs: once no other reference to them (or to
        views of them) is left, their space in the transfer area goes back to the client."""
        self.outputs = {}


@dataclasses.dataclass
class TaskStatus:
    task_id: int
    model: str
    state: str  # queued, switching, running, succeeded, failed, cancelled
    iterations_done: int
    preemptions: int
    worker_pid: int
    error: typing.Optional[Exception]
    clean_time_s: float
    cleaned_after_drain: bool


@dataclasses.dataclass
class FillJobStatus:
    job_id: int
    state: str  # submitted, created, paused, running, stopped
    gpu: int
    steps_done: int
    steps_total: int
    bubbles: int
    predicted_remaining_s: float
    meets_deadline: bool
    error: typing.Optional[Exception]


@dataclasses.dataclass
class FillStats:
    bubbles: int
    bubble_time_s: float
    fill_step_time_s: float
    steps: int
    pause_p50_s: float
    pause_p99_s: float
    killed: int
    runs: int  # fill runs started (a Run message each)
    bell_wakes: int  # bubbles a resident run was woken for by its bell, with no message


class _ProgressLine:
    """Phases as they end, on one line of stderr rewritten in place."""

    def __init__(self, label):
        self._label = label
        self._phases = []
        self._written = False

    def __call__(self, phase, seconds):
        self._phases.append(f"{phase} {seconds:.2f} s")
        self._write("")

    def detail(self, phase, seconds, text):
        """How far the running phase has come, after the phases done."""
        self._write(f"{phase}: {text}")

    def _write(self, running):
        shown = ", ".join(self._phases + ([running] if running else []))
        # \033[K clears what a longer line before left at its end.
        sys.stderr.write(f"\r{self._label}: {shown}\033[K")
        sys.stderr.flush()
        self._written = True

    def close(self):
        if self._written:
            sys.stderr.write("\n")
            sys.stderr.flush()


def _is_torch(value):
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def _as_numpy(name, value):
    if _is_torch(value):
        if value.device.type != "cpu":
            raise TypeError(f"input '{name}' is on {value.device}; pswitch takes CPU tensors "
                            "(call .cpu() first)")
        return value.detach().numpy()  # a view: the same bytes (an area tensor's are not copied)
    if isinstance(value, np.ndarray):
        return value
    raise TypeError(f"input '{name}' is a {type(value).__name__}; pass a numpy array or a "
                    "torch tensor")


class Client:
    """A connection to pswitchd. Use as a context manager, or call close().

    `address`: "unix:/path" (pswitchd's Unix socket), "HOST:PORT" (TCP), or None. None, and a
    loopback address with pswitchd's default port 7300 ("127.0.0.1:7300", "localhost:7300",
    "[::1]:7300"), use the default Unix socket ($PSWITCH_UNIX_SOCKET, else
    /run/pswitch/pswitchd.sock, then $XDG_RUNTIME_DIR/pswitch/pswitchd.sock) when one accepts
    the connection, else TCP to that address (None: 127.0.0.1:7300). Any other address is
    TCP. transport="tcp" never uses the Unix socket.

    Over the Unix socket: `area_bytes` is the first transfer area's size (default 64 MiB; more
    areas are added as live arrays fill them) and `max_area_bytes` the bound on all of them
    (default 4 GiB); inputs that find no room are sent in the request instead, and
    Client.tensor and outputs that find none raise ResourceExhaustedError."""

    def __init__(self, address=None, token=None, timeout=600.0, *, transport="auto",
                 area_bytes=None, max_area_bytes=None):
        self._client = _pswitch.Client(address or "", token or "", float(timeout), transport,
                                       int(area_bytes or 0), int(max_area_bytes or 0))
        self._pool = None

    @property
    def local(self):
        """Whether tensors travel through a transfer area (the Unix socket) rather than TCP."""
        return self._client.local()

    def tensor(self, shape, dtype="float32", *, torch=False):
        """A new array of `shape` and `dtype` (contents unspecified) to fill in place and pass to
        infer: over the Unix socket it views the transfer area, so infer sends it with no copy
        (a C-contiguous slice of it too). Its space is the client's until the array and every
        view of it are gone. Over TCP an ordinary array. torch=True: a torch tensor sharing it.
        Do not write into an input while an infer that uses it runs."""
        shape = [int(d) for d in (shape if isinstance(shape, (list, tuple)) else (shape,))]
        if self.local:
            array = self._client.tensor(shape, np.dtype(dtype))
        else:
            array = np.empty(shape, dtype=dtype)
        if torch:
            import torch as _torch
            return _torch.from_numpy(array)  # shares the memory
        return array

    def area_slice(self, array):
        """(area, offset, length) of the transfer-area bytes `array` (numpy or CPU torch) views,
        or None when it views none (then infer copies it into the area once)."""
        if _is_torch(array):
            array = array.detach().numpy()
        if not isinstance(array, np.ndarray):
            return None
        return self._client.area_slice(array)

    def area_stats(self):
        """The transfer areas: {"areas", "area_bytes", "allocated_bytes" (held by live arrays)}."""
        return self._client.area_stats()

    def close(self):
        """Closes the connection; calls still in flight fail with UnavailableError."""
        if self._pool is not None:
            self._pool.shutdown(wait=False)
        self._client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    # --- models ---
    def register(self, name, model=None, *, archive=None, weights=None, batch=1, plan="auto",
                 trainers=(), dtype=None, progress=None, progress_detail=None,
                 pin_resident=False):
        """Registers `name` (admin): a zoo `model` ("resnet50"), your own `archive`
        (pswitch.export), or, with neither, the folder `name` of pswitchd's model repository.
        Over the Unix socket this client opens `archive`, `weights` and `plan` itself (paths
        relative to its working directory) and passes the open files; over TCP they are paths
        on the server and need pswitchd's --allow-client-paths. `trainers`: token names who may
        train it in place and unload it besides admins; everyone else trains a copy
        (train(..., as_model=)). `dtype`: a zoo model's precision, "float16" or "bfloat16" (half
        the bytes; inputs and outputs in that dtype; inference only), default float32; an
        archive keeps the precision it was exported in. `progress`: a callable, called as progress(phase, seconds) as
        each phase (read, inspect, profile, plan, pin, load) ends, on the client's reader thread
        (it must not call this client: the reply it would wait for comes through that thread);
        or True for a progress line on stderr (a terminal or a notebook), which also shows how
        far a long phase has come. `progress_detail`: a callable, called as
        progress_detail(phase, seconds_so_far, text) while a long phase runs ("inspect", 1.2,
        "profiling: run 2 of 4"), on the same thread. `pin_resident`: once its weights are
        resident on a GPU they are never evicted there (the weights cache)."""
        if model is not None and archive is not None:
            raise ValueError("name a zoo model or an archive, not both")
        if isinstance(trainers, str):
            raise TypeError("trainers is a list of names")
        line = None
        if progress is True:
            line = _ProgressLine(f"registering {name}")
            progress = line
            progress_detail = progress_detail or line.detail
        elif progress is not None and not callable(progress):
            raise TypeError("progress is a callable(phase, seconds) or True")
        if progress_detail is not None and not callable(progress_detail):
            raise TypeError("progress_detail is a callable(phase, seconds, text)")
        try:
            r = self._client.register(name, model or "", archive or "", weights or "",
                                      int(batch), plan or "auto", [str(t) for t in trainers],
                                      dtype or "", progress, progress_detail,
                                      bool(pin_resident))
        finally:
            if line is not None:
                line.close()
        return RegisteredModel(**r)

    def models(self):
        return [ModelInfo(**m) for m in self._client.models()]

    def unload(self, name):
        """Unloads `name` (an admin, one of its trainers, or a copy's owner): its queued tasks
        fail, then its weights are freed."""
        self._client.unload(name)

    # --- tasks ---
    def infer(self, model, inputs, *, priority=0, deadline=None, online_slo=None):
        """Runs `inputs` (an array or tensor, named "input", or a dict name -> array) through
        `model`; returns its output (an array, or a torch tensor when the input was one).

        `online_slo` (seconds): online fill work. It is served in one of a main training job's
        pipeline bubbles within this latency objective, so it never slows that job; if no bubble
        can serve it in time, pswitchd runs it anyway or refuses it (errors.DeadlineExceededError,
        with the reason), as its operator chose (--online-fill-overflow)."""
        return self.infer_result(model, inputs, priority=priority, deadline=deadline,
                                 online_slo=online_slo).output

    def infer_result(self, model, inputs, *, priority=0, deadline=None, online_slo=None):
        """As infer, with the task's id and timings (TaskResult)."""
        named = inputs if isinstance(inputs, dict) else {"input": inputs}
        to_torch = any(_is_torch(v) for v in named.values())
        wire = [(name, _as_numpy(name, value)) for name, value in named.items()]
        if online_slo is not None and not float(online_slo) > 0:
            raise ValueError("online_slo must be a positive number of seconds")
        r = self._client.infer(model, wire, int(priority), float(deadline or 0),
                               float(online_slo or 0))
        return self._result(r, to_torch)

    def infer_async(self, model, inputs, *, priority=0, deadline=None, online_slo=None):
        """As infer, returning a concurrent.futures.Future of the output."""
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=8,
                                                               thread_name_prefix="pswitch")
        return self._pool.submit(self.infer, model, inputs, priority=priority, deadline=deadline,
                                 online_slo=online_slo)

    def train(self, model, iterations, *, batch=0, seed=0, optimizer="sgd", lr=0.01,
              momentum=0.9, priority=0, deadline=None, as_model=None):
        """Trains `model` for `iterations` on seeded synthetic data (preemptible: inference
        on the GPU interrupts it and it resumes exactly). Returns the TaskResult.

        `as_model`: register a copy of `model` under this new name, yours alone (only you and
        admins see, serve, train and unload it), and train the copy; needed unless you are an
        admin or one of the model's trainers. Later training of the copy names it as `model`."""
        r = self._client.train(model, int(iterations), int(seed), int(priority), optimizer,
                               float(lr), float(momentum), int(batch), float(deadline or 0),
                               as_model or "")
        return self._result(r, False)

    def status(self, task_id=None, *, limit=0):
        """One task's status, or (task_id None) the most recent tasks, newest first."""
        if task_id is None:
            return [TaskStatus(**s) for s in self._client.list_tasks(int(limit))]
        return TaskStatus(**self._client.status(int(task_id)))

    def cancel(self, task_id):
        self._client.cancel(int(task_id))

    # --- fill jobs and the main job's bubbles ---
    def submit_fill(self, kind, model=None, *, dataset=None, output=None, batch=1, steps=0,
                    seed=0, step=0.001, memory_bytes=0, deadline=None, synthetic_step=0.0,
                    synthetic_alloc_bytes=0):
        """Submits a fill job ("training", "inference" or "synthetic") that runs only in the
        main job's bubbles. `step`: its profiled step time in seconds. Inference's `dataset` and
        new `output` file are named relative to pswitchd's --data-root (it does not take them
        as passed files yet)."""
        return FillJobStatus(**self._client.submit_fill(
            self._fill(kind, model, dataset, output, batch, steps, seed, step, memory_bytes,
                       deadline, synthetic_step, synthetic_alloc_bytes), False))

    def estimate_fill(self, kind, model=None, **options):
        """The GPU and predicted completion a submit_fill would get now; submits nothing."""
        args = dict(dataset=None, output=None, batch=1, steps=0, seed=0, step=0.001,
                    memory_bytes=0, deadline=None, synthetic_step=0.0, synthetic_alloc_bytes=0)
        args.update(options)
        return FillJobStatus(**self._client.submit_fill(
            self._fill(kind, model, args["dataset"], args["output"], args["batch"],
                       args["steps"], args["seed"], args["step"], args["memory_bytes"],
                       args["deadline"], args["synthetic_step"], args["synthetic_alloc_bytes"]),
            True))

    def fill_status(self, job_id):
        return FillJobStatus(**self._client.fill_status(int(job_id)))

    def cancel_fill(self, job_id):
        self._client.cancel_fill(int(job_id))

    def fill_stats(self):
        return FillStats(**self._client.fill_stats())

    def register_bubble_cycle(self, gpu, cycle, origin_ns=0):
        """The GPU's repeating bubble cycle: a dict or JSON text
        {"period_ns", "bubbles": [{"offset_ns", "duration_ns", "free_bytes"}]}."""
        text = cycle if isinstance(cycle, str) else json.dumps(cycle)
        self._client.register_bubble_cycle(int(gpu), text, int(origin_ns))

    def bubble_begin(self, gpu, expected, free_bytes, began_ns=0):
        """The main job's stage `gpu` goes idle for about `expected` seconds, leaving
        `free_bytes` of device memory to fill work (a job needing more does not run in it);
        began_ns: time.monotonic_ns() when it did (0: now). Does not wait for the server."""
        self._client.bubble_begin(int(gpu), float(expected), int(free_bytes), int(began_ns))

    def bubble_end(self, gpu):
        self._client.bubble_end(int(gpu))

    @contextlib.contextmanager
    def bubble(self, gpu, expected, free_bytes):
        """`with client.bubble(gpu, expected):` around an idle wait; ends it even on error."""
        self.bubble_begin(gpu, expected, free_bytes)
        try:
            yield
        finally:
            self.bubble_end(gpu)

    # --- helpers ---
    @staticmethod
    def _fill(kind, model, dataset, output, batch, steps, seed, step, memory_bytes, deadline,
              synthetic_step, synthetic_alloc_bytes):
        return {"kind": kind, "model": model or "", "dataset": dataset or "",
                "output": output or "", "batch": int(batch), "steps": int(steps),
                "seed": int(seed), "step_s": float(step), "memory_bytes": int(memory_bytes),
                "deadline_s": float(deadline or 0), "synthetic_step_s": float(synthetic_step),
                "synthetic_alloc_bytes": int(synthetic_alloc_bytes)}

    @staticmethod
    def _result(r, to_torch):
        outputs = dict(r["outputs"])
        if to_torch:
            import torch
            outputs = {k: torch.from_numpy(v) for k, v in outputs.items()}  # no copy
        return TaskResult(task_id=r["task_id"], outputs=outputs, latency_s=r["latency_s"],
                          switch_time_s=r["switch_time_s"],
                          sent_inputs={name: tuple(s) for name, s in r["sent_inputs"]})
