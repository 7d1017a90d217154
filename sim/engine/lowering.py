"""A plan's communication, lowered before the replay: pure, so a test can call it alone.

    comm = lower_communication(plan, cluster, fold, algo=Algorithm.AUTO)

Every send/recv and collective gets a typed key (what moves, between whom, how many bytes);
each distinct key is lowered once by `sim.collectives` into rounds of flow sets, and each op
gets a `CommOp` (its lowering, meeting channel, issue counter and how many must arrive) and a
call number: its place among the rank's calls on that channel in program order.
Partial traces replay by symmetry, folded plans add their copies' flows where they share the
representatives' links, measured communication of unstated size keeps its duration, and bad
traces raise `ConfigError` naming the op.

In full: docs/engine.md ("Lowering communication").
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from itertools import compress, count, repeat
from operator import attrgetter, is_not

from sim.collectives import Algorithm, Collectives
from sim.collectives.direct import EXCHANGE
from sim.engine.copies import Used, collective_copies, transfer_copies
from sim.engine.flows import Lowering
from sim.engine.mirror_placement import halves_apart
from topology.cluster import Cluster
from traces import symmetry
from traces.alltoallv import AllToAllv
from traces.cp_fold import canonical_transfer
from traces.errors import ConfigError
from traces.identity import Partition, partition
from traces.io import check_transfer_sizes
from traces.layout import Layout
from traces.mirror_fold import canonical_mirror, counted_for, mirror_groups, mirror_pairs
from traces.ops import Op, OpKind, Trace
from traces.plan.overlap import peer_copy

MEASURED = "measured"
"""The algorithm of communication that keeps its measured duration (size not stated)."""


@dataclass(frozen=True, slots=True)
class CollectiveKey:
    """A distinct collective: its kind, its group (communicator order), its size; `measured`
    when the trace does not state the size and the op keeps its measured duration; `split`
    an all-to-all's uneven per-peer sizes (`traces.alltoallv`)."""

    kind: OpKind
    group: tuple[int, ...]
    size_bytes: float
    measured: bool = False
    split: AllToAllv | None = None
    exchange: bool = False
    """One step of tp_comm_overlap's peer copies (a ring exchange, AsyncTP's produce): one
    copy from one peer, not the collective its kind and size state
    (`traces.plan.overlap.peer_copy`)."""


@dataclass(frozen=True, slots=True)
class TransferKey:
    """A distinct point-to-point transfer; a send and its receive share it."""

    src: int
    dst: int
    size_bytes: float
    measured: bool = False


CommKey = CollectiveKey | TransferKey


@dataclass(frozen=True, slots=True)
class Lowered:
    """A distinct communication, lowered: the algorithm that runs it ("p2p" for a transfer)
    and its rounds, the folded copies' flows on shared links included."""

    key: CommKey
    algo: str
    lowering: Lowering


@dataclass(frozen=True, slots=True)
class CollectiveChannel:
    """Where collectives on one group meet: the k-th call of each member meets the k-th."""

    group: tuple[int, ...]

    @property
    def ranks(self) -> tuple[int, ...]:
        return self.group


@dataclass(frozen=True, slots=True)
class TransferChannel:
    """Where sends from `src` to `dst` with `tag` meet their receives, in order."""

    src: int
    dst: int
    tag: str

    @property
    def ranks(self) -> tuple[int, ...]:
        return (self.src, self.dst)


Channel = CollectiveChannel | TransferChannel


@dataclass(frozen=True, slots=True)
class CommOp:
    """How one communication op of one rank runs (the fields index into its `CommPlan`)."""

    lowered: int
    """Its lowering: `CommPlan.lowered[lowered]`."""
    channel: int
    """Where it meets its partners: `CommPlan.channels[channel]`."""
    queue: int
    """Its issue counter, one per (channel, rank), which numbers the calls (`CommPlan.calls`)."""
    need: int
    """How many present ranks must arrive; 1 when the rank stands for the whole group (or
    its partners are absent from a partial trace)."""


@dataclass(frozen=True, slots=True)
class CommPlan:
    """Everything the replay needs to know about the plan's communication before it runs."""

    lowered: tuple[Lowered, ...]
    channels: tuple[Channel, ...]
    num_queues: int
    ops: Mapping[int, Mapping[int, CommOp]]
    """Per rank, per op index (communication ops only)."""
    calls: Mapping[int, array[int]]
    """Per rank, per op index, the op's call number k on its channel: its place among the
    rank's calls there in program order (the order the rank issues them, as NCCL numbers
    them), whichever stream reaches it first; call k meets the other members' call k. (0 for
    compute. Not in `CommOp`: equal ops share one.)"""
    algorithms: Mapping[str, int]
    """How many collectives (and transfers, as "p2p") each algorithm runs, counted once each."""


