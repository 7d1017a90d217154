"""One rank's ops from its parsed events: each collective found once, compute between them.

A collective is recorded several times over; it becomes one op, from one anchor:

* GPU traces: the NCCL kernel. Its launch lies inside the host events of the call
  (c10d::allreduce_ > record_param_comms > nccl:all_reduce > cudaLaunchKernel); those events
  describe it and are not counted again. Kernels launched inside the same innermost host event
  are one collective. A host call whose kernel is not in the trace is skipped (counted).
* CPU traces (gloo): the issuing call, the outermost communication event on its thread
  (c10d::allreduce_, holding record_param_comms in some versions). The backend runs it on
  another thread (a gloo:all_reduce annotation on pt_gloo_runloop), which gives its times but
  is not a collective of its own: execution events are matched to calls first-in first-out, as
  gloo's work queue runs them (a reduce_scatter may run as several all_reduces). An execution
  event no earlier call could have issued (its call predates the profile) stands alone.

Compute: on GPU traces every other kernel, memcpy and memset (what takes device time); on CPU
traces the outermost cpu_ops that hold no communication (descending into those that do, e.g.
the autograd node whose gradient hook issued DDP's all-reduce).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field

from traces.errors import ConfigError, show
from traces.kineto import comms
from traces.kineto.comms import BARRIER, WAIT, Facts
from traces.kineto.events import BACKEND, CPU_OP, ISSUE, RECORD, DeviceEvent, Events, HostEvent
from traces.ops import OpKind

# Execution events of a kind (gloo's annotation) may serve calls of these kinds.
_EXECUTES: dict[str, tuple[str, ...]] = {
    OpKind.ALL_REDUCE: (OpKind.ALL_REDUCE, OpKind.REDUCE_SCATTER)}


@dataclass(slots=True, kw_only=True)
class RawOp:
    """An op before ordering and dependencies; times in microseconds of the file's clock."""

    kind: OpKind
    stream: str
    name: str
    start: float
    end: float
    group: tuple[int, ...] = ()
    size_bytes: float = 0.0
    dtype: str | None = None
    peer: int | None = None
    issuer: Hashable | None = None
    """The host thread that launched or issued it (None: the trace does not link it)."""
    launch: float | None = None
    """When the issuer launched or issued it."""


@dataclass(frozen=True, slots=True)
class RankContext:
    rank: int
    world_size: int
    groups: dict[str, tuple[int, ...]]
    """Process groups by name (distributedInfo.pg_config)."""
    source: str = "trace"
    """The file, for errors."""


@dataclass(slots=True)
class RankOps:
    ops: list[RawOp] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)
    num_group_assumed: int = 0
    """Collectives whose group the trace does not state: given the whole world."""
    num_size_unknown: int = 0


def rank_ops(events: Events, context: RankContext) -> RankOps:
    out = RankOps(skipped=Counter(events.skipped))
    linked = _gpu_collectives(events, context, out)
    _cpu_collectives(events, context, out, linked)
    if events.device:
        out.ops += (_device_compute(d) for d in events.device if not d.nccl)
    else:
        out.ops += _host_compute(events)
    return out


# --- collectives ---------------------------------------------------------------------------------

def _gpu_collectives(events: Events, context: RankContext, out: RankOps) -> set[int]:
    """One op per NCCL kernel (or per host call, for kernels sharing one); returns the ids of
    the communication roots that were linked to kernels."""
    kernels: dict[int, list[DeviceEvent]] = {}
    chains: dict[int, list[HostEvent]] = {}
    for kernel in events.device:
        if kernel.nccl:
            chain = _chain(kernel.launch)
            key = id(chain[0]) if chain else id(kernel)
            kernels.setdefault(key, []).append(kernel)
            chains[key] = chain
    for key, group in kernels.items():
        chain, first = chains[key], min(group, key=lambda k: k.ts)
        facts = comms.merge([*(comms.from_record(e.args) for e in chain if e.role == RECORD),
                             *(comms.from_record(k.args) for k in group),
                             *(comms.from_issue(e.name, e.args) for e in chain if e.role == ISSUE),
                             *(comms.from_backend(e.name, e.args)
                               for e in chain if e.role == BACKEND),
                             comms.from_kernel_name(first.name)])
        _add(out, context, facts, stream=first.stream, start=first.ts,
             end=max(k.end for k in group), issuer=first.launch_thread, launch=first.launch_ts,
             what="NCCL kernel")
    return {id(chain[-1]) for chain in chains.values() if chain}


