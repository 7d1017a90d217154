"""Real execution of plans with torch.distributed (gloo on CPU, NCCL on GPUs).

The simulator never imports this package eagerly. Its parts, bottom up:

    params       units (head, L<i>, embed), their tensors per TP rank, one seeded init
    kernels      the kernels of docs/plan-ops.md as torch functions over named slots
    tape         one micro-batch's slots and each kernel's autograd state: forward, recompute
                 and backward of one kernel as one call
    calls        the runtime calls a plan lowers to, one per `RankRuntime` operation
    flat         the rank's flat parameter order, gradient buckets, DP shards
    grads        gradient buffers and their DP reduction (ZeRO 0-3), SP gradient sums
    optim        parameters (whole, or ZeRO-3 shards gathered per unit) and AdamW
    routing      MoE: which tokens visit which experts, exactly the plan's counts
    moe          MoE layers' kernels (router ... unpermute) and their EP all-to-alls
    experts      the routed experts' parameters, EP-sharded, reduced over expert-DP
    runtime      RankRuntime: one method per plan op
    reference    the same model in one process with plain autograd, for the tests
    groups       a communicator per (stream, group), created in one order everywhere
    comm         the one door to torch.distributed, recording every call
    recorder     per-op times, clock alignment, measured traces and their files
    consistency  the rules a measured trace must obey
    launch       spawn a local world; timeouts; faults end the job
    torchrun     join the world torchrun started (multi-node), with the same timeouts and faults
    program      a rank's plan lowered to runtime calls, checked before anything runs
    interpreter  runs a rank's program with the plan's stream and dependency semantics
    run          `parasim run`: build, check, launch, record, write (executor.run.run)
    bench        `parasim calibrate --run`: the microbenchmark plan (traces.bench) through the
                 same launcher, communicators, interpreter and recorder (executor.bench.run_bench)
"""