def lower_communication(plan: Trace, cluster: Cluster, fold: Layout | Partition | None, *,
                        algo: Algorithm = Algorithm.AUTO,
                        collectives: Collectives | None = None) -> CommPlan:
    """Lower every communication op of `plan` on `cluster`; `fold` is the layout a folded
    plan was built with (one rank per (cp, pp)), or the classes of a fold by identity
    (`traces.identity`); None: the plan holds every rank it runs."""
    collectives = collectives or Collectives(cluster)
    if isinstance(fold, Layout):
        fold = partition(fold)
    if fold is not None and fold.world > cluster.num_devices:
        f = fold.layout
        raise ConfigError(f"trace: its fold stands for tp {f.tp} x cp {f.cp} x pp "
                          f"{f.pp} x dp {f.dp} = {f.world:,} ranks, more than the "
                          f"{cluster.num_devices:,} accelerators of {cluster.name}")
    for r in plan.ops:
        if not 0 <= r < cluster.num_devices:
            raise ConfigError(f"trace: rank {r} does not exist on {cluster.name} "
                              f"({cluster.num_devices} accelerators)")
    keys, key_of, transfers = _keys(plan, cluster, fold)
    check_transfer_sizes(transfers, "trace")
    lowered = _lower(keys, cluster, collectives, fold, algo)
    members = _Members(plan, fold)
    channels: dict[Channel, int] = {}  # in order of index
    queues: dict[tuple[int, int, bool], int] = {}  # (channel, rank, receives)
    made: dict[tuple[object, ...], tuple[CommOp, str | None]] = {}  # shared by equal ops
    ops: dict[int, dict[int, CommOp]] = {}
    calls: dict[int, array[int]] = {}
    issued: list[int] = []  # per queue, the calls numbered so far
    algorithms: dict[str, int] = {}
    for rank, per_op in key_of.items():  # per_op in op order: program order
        table = ops[rank] = {}
        rank_ops = plan.ops[rank]
        numbers = calls[rank] = array("i", bytes(4 * len(rank_ops)))
        last_k, last_tag, last_kind, found = -1, "", None, None
        for i, k in per_op.items():
            op = rank_ops[i]
            kind = op.kind
            tag = op.tag if kind in _P2P else ""
            if k != last_k or tag != last_tag or kind is not last_kind or found is None:
                # the kind too: folded over CP, a rank sends and receives on one transfer
                found = made.get((k, tag, rank, kind))
                if found is None:
                    found = made[(k, tag, rank, kind)] = _comm_op(
                        rank, kind, tag, k, keys[k], lowered[k].algo, members, channels,
                        queues)
                last_k, last_tag, last_kind = k, tag, kind
            table[i] = found[0]
            queue = found[0].queue
            if queue == len(issued):
                issued.append(0)
            numbers[i] = issued[queue]
            issued[queue] += 1
            if found[1] is not None:  # count each collective once, at its first member
                algorithms[found[1]] = algorithms.get(found[1], 0) + members.counts(keys[k])
    return CommPlan(lowered=tuple(lowered), channels=tuple(channels), num_queues=len(queues),
                    ops=ops, calls=calls, algorithms=algorithms)


def _comm_op(rank: int, kind: OpKind, tag: str, k: int, key: CommKey, algo: str,
             members: _Members, channels: dict[Channel, int],
             queues: dict[tuple[int, int, bool], int]) -> tuple[CommOp, str | None]:
    """The op's CommOp, and the algorithm to count it under if this op counts it."""
    where: Channel
    if isinstance(key, TransferKey):
        where = TransferChannel(key.src, key.dst, tag)
        peer_present = members.stands_in(key.dst if kind is OpKind.SEND else key.src)
        need = 2 if peer_present else 1  # an absent peer mirrors this side
        counted = algo if kind is OpKind.SEND or not peer_present else None
    else:
        present = members.of(key.group)
        if rank not in present:
            raise ConfigError(f"trace: rank {rank} issues {kind} on group "
                              f"{list(key.group)} without being in it")
        where = CollectiveChannel(key.group)
        need, counted = len(present), algo if present[0] == rank else None
    channel = channels.setdefault(where, len(channels))
    queue = queues.setdefault((channel, rank, kind is OpKind.RECV), len(queues))
    return CommOp(lowered=k, channel=channel, queue=queue, need=need), counted