def _chain(launch: HostEvent | None) -> list[HostEvent]:
    """The communication events around a launch, innermost first (the root last)."""
    chain = []
    event = launch.parent if launch is not None else None
    while event is not None and event.root is not None:
        if event.role in (ISSUE, RECORD, BACKEND):
            chain.append(event)
        if event.root is event:
            break
        event = event.parent
    return chain


def _cpu_collectives(events: Events, context: RankContext, out: RankOps,
                     linked: set[int]) -> None:
    roots = sorted((e for evs in events.host.values() for e in evs
                    if e.members is not None and id(e) not in linked),
                   key=lambda e: (e.ts, e.end))
    # Calls: roots with a dispatcher op or a comms record, or NCCL's annotation (whose kernel,
    # had it been traced, would have linked it). Executions: gloo's annotations on their own.
    calls: list[HostEvent] = []
    executions: list[HostEvent] = []
    for root in roots:
        members = root.members or []
        is_call = any(m.role in (ISSUE, RECORD) or m.name.startswith("nccl:") for m in members)
        (calls if is_call else executions).append(root)
    facts = {id(call): _call_facts(call) for call in calls}
    assigned, alone = _match_executions(calls, executions, facts)
    nccl_in_trace = any(d.nccl for d in events.device)
    for call in calls:
        fact = facts[id(call)]
        if fact.kind is None or fact.kind == WAIT:
            out.skipped["communication record naming no collective" if fact.kind is None
                        else "wait for a collective"] += 1
            continue
        members = call.members or []
        # Where the backend ran it: gloo's annotations (NCCL's say only where it was issued).
        runs = [m for m in members if m.role == BACKEND and not m.name.startswith("nccl:")]
        runs += assigned.get(id(call), [])
        if not runs and (nccl_in_trace or any(m.name.startswith("nccl:") for m in members)):
            out.skipped["collective call whose NCCL kernel is not in the trace"] += 1
            continue
        fact = comms.merge([fact, *(comms.from_backend(r.name, r.args) for r in runs)])
        span = runs or [call]
        _add(out, context, fact, stream=f"comm:{_tid(span[0].thread)}",
             start=min(r.ts for r in span), end=max(r.end for r in span), issuer=call.thread,
             launch=call.ts, what="collective call")
    for execution in alone:
        _add(out, context, comms.from_backend(execution.name, execution.args),
             stream=f"comm:{_tid(execution.thread)}", start=execution.ts, end=execution.end,
             issuer=None, launch=None, what="backend event")


def _call_facts(call: HostEvent) -> Facts:
    members = call.members or []
    return comms.merge([*(comms.from_record(m.args) for m in members if m.role == RECORD),
                        *(comms.from_issue(m.name, m.args) for m in members if m.role == ISSUE),
                        *(comms.from_backend(m.name, m.args)
                          for m in members if m.role == BACKEND)])


def _match_executions(calls: list[HostEvent], executions: list[HostEvent],
                      facts: dict[int, Facts],
                      ) -> tuple[dict[int, list[HostEvent]], list[HostEvent]]:
    """Execution events to calls: each to the earliest earlier call of a kind it can run that
    has none yet (gloo's queue is first-in first-out), else to the latest such call (one call
    run as several); with no such call it stands alone."""
    assigned: dict[int, list[HostEvent]] = {}
    alone: list[HostEvent] = []
    waiting: dict[str, deque[HostEvent]] = {}  # per kind, calls without an execution, in order
    latest: dict[str, HostEvent] = {}
    next_call = 0
    for execution in sorted(executions, key=lambda e: e.ts):
        while next_call < len(calls) and calls[next_call].ts <= execution.ts:
            call = calls[next_call]
            kind = facts[id(call)].kind or ""
            waiting.setdefault(kind, deque()).append(call)
            latest[kind] = call
            next_call += 1
        kind = comms.kind_of(comms.short_name(execution.name))
        kinds = _EXECUTES.get(kind, (kind,))
        heads = [waiting[k][0] for k in kinds if waiting.get(k)]
        if heads:
            call = min(heads, key=lambda c: c.ts)
            waiting[facts[id(call)].kind or ""].popleft()
        elif any(k in latest for k in kinds):
            call = max((latest[k] for k in kinds if k in latest), key=lambda c: c.ts)
        else:
            alone.append(execution)
            continue
        assigned.setdefault(id(call), []).append(execution)
    return assigned, alone


