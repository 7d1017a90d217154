"""A profiler file's events, parsed: host events nested per thread, device activity, launches.

Kineto writes flat "complete" events ("ph": "X", ts and dur in microseconds). Host events
(`cpu_op`, `user_annotation`) nest by time on their thread; device events (`kernel`,
`gpu_memcpy`, `gpu_memset`) sit on a CUDA stream and name, in args.correlation, the runtime
call (`cudaLaunchKernel`, ...) that launched them. Here each host event learns its parent, the
outermost communication event it lies in (`root`), and whether it holds one; each device event
learns its launch. Events of categories nobody reads are counted in `skipped`, never guessed at;
a malformed event (a field of the wrong type, a time that is not a finite number, a negative
duration) is a `ConfigError` naming it: the file is broken, and what it says cannot be trusted.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

from traces.errors import ConfigError, show
from traces.kineto.comms import is_nccl_kernel

CPU_OP = "cpu_op"
ANNOTATION = "user_annotation"
DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
RUNTIME_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver"})
# Complete events read for nothing: the profiler's own span, annotations drawn on the GPU
# timeline (their kernels are read instead), Python frames (with_stack), profiler overhead,
# synchronization records (the runtime calls are read instead).
_IGNORED_CATEGORIES = frozenset({"Trace", "gpu_user_annotation", "python_function", "overhead",
                                 "cuda_sync", "cpu_instant_event", "external_correlation"})
# Phases that carry structure, not work: metadata, flow arrows, instants.
_STRUCTURE_PHASES = frozenset({"M", "s", "t", "f", "i", "I"})
# Runtime calls that make a stream or the host wait for work on another stream.
WAIT_CALLS = frozenset({"cudaStreamWaitEvent", "cudaStreamSynchronize", "cudaEventSynchronize",
                        "cudaDeviceSynchronize", "cuStreamWaitEvent", "cuStreamSynchronize",
                        "cuEventSynchronize", "cuCtxSynchronize"})

# Communication roles of host events; the order also breaks ties when two events share their
# interval (integer-microsecond traces): the caller outside, the backend inside.
NONE, ISSUE, RECORD, BACKEND, LAUNCH = range(5)
_ISSUE_PREFIXES = ("c10d::", "_c10d_functional::", "c10d_functional::")
_BACKEND_PREFIXES = ("nccl:", "gloo:")
NESTING_SLACK_US = 1.0
"""A child may end this far past its parent (timestamps rounded to 1 us in older traces)."""


def role_of(name: str) -> int:
    if name == "record_param_comms":
        return RECORD
    if name.startswith(_ISSUE_PREFIXES):
        return ISSUE
    if name.startswith(_BACKEND_PREFIXES):
        return BACKEND
    return NONE


@dataclass(slots=True, eq=False)
class HostEvent:
    name: str
    cat: str
    thread: Hashable
    ts: float
    end: float
    args: dict[str, Any]
    role: int
    parent: HostEvent | None = None
    cpu_parent: HostEvent | None = None
    """The nearest enclosing cpu_op."""
    root: HostEvent | None = None
    """The outermost communication event holding this one (itself, for such a root)."""
    members: list[HostEvent] | None = None
    """On a communication root: its communication events, in nesting order."""
    holds_comm: bool = False


@dataclass(slots=True, eq=False)
class DeviceEvent:
    name: str
    cat: str
    stream: str
    ts: float
    end: float
    args: dict[str, Any]
    launch: HostEvent | None
    """An NCCL kernel's launching runtime call, nested among the host events."""
    nccl: bool
    launch_thread: Hashable | None
    """The host thread that launched it, when the trace links them."""
    launch_ts: float | None


@dataclass(slots=True)
class Events:
    host: dict[Hashable, list[HostEvent]]
    """cpu_op and user_annotation events (and the launches of NCCL kernels) per thread,
    sorted outer before inner."""
    device: list[DeviceEvent]
    waits: dict[Hashable, list[float]]
    """Per thread, the sorted start times of its stream-wait and synchronize calls."""
    origin_us: float
    """The earliest start of a complete event (the profiler's own span left out)."""
    skipped: Counter[str] = field(default_factory=Counter)