def _keys(plan: Trace, cluster: Cluster, fold: Partition | None = None
          ) -> tuple[list[CommKey], dict[int, dict[int, int]], list[tuple[int, int, Op]]]:
    """Every communication op's key, checked: the distinct keys in order of first use; per
    rank, per op index, the index of its key in that list; and (rank, op index, op) of every
    send and receive. Folded over CP, a receive from an absent CP peer takes the key of the
    representative's own send it mirrors (`traces.cp_fold.canonical_transfer`); so does, with
    DualPipe's mirrors folded, the middle rank's receive from its mirror
    (`traces.mirror_fold`)."""
    over_cp = fold is not None and (fold.cp_step > 0 or fold.mirror)
    n = cluster.num_devices
    keys: list[CommKey] = []
    index: dict[tuple[object, ...], int] = {}
    checked: set[tuple[int, ...]] = set()
    key_of: dict[int, dict[int, int]] = {}
    transfers: list[tuple[int, int, Op]] = []
    last: tuple[object, ...] = (None,) * 6  # the last collective's fields, and its key
    last_k = -1
    canonical: dict[tuple[int, int], tuple[int, int]] = {}
    for rank, ops in plan.ops.items():
        per_op = key_of[rank] = {}
        # the communication ops' indices, found in C (a 1024-GPU plan: 1 op in 7)
        for i in compress(count(), map(is_not, map(_KIND, ops), repeat(OpKind.COMPUTE))):
            op = ops[i]
            kind = op.kind
            if kind in _P2P:
                peer = op.peer
                if not isinstance(peer, int) or not 0 <= peer < n or peer == rank:
                    raise ConfigError(f"trace: rank {rank} {kind} has peer {peer!r}; it must "
                                      f"be another rank of the {n} on {cluster.name}")
                src, dst = (rank, peer) if kind is OpKind.SEND else (peer, rank)
                if over_cp and src not in plan.ops:
                    assert fold is not None
                    pair = canonical.get((src, dst))
                    if pair is None:  # once per (src, dst): a ring's ~10^5 receives, few pairs
                        pair = canonical[(src, dst)] = \
                            canonical_mirror(fold.layout, plan.ops, src, dst) if fold.mirror \
                            else canonical_transfer(fold, src, dst)
                    src, dst = pair
                measured = _measured(op)
                raw: tuple[object, ...] = (src, dst, op.size_bytes, measured)
                k = index.get(raw)
                if k is None:
                    k = index[raw] = len(keys)
                    keys.append(TransferKey(src, dst, op.size_bytes, measured))
                transfers.append((rank, i, op))
            else:
                group, size, split = op.group, op.size_bytes, op.split
                measured = size == 0.0 and op.end is not None  # `_measured(op)`
                exchange = peer_copy(op)
                if group is last[0] and kind is last[1] and size == last[2] and \
                        measured is last[3] and split is last[4] and exchange is last[5]:
                    per_op[i] = last_k  # as the collective before (a TP group's many)
                    continue
                if group not in checked:
                    if len(group) < 2 or not all(0 <= r < n for r in group) or \
                            len(set(group)) != len(group):
                        raise ConfigError(f"trace: rank {rank} {kind} on group {list(group)}; "
                                          f"a group needs two or more distinct ranks of the "
                                          f"{n} on {cluster.name}")
                    checked.add(group)
                raw = (kind, group, size, measured, split, exchange)
                k = index.get(raw)
                if k is None:
                    k = index[raw] = len(keys)
                    keys.append(CollectiveKey(kind, group, size, measured, split, exchange))
                last, last_k = (group, kind, size, measured, split, exchange), k
            per_op[i] = k
    return keys, key_of, transfers


_KIND = attrgetter("kind")
_P2P = frozenset({OpKind.SEND, OpKind.RECV})
"""`OpKind.is_p2p`, without its property's call (per communication op, ~10^5)."""


def _measured(op: Op) -> bool:
    """Communication the trace does not size but has timed: it keeps its measured duration."""
    return op.size_bytes == 0.0 and op.end is not None