def _add(out: RankOps, context: RankContext, facts: Facts, *, stream: str, start: float,
         end: float, issuer: Hashable | None, launch: float | None, what: str) -> None:
    """Append the collective `facts` describe, or count why it is skipped."""
    if facts.kind is None:
        out.skipped[f"{what} of unknown kind"] += 1
        return
    if facts.kind == WAIT:
        out.skipped["wait for a collective"] += 1
        return
    if facts.kind == "":
        out.skipped[f"collective parasim does not model: {facts.name}"] += 1
        return
    group, assumed = _group(facts, context, f"{what} {show(facts.name)} at ts {start:g} us")
    if group is None:
        out.skipped["collective whose stated group does not hold this rank"] += 1
        return
    kind = OpKind.ALL_REDUCE if facts.kind == BARRIER else OpKind(facts.kind)
    op = RawOp(kind=kind, stream=stream, name=facts.name or str(kind), start=start, end=end,
               size_bytes=facts.size_bytes(len(group)), dtype=facts.dtype, issuer=issuer,
               launch=launch)
    if kind.is_p2p:
        peer = facts.peer
        if peer is None or peer >= len(group) or group[peer] == context.rank:
            out.skipped["send/recv whose peer the trace does not state"] += 1
            return
        op.peer = group[peer]
    else:
        op.group = group
        out.num_group_assumed += assumed
    out.num_size_unknown += op.size_bytes == 0.0 and facts.kind != BARRIER
    out.ops.append(op)


def _group(facts: Facts, context: RankContext, event: str,
           ) -> tuple[tuple[int, ...] | None, bool]:
    """The group's global ranks, and whether it was assumed (the whole world); None when the
    group does not hold this rank. A stated group naming ranks outside the world, or one rank
    twice, is a `ConfigError`."""
    if facts.group is not None:
        group = facts.group
        if len(set(group)) != len(group) or max(group) >= context.world_size:
            raise ConfigError(f"{context.source}: {event}: Process Group Ranks {show(list(group))} "
                              f"are not distinct ranks of the world of {context.world_size}")
    elif facts.pg_name is not None and facts.pg_name in context.groups:
        group = context.groups[facts.pg_name]
    elif len(context.groups) == 1:  # the rank belongs to one group only: it must be that one
        group = next(iter(context.groups.values()))
    else:
        return tuple(range(context.world_size)), True
    ok = (context.rank in group and len(set(group)) == len(group)
          and max(group) < context.world_size)
    return (group if ok else None), False


# --- compute -------------------------------------------------------------------------------------

def _device_compute(event: DeviceEvent) -> RawOp:
    return RawOp(kind=OpKind.COMPUTE, stream=event.stream, name=event.name, start=event.ts,
                 end=event.end, issuer=event.launch_thread, launch=event.launch_ts)


def _host_compute(events: Events) -> Iterable[RawOp]:
    """The outermost cpu_ops holding no communication, below those that hold some."""
    for thread, host in events.host.items():
        stream = f"thread:{_tid(thread)}"
        for e in host:
            if (e.cat == CPU_OP and e.root is None and not e.holds_comm
                    and (e.cpu_parent is None or e.cpu_parent.holds_comm)):
                yield RawOp(kind=OpKind.COMPUTE, stream=stream, name=e.name, start=e.ts,
                            end=e.end, issuer=thread, launch=e.ts)


def _tid(thread: Hashable) -> object:
    return thread[1] if isinstance(thread, tuple) else thread