def parse(raw_events: list[Any], source: str = "trace") -> Events:
    """The events of `source` (named in errors), parsed (see the module doc)."""
    host_raw: list[tuple[str, str, Hashable, float, float, dict[str, Any]]] = []
    runtime: dict[int, tuple[str, Hashable, float, float, dict[str, Any]]] = {}
    waits: dict[Hashable, list[float]] = {}
    device_raw: list[tuple[dict[str, Any], float, float, str, str, str]] = []
    skipped: Counter[str] = Counter()
    origin = math.inf
    for index, raw in enumerate(raw_events):
        _check(raw, index, source)
        phase = raw.get("ph")
        if phase != "X":
            if phase not in _STRUCTURE_PHASES:
                skipped[f"phase {phase}"] += 1
            continue
        cat, name = raw.get("cat"), raw["name"]
        ts, dur = float(raw["ts"]), float(raw["dur"])
        if cat == "Trace":
            continue
        if ts < origin:
            origin = ts
        args = raw.get("args")
        args = args if type(args) is dict else {}
        if cat in (CPU_OP, ANNOTATION):
            host_raw.append((name, cat, (raw.get("pid"), raw.get("tid")), ts, ts + dur, args))
        elif cat in RUNTIME_CATEGORIES:
            thread = (raw.get("pid"), raw.get("tid"))
            correlation = args.get("correlation")
            if type(correlation) is int:
                runtime[correlation] = (name, thread, ts, ts + dur, args)
            if name in WAIT_CALLS:
                waits.setdefault(thread, []).append(ts)
        elif cat in DEVICE_CATEGORIES:
            stream = args.get("stream", raw.get("tid"))
            device_raw.append((args, ts, ts + dur, name, cat, f"cuda:{stream}"))
        elif cat not in _IGNORED_CATEGORIES:
            skipped[f"category {cat}"] += 1
    # A GPU trace's compute is its kernels: of the host events only communication is needed.
    host: dict[Hashable, list[HostEvent]] = {}
    for fields in host_raw:
        role = role_of(fields[0])
        if role != NONE or not device_raw:
            host.setdefault(fields[2], []).append(HostEvent(*fields, role))
    device = _link(device_raw, runtime, host)
    for events in host.values():
        _nest(events)
    for times in waits.values():
        times.sort()
    return Events(host, device, waits, origin if origin < math.inf else 0.0, skipped)


def _check(raw: object, index: int, source: str) -> None:
    """Raise a `ConfigError` naming the event when it is malformed; a complete ("X") event
    needs a string name, finite ts and dur (dur >= 0) and an object of args."""
    where = f"{source}: traceEvents[{index}]"
    if type(raw) is not dict:
        raise ConfigError(f"{where}: {show(raw)} is not a JSON object")
    where += f" ({show(raw['name'])})" if isinstance(raw.get("name"), str) else ""
    if type(raw.get("ph")) is not str:
        raise ConfigError(f"{where}: ph {show(raw.get('ph'))} is not a string")
    for key, types in (("cat", (str,)), ("pid", (int, str)), ("tid", (int, str))):
        if key in raw and type(raw[key]) not in types:
            raise ConfigError(f"{where}: {key} {show(raw[key])} is not "
                              f"{' or '.join(_TYPE_NAMES[t] for t in types)}")
    if raw["ph"] != "X":
        return
    if type(raw.get("name")) is not str:
        raise ConfigError(f"{where}: name {show(raw.get('name'))} is not a string")
    for key in ("ts", "dur"):
        value = raw.get(key)
        if not _finite(value):
            raise ConfigError(f"{where}: {key} {show(value)} is not a finite number")
        if key == "dur" and raw["dur"] < 0:
            raise ConfigError(f"{where}: dur {show(value)} is negative (a duration is >= 0)")
    if "args" in raw and type(raw["args"]) is not dict:
        raise ConfigError(f"{where}: args {show(raw['args'])} is not a JSON object")


_TYPE_NAMES = {str: "a string", int: "an integer"}
_MAX_US = 1e300
"""Microseconds beyond any clock: a larger time is not a measurement (and float() of a
longer integer overflows)."""


def _finite(value: object) -> bool:
    """A finite JSON number within `_MAX_US` (bool is not one)."""
    if type(value) is int:
        return abs(value) < _MAX_US
    return type(value) is float and math.isfinite(value) and abs(value) < _MAX_US


def _link(device_raw: list[tuple[dict[str, Any], float, float, str, str, str]],
          runtime: dict[int, tuple[str, Hashable, float, float, dict[str, Any]]],
          host: dict[Hashable, list[HostEvent]]) -> list[DeviceEvent]:
    """Device events with their launches; an NCCL kernel's launch joins its thread's nesting,
    so that the collective's host events around it can be found."""
    device = []
    for args, ts, end, name, cat, stream in device_raw:
        correlation = args.get("correlation")
        call = runtime.get(correlation) if type(correlation) is int else None
        nccl = cat == "kernel" and is_nccl_kernel(name)
        launch = None
        if nccl and call is not None:
            launch = HostEvent(call[0], "cuda_runtime", call[1], call[2], call[3], call[4],
                               LAUNCH)
            host.setdefault(launch.thread, []).append(launch)
        device.append(DeviceEvent(name, cat, stream, ts, end, args, launch, nccl,
                                  call[1] if call else None, call[2] if call else None))
    return device


def _nest(events: list[HostEvent]) -> None:
    """Parent links by time on one thread; roots and members of communication events."""
    events.sort(key=lambda e: (e.ts, -e.end, e.role))
    stack: list[HostEvent] = []
    for event in events:
        while stack and stack[-1].end <= event.ts:
            stack.pop()
        parent = stack[-1] if stack else None
        if parent is not None:
            event.parent = parent
            event.cpu_parent = parent if parent.cat == CPU_OP else parent.cpu_parent
            event.root = parent.root
        if event.role not in (NONE, LAUNCH):
            if event.root is None:
                event.root, event.members = event, []
            assert event.root.members is not None
            event.root.members.append(event)
            ancestor = parent
            while ancestor is not None and not ancestor.holds_comm:
                ancestor.holds_comm = True
                ancestor = ancestor.parent
        # An event running past its parent's end (an async backend annotation, begun in the
        # issuing op and ended at its wait) belongs to the parent but holds nothing itself.
        if parent is None or event.end <= parent.end + NESTING_SLACK_US:
            stack.append(event)
