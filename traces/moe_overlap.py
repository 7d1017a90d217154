"""overlap_moe_comm: Megatron-Core's combined 1F1B (--overlap-moe-expert-parallel-comm).

Megatron-Core runs the forward of one micro-batch and the backward of another as one merged
step (megatron/core/pipeline_parallel/combined_1f1b.py: `combined_forward_backward_step`,
`combined_1f1b_schedule_for_no_pipelining`, `..._for_interleaved_pipelining`), layer by layer,
with the EP all-to-alls on a communication stream of their own beside the other micro-batch's
compute (NVIDIA's user guide "Combined 1F1B: Expert-Parallel All-to-All Overlap",
docs.nvidia.com/megatron-core/developer-guide/nightly/user-guide/features/moe_a2a_overlap.html).
Per layer pair (`TransformerLayerSchedulePlan.run` in
megatron/core/models/common/model_chunk_schedule_plan.py) the streams hold:

    communication                compute
    backward's combine (grad)    forward's attention (and router, permute)
    forward's dispatch           backward's experts
    backward's dispatch (grad)   forward's experts
    forward's combine            backward's attention (and the unpermute before it)

Here: `pairs` picks, in a rank's action list, each forward next to a backward of another
micro-batch (so neither waits for the other); the rest (the warm-up and cool-down actions,
and the first forward with no pipeline) run alone and keep their all-to-alls exposed.
`check_pairs` runs the paired schedule with each pair as one step that needs both inputs
before it starts (Megatron-Core receives both first), refusing a pairing that would deadlock.
Under interleaving Megatron-Core adds one warm-up forward per rank so that a pair's two
actions are independent (`traces.pipeline.interleaved`'s `extra`); with no pipeline its
order F0, (F1 B0), (F2 B1), ..., B(m-1) is 1F1B with one warm-up forward
(`one_f_one_b`'s `extra`), so every pair is a forward then a backward. Within a pair the
forward's layer i runs beside the backward's layer n - 1 - i, whose state is released after
it (TransformerModelChunkSchedulePlan.run, `b_layer.release_state()`): the memory model
(`sim.models.activation_memory.paired_levels`) holds one micro-batch's layers and those the
forward has stored ahead of the backward's frees, not both micro-batches whole. The
plan's reordering of a pair's ops is `traces.plan.moe_overlap`.

Megatron-Core's rules (TransformerConfig.__post_init__): expert_model_parallel_size > 1; with
pipeline_model_parallel_size > 1 a virtual pipeline size must be set; no full recomputation.

The SMs the all-to-all holds beside the other micro-batch's compute (`comm_sms`): a kernel
dispatcher runs its dispatch and combine on a fixed grid of SMs for as long as they move data,
so those SMs are not the compute's. DeepEP's high-throughput kernels take `Buffer.num_sms`
SMs, Megatron-Core's moe_deepep_num_sms, 20 by default; HybridEP's dispatch and combine run
`num_sms_dispatch_api` / `num_sms_combine_api` blocks (deepseek-ai/DeepEP hybrid-ep
deep_ep/hybrid_ep_buffer.py, "Device-SM occupancy setting": `config.num_of_blocks_dispatch_api
= self.num_sms_dispatch_api`, asserted at most the device's SM count), which Megatron-Core sets
from moe_hybridep_num_sms, "Number of SMs to use for HybridEP", 16 by default
(NVIDIA/Megatron-LM megatron/core/transformer/transformer_config.py @002526d:
moe_deepep_num_sms = 20, moe_hybridep_num_sms = 16). NCCL's all-to-all (dispatch "nccl")
holds none of its own: its SMs are the interference model's (`sim.models.sharing`). A recipe
that sets its dispatcher's SMs states `parallel.comm_sms`.

Under `schedule = "dualpipev"` the pairs are DualPipe's own (DeepSeek-V3 technical report,
arXiv 2412.19437, section 3.2.1 and Fig. 4: a forward chunk and a backward chunk of another
micro-batch overlapped, each one's all-to-all beside the other's compute): `dualpipe_pairs`.
"""

