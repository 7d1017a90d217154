"""The symmetry of rank groups under folding: which (tp, dp) shifts map a group onto others.

A folded plan holds one rank per (cp, pp) coordinate; its TP peers and DP replicas run the
same program on shifted ranks. `copies` lists the other groups a representative's group
stands for: one image per coset of the group's stabilizer among the tp x dp shifts, found
from the periods of a labelled torus (least rotations, rotation periods and the Chinese
remainder theorem) rather than by trying every shift. Folded by identity (`traces.identity`:
ranks in classes, say a slow node's apart), a copy is an image under a shift that keeps every
member of the group in its class (`copies(..., rep_of=...)`): the slow class's groups stand
for the slow ranks' groups only.

Folded over CP too (`traces.cp_fold`), the cp shifts by multiples of the fold's step join the
tp x dp shifts (`copies(..., cp_step=...)`): a CP ring's transfer stands for the ring's others.

An expert group (EP, ETP, expert-DP: `traces.expert_grid`) need not be mapped onto another by a
shift (TP 1, DP 4, EP 2: the dp shift by one maps [0, 1] onto [1, 2]), so folded by identity
its copies are the other groups of its kind in its stage whose members, position by position,
are in the same classes as its own, and that hold no representative (those run themselves).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import product

from traces.expert_grid import GroupOf, kind_of, stage_groups
from traces.layout import Layout


def copies(layout: Layout, group: tuple[int, ...],
           rep_of: Sequence[int] | None = None, cp_step: int = 0) -> list[tuple[int, ...]]:
    """Images of `group` under every (tp, dp) shift of `layout` that are other sets of ranks
    than it, each given by the first shift (by tp shift, then dp shift) that yields it. Two shifts
    yield the same set when they differ by a shift that maps the group onto itself, so one
    image is built per coset of that stabilizer: O(tp·dp + images · len(group)), where
    trying every shift would cost tp·dp · len(group) (a DP group of 2,048: 8 M shifts).
    With `rep_of` (each rank's class representative), only the shifts that map every member
    into its own class count, and they are tried one by one (a fold by identity, kept for
    layouts that are not uniform); `cp_step`: the fold is over CP too (`traces.cp_fold`), and
    the cp shifts by multiples of it count as well (after the tp x dp shifts)."""
    if rep_of is not None:
        return _class_copies(layout, group, rep_of, cp_step)
    num_tp, num_dp, dp_step = layout.tp, layout.dp, layout.tp * layout.cp
    # rank = base + t + TP·CP·d, with base the rank's (cp, pp) part: what a shift keeps
    parts = []
    for r in group:
        t, d = r % num_tp, (r // dp_step) % num_dp
        parts.append((r - t - dp_step * d, t, d))
    cells: dict[tuple[int, int], set[int]] = {}
    for base, t, d in parts:
        cells.setdefault((t, d), set()).add(base)
    names: dict[tuple[int, ...], int] = {(): 0}
    grid = [[0] * num_dp for _ in range(num_tp)]
    for (t, d), bases in cells.items():
        grid[t][d] = names.setdefault(tuple(sorted(bases)), len(names))
    stabilizer = _periods(grid)
    taken = bytearray(num_tp * num_dp)  # shifts whose image is the group or already listed
    images = []
    for first in [(0, 0), *((dtp, ddp) for dtp in range(num_tp) for ddp in range(num_dp))]:
        dtp, ddp = first
        if taken[dtp * num_dp + ddp]:
            continue
        for htp, hdp in stabilizer:  # the coset of `first`: every shift giving its image
            taken[(dtp + htp) % num_tp * num_dp + (ddp + hdp) % num_dp] = 1
        if first != (0, 0):
            images.append(tuple(base + (t + dtp) % num_tp + dp_step * ((d + ddp) % num_dp)
                                for base, t, d in parts))
    return images

def _class_copies(layout: Layout, group: tuple[int, ...], rep_of: Sequence[int],
                  cp_step: int = 0) -> list[tuple[int, ...]]:
    """`copies` by the shifts that keep each member in its class, tried in the same order
    (an expert group's by its kind's groups, `_grid_copies`); the cp shifts by multiples of
    `cp_step` last, the unshifted cp first."""
    kind = kind_of(layout, group)
    if kind is not None:
        return _grid_copies(layout, group, rep_of, kind)
    num_tp, num_dp, dp_step = layout.tp, layout.dp, layout.tp * layout.cp
    parts = []
    for r in group:
        t, d = r % num_tp, (r // dp_step) % num_dp
        c = (r // num_tp) % layout.cp
        parts.append((r - t - dp_step * d - num_tp * c, t, c, d))
    seen = {frozenset(group)}
    images = []
    for dcp, dtp, ddp in product(range(0, layout.cp, cp_step or layout.cp), range(num_tp),
                                 range(num_dp)):
        image = tuple(base + (t + dtp) % num_tp + num_tp * ((c + dcp) % layout.cp)
                      + dp_step * ((d + ddp) % num_dp) for base, t, c, d in parts)
        if any(rep_of[a] != rep_of[b] for a, b in zip(group, image, strict=True)):
            continue
        as_set = frozenset(image)
        if as_set not in seen:
            seen.add(as_set)
            images.append(image)
    return images


def _grid_copies(layout: Layout, group: tuple[int, ...], rep_of: Sequence[int],
                 kind: GroupOf) -> list[tuple[int, ...]]:
    """The other groups of `kind` in `group`'s stage that stand in its classes position by
    position and hold no representative (module docstring)."""
    classes = [rep_of[r] for r in group]
    return [other for other in stage_groups(layout, kind, group[0])
            if other != group and all(rep_of[r] != r for r in other)
            and [rep_of[r] for r in other] == classes]


def _periods(grid: list[list[int]]) -> list[tuple[int, int]]:
    """Every shift (e, u) with grid[(t + e) % A][(d + u) % B] == grid[t][d] for all t, d (the
    periods of a labelled A x B torus), in O(A·B) for A <= B (transposed otherwise).

    Row t is a rotation of its class's least rotation C: rot(row t, m_t) = C, with
    rot(R, m)[d] = R[(d + m) % B], and m_t fixed modulo C's rotation period p. Shifting rows by
    e and columns by u maps the grid onto itself iff row t + e is in row t's class for every t
    and u = m_(t+e) - m_t (mod p_t) for every t: one congruence per row, joined by the Chinese
    remainder theorem."""
    if len(grid) > len(grid[0]):
        columns = [list(column) for column in zip(*grid, strict=True)]
        return [(e, u) for u, e in _periods(columns)]
    num_rows, width = len(grid), len(grid[0])
    classes: dict[tuple[int, ...], int] = {}
    kind, offset, period = [], [], []
    for row in grid:
        m = _least_rotation(row)
        least = tuple(row[m:] + row[:m])
        kind.append(classes.setdefault(least, len(classes)))
        offset.append(m)
        period.append(_rotation_period(least))
    found = []
    for e in range(num_rows):
        if any(kind[(t + e) % num_rows] != kind[t] for t in range(num_rows)):
            continue
        residue: int | None = 0
        modulus = 1  # u = residue (mod modulus): every u, before the first row
        for t in range(num_rows):
            residue, modulus = _join(residue, modulus,
                                     (offset[(t + e) % num_rows] - offset[t]) % period[t],
                                     period[t])
            if residue is None:
                break
        if residue is not None:
            found += [(e, u) for u in range(residue, width, modulus)]
    return found


def _least_rotation(row: list[int]) -> int:
    """The m whose rotation row[m:] + row[:m] is the least (Duval's Lyndon factorization)."""
    doubled, n = row + row, len(row)
    i = start = 0
    while i < n:
        start, j, k = i, i + 1, i
        while j < 2 * n and doubled[k] <= doubled[j]:
            k = i if doubled[k] < doubled[j] else k + 1
            j += 1
        while i <= k:
            i += j - k
    return start


def _rotation_period(row: tuple[int, ...]) -> int:
    """The least p > 0 with row rotated by p equal to row (it divides len(row)): from the
    longest proper border (Knuth-Morris-Pratt's prefix function)."""
    n = len(row)
    border = [0] * n
    for i in range(1, n):
        k = border[i - 1]
        while k and row[i] != row[k]:
            k = border[k - 1]
        border[i] = k + (row[i] == row[k])
    p = n - border[-1]
    return p if n % p == 0 else n


def _join(r1: int | None, q1: int, r2: int, q2: int) -> tuple[int | None, int]:
    """The u with u = r1 (mod q1) and u = r2 (mod q2), as (residue, modulus); None if none."""
    if r1 is None:
        return None, q1
    g = math.gcd(q1, q2)
    if (r2 - r1) % g:
        return None, q1
    lcm = q1 // g * q2
    k = (r2 - r1) // g * pow(q1 // g, -1, q2 // g) % (q2 // g) if q2 // g > 1 else 0
    return (r1 + q1 * k) % lcm, lcm