def _lower(keys: list[CommKey], cluster: Cluster, collectives: Collectives,
           fold: Partition | None, algo: Algorithm) -> list[Lowered]:
    """Lower every distinct key once; add the folded copies' flows on the links the present
    ranks use (the copies elsewhere mirror them and need no simulation). A measured key
    has no lowering: the replay keeps its op's measured duration."""
    base: list[tuple[str, Lowering]] = []
    for key in keys:
        if key.measured:
            base.append((MEASURED, ()))
        elif isinstance(key, TransferKey):
            base.append(("p2p", collectives.p2p(key.src, key.dst)))
        elif key.exchange:
            exchange = collectives.lowering(key.kind, key.group, EXCHANGE)
            assert exchange is not None
            base.append((EXCHANGE, exchange))
        else:
            base.append(collectives.resolve(key.kind, key.group, key.size_bytes, algo,
                                            split=key.split))
    if fold is None:
        return [Lowered(key, name, lowering) for key, (name, lowering) in zip(keys, base)]
    links: set[int] | None = {link for _, lowering in base for rnd in lowering
                              for flows, _ in rnd for link in flows.links}
    if not getattr(cluster.fabric, "symmetric", True):
        links = None  # hashed routes: each copy's flows collide where its own hash puts them
    used = Used(cluster, links)
    layout, classes, cp_step = fold.layout, fold.rep_of or None, fold.cp_step
    apart = fold.mirror and halves_apart(cluster, layout)  # the mirrors' groups: no copies
    lowered = []
    for key, (name, lowering) in zip(keys, base):
        if key.measured:
            pass
        elif isinstance(key, TransferKey):
            pairs = symmetry.copies(layout, (key.src, key.dst), classes, cp_step)
            if fold.mirror:
                pairs = pairs + mirror_pairs(layout, [(key.src, key.dst), *pairs])
            lowering = transfer_copies(used, lowering, [(a, b) for a, b in pairs],
                                       collectives.p2p)
        else:
            images = symmetry.copies(layout, key.group, classes, cp_step)
            if fold.mirror and not apart:
                images = images + mirror_groups(layout, [key.group, *images])
            lowering = collective_copies(used, key.group, lowering, images,
                                         partial(_copy, collectives, key.kind, name, key.split))
        lowered.append(Lowered(key, name, lowering))
    return lowered


def _copy(collectives: Collectives, kind: OpKind, name: str, split: AllToAllv | None,
          group: tuple[int, ...]) -> Lowering:
    """The flows of algorithm `name` on a folded copy of a group (an uneven all-to-all's
    copy moves the same per-peer sizes, member by member)."""
    copy = collectives.lowering(kind, group, name, split=split)
    assert copy is not None, f"{name} applies to a group but not to its copy {group}"
    return copy


class _Members:
    """The present ranks that must issue a collective on a group: under folding, the
    representatives its members fold onto; of a partial trace, the members it holds (the
    absent ones mirror them)."""

    def __init__(self, plan: Trace, fold: Partition | None) -> None:
        self.present = set(plan.ops)
        self.fold = fold
        self._cache: dict[tuple[int, ...], tuple[int, ...]] = {}
        self._counts: dict[tuple[int, ...], int] = {}

    def has(self, rank: int) -> bool:
        """Whether `rank` is in the trace (a send meets a receive of that very rank)."""
        return rank in self.present

    def stands_in(self, rank: int) -> bool:
        """Whether a transfer's partner `rank` issues its side: it is in the trace, or folded
        over CP its representative is (and mirrors it, `traces.cp_fold`)."""
        fold = self.fold
        if fold is not None and (fold.cp_step or fold.mirror):
            return fold.representative(rank) in self.present
        return rank in self.present

    def counts(self, key: CommKey) -> int:
        """How many collectives of the unfolded run one counted here stands for: 1, or with
        DualPipe's mirrors folded its mirror's too (`traces.mirror_fold.counted_for`)."""
        if self.fold is None or not self.fold.mirror:
            return 1
        if isinstance(key, TransferKey):
            return counted_for(self.fold.layout, None)
        found = self._counts.get(key.group)
        if found is None:  # once per group (a collective's many calls share it)
            found = self._counts[key.group] = counted_for(self.fold.layout, key.group)
        return found

    def of(self, group: tuple[int, ...]) -> tuple[int, ...]:
        found = self._cache.get(group)
        if found is None:
            fold, present = self.fold, self.present
            stand_ins = {fold.representative(r) for r in group} if fold else set(group)
            found = self._cache[group] = tuple(sorted(stand_ins & present))
        return found