from __future__ import annotations

from traces.errors import ConfigError
from traces.layout import Layout, Recompute, Schedule
from traces.model import ModelSpec
from traces.pipeline import Action, ActionSchedule, format_schedule

KEY = "parallel.overlap_moe_comm"
DUALPIPE = (Schedule.DUALPIPEV, Schedule.DUALPIPE)
"""Schedules whose overlapped pairs are DualPipe's (`dualpipe_pairs`), not Megatron-Core's."""
Group = tuple[int, ...]
"""Indices into a rank's actions that run as one overlapped step."""


DEEPSEEK_COMM_SMS = 20
"""SMs DeepSeek-V3 gives its all-to-all kernels beside DualPipe's compute: 20 SMs in 10
communication channels, enough for IB and NVLink at full rate (arXiv 2412.19437, section
3.2.2), 20 of an H800's 132 (section 3.5.1)."""


DISPATCHER_SMS = {"deepep": 20, "hybridep": 16}
"""Megatron-Core's default SMs per kernel dispatcher, moe_deepep_num_sms and
moe_hybridep_num_sms (module docstring); "nccl" holds none of its own."""


def comm_sms(layout: Layout, dispatch: str = "nccl") -> int:
    """The SMs the expert all-to-all holds beside the compute of an overlapped pair
    (`sim.models.reserved_sms`): `layout.comm_sms`, or where it is 0 and overlap_moe_comm is
    on, DeepSeek-V3's 20 under a DualPipe schedule, else the `dispatch` kernels' default grid
    (`DISPATCHER_SMS`), else 0 (NCCL's own SMs, while it moves data, are the interference
    model's, `sim.models.sharing`)."""
    if layout.comm_sms or not layout.overlap_moe_comm:
        return layout.comm_sms
    if layout.schedule in DUALPIPE:
        return DEEPSEEK_COMM_SMS
    return DISPATCHER_SMS.get(dispatch, 0)


def check_moe_overlap(model: ModelSpec, layout: Layout) -> None:
    """Megatron-Core's rules for --overlap-moe-expert-parallel-comm (module docstring)."""
    if not layout.overlap_moe_comm:
        return
    if not model.experts:
        raise ConfigError(f"{KEY}: true needs an MoE model (model.experts > 0): it overlaps "
                          "the expert-parallel all-to-alls")
    if layout.ep < 2:
        raise ConfigError(f"{KEY}: true at ep = {layout.ep} needs ep > 1 (Megatron-Core "
                          "supports it only with expert model parallelism)")
    if layout.pp > 1 and layout.schedule not in (Schedule.INTERLEAVED, *DUALPIPE):
        raise ConfigError(f"{KEY}: true at pp = {layout.pp} needs schedule = \"interleaved\" "
                          "(Megatron-Core requires virtual pipeline stages when pp > 1) or "
                          "\"dualpipev\" / \"dualpipe\" (DualPipe's overlapped pairs)")
    if layout.pp == 1 and layout.schedule not in (Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED):
        raise ConfigError(f"{KEY}: true needs schedule = \"1f1b\" at pp = 1 (Megatron-Core "
                          "pairs one micro-batch's forward with another's backward)")
    if layout.recompute is Recompute.FULL:
        raise ConfigError(f"{KEY}: true with recompute = \"full\" is refused, as "
                          "Megatron-Core refuses it (use \"selective\" or \"none\")")


def pairs(actions: list[Action]) -> list[tuple[int, int]]:
    """(i, i + 1) for each adjacent forward and backward of different micro-batches, scanning
    from the start, an action in one pair at most; none where every forward comes before every
    backward (interleaving with m = pp: all warm-up and cool-down, no steady state)."""
    out: list[tuple[int, int]] = []
    kinds = [a.kind for a in actions]
    if kinds == sorted(kinds, reverse=True):  # "F" > "B"
        return out
    i = 0
    while i + 1 < len(actions):
        a, b = actions[i], actions[i + 1]
        if a.kind != b.kind and a.microbatch != b.microbatch:
            out.append((i, i + 1))
            i += 2
        else:
            i += 1
    return out


