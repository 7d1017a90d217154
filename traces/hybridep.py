"""HybridEP dispatch (`[model] dispatch = "hybridep"`): DeepEP's byte matrix with the NVLink
domain, not the 8-GPU node, as the forwarding unit.

NVIDIA's Hybrid-EP (DeepEP's `hybrid-ep` branch, docs/README_Hybrid-EP.md; Megatron-Core's
`--moe-flex-dispatcher-backend hybridep`, whose buffer takes an `nvlink_domain_size`) is
hierarchical: RDMA between NVLink domains, NVLink (TMA copies) inside one. A token crosses the
network once per destination domain and is forwarded inside it to each GPU holding one of its
experts, once per GPU: the flows of `traces.deepep.deepep_flows` with `domain_of` in place of
the node. The cluster model already makes a server one NVLink domain (a DGX H100/B200 node: 8
GPUs; a GB200/GB300 NVL72 rack: 72, `topology.presets`), so the simulator lowers both with
`Cluster.server_of` (`sim.collectives.deepep`): on NVL72 an EP group inside one rack moves
every byte over NVLink and none over the network, where NCCL's all-to-all would too.
"""

from __future__ import annotations

from collections.abc import Sequence

from traces.deepep import DeepEp, Flow, deepep_flows


def hybridep_flows(d: DeepEp, group: Sequence[int], domain_of: Sequence[int]) -> list[Flow]:
    """Every member's dispatch as HybridEP moves it: network flows to each other NVLink
    domain's relay, NVLink flows inside each domain (`domain_of[j]`: member j's domain)."""
    return deepep_flows(d, group, domain_of)