def dualpipe_pairs(actions: list[Action]) -> list[Group]:
    """DualPipe's overlapped pairs in a rank's actions (`traces.dualpipev_order`): a forward
    followed by the full backward (its B, then its W) of the rank's other chunk and another
    micro-batch; but not the first such pair of a rank whose two stages are adjacent
    (DualPipeV's last rank, at the V's turn; DualPipe's middle ranks pp/2 - 1 and pp/2, by
    model stage), which deepseek-ai/DualPipe runs without overlap "to further reduce bubble
    size" (dualpipe/dualpipe.py, step 4, the middle ranks, commit bb214e82)."""
    out: list[Group] = []
    for i in range(len(actions) - 2):
        f, b, w = actions[i], actions[i + 1], actions[i + 2]
        if (f.kind, b.kind, w.kind) == ("F", "B", "W") and f.stage != b.stage \
                and f.microbatch != b.microbatch and (w.stage, w.microbatch) == (
                    b.stage, b.microbatch):
            out.append((i, i + 1, i + 2))
    stages = {a.stage for a in actions}
    if out and max(stages) - min(stages) == 1:  # the V's turn
        out.pop(0)
    return out


def groups(schedule: Schedule, actions: list[Action]) -> list[Group]:
    """The overlapped steps of a rank's actions under `schedule`: DualPipe's pairs, or
    Megatron-Core's (`pairs`)."""
    return dualpipe_pairs(actions) if schedule in DUALPIPE else list(pairs(actions))


def steps(actions: list[Action], schedule: Schedule = Schedule.ONE_F_ONE_B
          ) -> list[tuple[Action, ...]]:
    """The rank's actions as the steps it runs: a group, or one action alone."""
    grouped = {g[0]: g for g in groups(schedule, actions)}
    out: list[tuple[Action, ...]] = []
    i = 0
    while i < len(actions):
        g = grouped.get(i, (i,))
        out.append(tuple(actions[j] for j in g))
        i = g[-1] + 1
    return out


def check_pairs(schedule: ActionSchedule, num_stages: int,
                name: Schedule = Schedule.ONE_F_ONE_B) -> None:
    """The paired schedule runs to the end when a step starts once every input of its actions
    exists and yields its outputs when it ends (lock-step rounds, as
    `traces.pipeline.validate`); ConfigError naming the rank that cannot move."""
    ranks = {r: steps(actions, name) for r, actions in schedule.items()}
    done: set[tuple[int, str, int]] = set()
    cursor = dict.fromkeys(ranks, 0)

    def inputs(a: Action) -> list[tuple[int, str, int]]:
        if a.kind == "W":
            return []  # its B: earlier, or in the same step
        if a.kind == "F":
            return [(a.stage - 1, "F", a.microbatch)] if a.stage > 0 else []
        later = [(a.stage + 1, "B", a.microbatch)] if a.stage < num_stages - 1 else []
        return [(a.stage, "F", a.microbatch), *later]

    while any(cursor[r] < len(s) for r, s in ranks.items()):
        ready = [(r, s[cursor[r]]) for r, s in ranks.items() if cursor[r] < len(s)
                 and all(n in done for a in s[cursor[r]] for n in inputs(a))]
        if not ready:
            r = min(r for r, s in ranks.items() if cursor[r] < len(s))
            first = sum(len(step) for step in ranks[r][:cursor[r]])
            raise ConfigError(f"{KEY}: the paired forward and backward steps deadlock "
                              "(no rank can run its next step)\n"
                              + format_schedule(schedule, mark=(r, first)))
        for r, step in ready:
            done.update((a.stage, a.kind, a.microbatch) for a in step)
            cursor[r] += 1
