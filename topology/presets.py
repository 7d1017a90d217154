"""Node types with public figures. Every number cites where it comes from.

Units are SI: bytes, bytes/s, FLOP/s, seconds. NVLink figures are per GPU *per direction*
(data sheets quote both directions added). Memory is what `nvidia-smi` reports as total.
Links carry their line rate times an efficiency for protocol overhead (measured, cited below):
the graph's `bandwidth` is what data flows can actually use.

Latencies are not on data sheets; they follow NCCL's own cost model (src/graph/tuning.cc,
`hwLat`, LL protocol): 0.47 us per NVLink ring step, which we split over the two links of a
GPU->NVSwitch->GPU hop, and 2.7 us per inter-node step, which we split into 1.0 us of PCIe and
NIC processing at each end and 0.2 us per switch hop (about 130 ns port-to-port on Mellanox
Quantum switches, plus cable).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from topology.cluster import Accelerator
from topology.power_studies import H100_LLAMA3_8B_PRETRAIN
from topology.server import ServerSpec

NVLINK_LINK_LATENCY_S = 0.235e-6  # half of NCCL's 0.47 us NVLink ring step
# NVLink carries ~80% of its line rate as data: "450GB/s is the line rate. With the protocol
# overhead (~20%) NCCL can get an effective NVLink bandwidth of 370GB/s" (NCCL maintainer,
# NVIDIA/nccl-tests#212); on A100 NCCL's own model caps bus bandwidth at 235 of 300 GB/s
# (src/graph/tuning.cc) and nccl-tests users report ~200-230 GB/s (nccl-tests#149, #178).
NVLINK_EFFICIENCY = 370 / 450
# NVLink 5 (Blackwell) is not NVLink 4: NCCL's topology model gives each link the data rate
# SM100_NVLINK_BW = 40.1 GB/s against SM90_NVLINK_BW = 20.6 (NVIDIA/nccl src/graph/topo.h,
# `ncclTopoNVLinkBw`, cudaCompCap >= 100, 2.2x-era releases with C2C/PXN paths). Over the 50 GB/s
# a direction of an NVLink 5 link that is 40.1 / 50 = 0.802 (NVLink 4: 20.6 / 25 = 0.824, within
# 0.3% of NVLINK_EFFICIENCY above, the same mechanism).
NVLINK5_EFFICIENCY = 40.1 / 50
# InfiniBand: 4 HDR NICs for 8 GPUs peak at 96 GB/s of 100 in nccl-tests (nccl-tests#119).
IB_EFFICIENCY = 0.96
PCIE_NIC_LATENCY_S = 1.0e-6  # PCIe + NIC, each end of an inter-node hop
SWITCH_HOP_LATENCY_S = 0.2e-6  # ~130 ns switch port-to-port + cable

# Exponentials a clock an SM (MUFU.EX2 on the special-function units, which run softmax's exp):
# 16 on Hopper and Blackwell alike, "the SFU count ... remains unchanged" from H100 to B200
# while BF16 tensor throughput goes from 1 to 2.25 PFLOPs (FlashAttention-4, Zadouri, Dao et
# al., arXiv 2603.05451, and its Together AI blog: MUFU at 16 operations a clock an SM); twice
# that on Blackwell Ultra, which "doubles SFU throughput" ("Inside NVIDIA Blackwell Ultra" and
# "Making Softmax More Efficient with NVIDIA Blackwell Ultra", NVIDIA developer blog: SFU EX2
# 10.7 TeraExponentials/s against Blackwell's 5; its MUFU.EX2 benchmark measured 10,024 against
# 4,943 Gop/s on GB300 and GB200, i.e. 32 x 160 SMs at 1958 MHz and 16 x 148 at 2087 MHz).
HOPPER_BLACKWELL_EXP_PER_CLOCK = 16
BLACKWELL_ULTRA_EXP_PER_CLOCK = 2 * HOPPER_BLACKWELL_EXP_PER_CLOCK

A100_80GB = Accelerator(
    name="A100-SXM4-80GB",
    peak_flops=312e12,  # A100 data sheet: BF16 tensor core 312 TFLOPS dense (624 sparse)
    memory_bytes=81920 * 2**20,  # nvidia-smi: 81920 MiB
    hbm_bandwidth_Bps=2039e9,  # A100 80GB SXM data sheet: 2,039 GB/s HBM2e
    compute_units=108,  # NVIDIA A100 Tensor Core GPU Architecture whitepaper: 108 SMs
    # 108 SMs x 2048 dense FLOP/clk x 1410 MHz boost = 312 TFLOP/s (the whitepaper's count)
    peak_clock_MHz=1410,
    # NVIDIA's HPL Rpeak for A100 systems uses 1305 MHz, "the clock that can be sustained at a
    # GPU's power limit while running HPL" (G. Lockwood, "Peak FLOPS", glennklockwood.com):
    # sustained 312 x 1305/1410 = 288.8 TFLOP/s
    sustained_clock_MHz=1305,
    # A100 whitepaper: 64 INT32 lanes per SM (the CUDA C++ Programming Guide's throughput table
    # for compute capability 8.0: 64 32-bit integer adds, multiplies and logic ops per clock
    # per SM): 108 x 64 x 1305 MHz
    int32_ops_per_s=108 * 64 * 1305e6,
)
H100_SXM = Accelerator(
    name="H100-SXM5-80GB",
    peak_flops=989.4e12,  # H100 SXM data sheet: BF16 1,979 TFLOPS with sparsity, half dense
    memory_bytes=81559 * 2**20,  # nvidia-smi: 81559 MiB
    hbm_bandwidth_Bps=3.35e12,  # H100 SXM data sheet: 3.35 TB/s HBM3
    compute_units=132,  # NVIDIA H100 Tensor Core GPU Architecture whitepaper: 132 SMs (SXM5)
    peak_flops_fp8=1978.9e12,  # H100 SXM data sheet: FP8 3,958 TFLOPS with sparsity, half dense
    # 132 SMs x 4096 dense FLOP/clk x 1830 MHz = 989.4 TFLOP/s (Lockwood, "H100": 1.83 GHz for
    # low precision, 1.98 GHz boost)
    peak_clock_MHz=1830,
    # mamf-finder's sustained (MSMF) run on 8 H200s, every GPU busy, 700 W: the saturated SM
    # clock 1405-1527 MHz, ~1440-1465 alone (stas00/ml-engineering, compute/accelerator/
    # benchmarks); the H100 SXM is the same die at the same 700 W: 989.4 x 1450/1830 = 784
    sustained_clock_MHz=1450,
    # H100 whitepaper: 64 INT32 lanes per SM (the CUDA guide's table for compute capability
    # 9.0 likewise): 132 x 64 x 1450 MHz
    int32_ops_per_s=132 * 64 * 1450e6,
    exp_per_clock=HOPPER_BLACKWELL_EXP_PER_CLOCK,  # FlashAttention-4: 16 (see above)
)
H200_SXM = Accelerator(
    name="H200-SXM-141GB",
    peak_flops=989.4e12,  # H200 data sheet: BF16 1,979 TFLOPS with sparsity, half dense
    memory_bytes=143771 * 2**20,  # nvidia-smi: 143771 MiB (141 GB usable HBM3e)
    hbm_bandwidth_Bps=4.8e12,  # H200 data sheet: 4.8 TB/s HBM3e
    compute_units=132,  # the H100 SXM5 die: 132 SMs
    peak_flops_fp8=1978.9e12,  # H200 data sheet: FP8 3,958 TFLOPS with sparsity, half dense
    peak_clock_MHz=1830,  # as H100 SXM: 989.4 TFLOP/s at 1830 MHz
    sustained_clock_MHz=1450,  # measured on H200 (mamf-finder MSMF, 8 GPUs busy): see H100
    int32_ops_per_s=132 * 64 * 1450e6,  # as H100 SXM: 64 INT32 lanes per SM
    exp_per_clock=HOPPER_BLACKWELL_EXP_PER_CLOCK,  # the H100 die's SFUs
)
# Blackwell. Data sheets quote FP8 and BF16 "with sparsity"; dense is half. MXFP8 block scaling
# is Blackwell's (fifth-generation tensor cores take E8M0 block scales, TE's MXFP8BlockScaling).
# Tensor clocks: B200 1.86 GHz, GB200 2.06 GHz (hmc-tech.com's B200 and GB200 spec tables):
# 148 SMs x 8192 dense BF16 FLOP/clk x 1860 MHz = 2.255 PF, x 2062 MHz = 2.5 PF, the data
# sheets' dense figures.
B200_SUSTAINED_RATIO = 1365 / 1860
"""mamf-finder's sustained (MSMF) run on 8 busy B200s held the SM clock at 1316-1410 MHz,
1426 TFLOP/s (stas00/ml-engineering, compute/accelerator/benchmarks): 1365 of 1860 MHz."""
B200 = Accelerator(
    name="B200-SXM-180GB",
    # DGX B200 data sheet: 72 PFLOPS FP8 training for 8 GPUs = 9 PF each with sparsity, 4.5 PF
    # dense; BF16 half of FP8: 2.25 PF dense (NVIDIA Blackwell architecture technical brief).
    peak_flops=2.25e15,
    peak_flops_fp8=4.5e15,
    # HGX B200 spec (nvidia.com/data-center/hgx, its Blackwell GPU column beside GB200 NVL72's):
    # FP4 Tensor Core 18 PFLOPS a GPU with sparsity (144 for 8), half of it dense
    peak_flops_fp4=9e15,
    fp8_block_scaling=True,
    memory_bytes=180e9,  # DGX B200 data sheet: 1,440 GB HBM3e for 8 GPUs
    hbm_bandwidth_Bps=8e12,  # DGX B200 data sheet: 64 TB/s HBM3e for 8 GPUs
    compute_units=148,  # Blackwell architecture technical brief: 148 SMs on B200 (2 dies)
    peak_clock_MHz=1860,  # the tensor clock (hmc-tech.com B200 spec table), see above
    sustained_clock_MHz=1365,  # B200_SUSTAINED_RATIO's measurement (sim.models.rates.B200)
    # no published Blackwell SM breakdown: an assumption, Hopper's 64 INT32 lanes per SM
    int32_ops_per_s=148 * 64 * 1365e6,
    exp_per_clock=HOPPER_BLACKWELL_EXP_PER_CLOCK,  # FlashAttention-4: 16 (see above)
)
GB200 = Accelerator(
    name="GB200-186GB",
    # GB200 NVL72 spec (nvidia.com/data-center/gb200-nvl72): FP8 720 PFLOPS and FP16/BF16 360
    # PFLOPS with sparsity for 72 GPUs: 10 and 5 PF each, half of it dense. Clocked higher than
    # B200 (1.2 kW against 1 kW TDP).
    peak_flops=2.5e15,
    peak_flops_fp8=5e15,
    # GB200 NVL72 spec: FP4 Tensor Core 1,440 PFLOPS with sparsity for 72 GPUs (20 PF each),
    # half of it dense
    peak_flops_fp4=10e15,
    fp8_block_scaling=True,
    memory_bytes=186e9,  # GB200 NVL72 spec: 13.4 TB HBM3e for 72 GPUs
    hbm_bandwidth_Bps=8e12,  # GB200 NVL72 spec: 576 TB/s for 72 GPUs
    compute_units=148,  # the B200 die pair: 148 SMs
    peak_clock_MHz=2062,  # the tensor clock (hmc-tech.com GB200 spec table), see above
    # no published soak measurement of GB200: an assumption, B200's measured sustained ratio
    sustained_clock_MHz=round(2062 * B200_SUSTAINED_RATIO),
    # an assumption as B200's: 64 INT32 lanes per SM, at the sustained clock
    int32_ops_per_s=148 * 64 * round(2062 * B200_SUSTAINED_RATIO) * 1e6,
    exp_per_clock=HOPPER_BLACKWELL_EXP_PER_CLOCK,  # B200's die pair
)
H100_96GB = Accelerator(
    name="H100-SXM5-96GB",
    # torchtitan (Liang et al., arXiv 2410.06511, and its docs/performance.md): Meta's Grand
    # Teton H100s, "96GB HBM2e with 2.4 TB/sec peak memory bandwidth", "the default 500W power
    # limit"; the paper: "non-standard ... HBM2e and ... limited to a lower TDP". The H100 die.
    peak_flops=989.4e12,  # as H100 SXM: 132 SMs x 4096 dense FLOP/clk x 1830 MHz
    memory_bytes=96e9,  # torchtitan docs/performance.md: 96GB HBM2e
    hbm_bandwidth_Bps=2.4e12,  # torchtitan docs/performance.md: 2.4 TB/sec
    compute_units=132,  # the H100 SXM5 die: 132 SMs
    peak_flops_fp8=1978.9e12,  # as H100 SXM: FP8 dense twice BF16
    peak_clock_MHz=1830,  # as H100 SXM
    # its 500 W TDP by the one rule (topology.power): H100's 1450 MHz at 700 W times the rate an
    # H100 HBM2e keeps at a 500 W cap in bf16 LLM training, 27,705.3 of 30,271.0 tokens/s (Mayr
    # et al., arXiv 2603.16164, Table 4; topology.power_studies): 1327.1 MHz
    sustained_clock_MHz=H100_SXM.sustained_clock_MHz * H100_LLAMA3_8B_PRETRAIN.ratio(500.0),
    # as H100 SXM: 64 INT32 lanes per SM, at that clock
    int32_ops_per_s=132 * 64 * H100_SXM.sustained_clock_MHz
    * H100_LLAMA3_8B_PRETRAIN.ratio(500.0) * 1e6,
    exp_per_clock=HOPPER_BLACKWELL_EXP_PER_CLOCK,  # the H100 die's SFUs
)
# Blackwell Ultra (B300): NVIDIA's "Inside NVIDIA Blackwell Ultra" (developer blog, 2025):
# 160 SMs over two dies, 288 GB HBM3e, 8 TB/s. BF16 per clock as Blackwell's 8192 dense FLOP a
# clock an SM (B200 above), so a dense peak implies its tensor clock: peak / (160 x 8192).
B300 = Accelerator(
    name="B300-SXM-288GB",
    # DGX B300 data sheet: 72 PFLOPS FP8 training for 8 GPUs = 9 PF each with sparsity, 4.5 PF
    # dense; BF16 half of FP8: 2.25 PF dense (FP4: 144 PF sparse, 108 PF dense for 8 GPUs)
    peak_flops=2.25e15,
    peak_flops_fp8=4.5e15,
    peak_flops_fp4=108e15 / 8,  # DGX B300 data sheet: FP4 108 PFLOPS dense for 8 GPUs
    fp8_block_scaling=True,
    memory_bytes=288e9,  # DGX B300 data sheet: 2.3 TB HBM3e for 8 GPUs (288 GB each)
    hbm_bandwidth_Bps=8e12,  # Blackwell Ultra blog: 8 TB/s HBM3e per GPU
    compute_units=160,  # Blackwell Ultra blog: 160 SMs
    peak_clock_MHz=2.25e15 / (160 * 8192) / 1e6,  # 1716.6 MHz: the dense BF16 peak's clock
    # no published soak measurement of B300: an assumption, B200's measured sustained ratio
    sustained_clock_MHz=2.25e15 / (160 * 8192) / 1e6 * B200_SUSTAINED_RATIO,
    # an assumption as B200's: 64 INT32 lanes per SM, at the sustained clock
    int32_ops_per_s=160 * 64 * 2.25e15 / (160 * 8192) * B200_SUSTAINED_RATIO,
    exp_per_clock=BLACKWELL_ULTRA_EXP_PER_CLOCK,  # Blackwell Ultra blog: twice (see above)
)
GB300 = Accelerator(
    name="GB300-288GB",
    # GB300 NVL72 spec (nvidia.com/data-center/gb300-nvl72): FP8 720 PFLOPS and FP16/BF16 360
    # PFLOPS with sparsity for 72 GPUs: 10 and 5 PF each, half of it dense (FP4: 1,080 PF dense)
    peak_flops=2.5e15,
    peak_flops_fp8=5e15,
    # GB300 NVL72 spec: FP4 Tensor Core 1,080 PFLOPS dense for 72 GPUs (1,440 with sparsity);
    # "15 petaFLOPS dense NVFP4" a GPU, Blackwell Ultra blog
    peak_flops_fp4=1080e15 / 72,
    fp8_block_scaling=True,
    memory_bytes=288e9,  # GB300 NVL72 spec: 288 GB HBM3e per GPU (20 TB for 72)
    hbm_bandwidth_Bps=8e12,  # GB300 NVL72 spec: 576 TB/s for 72 GPUs
    compute_units=160,  # Blackwell Ultra blog: 160 SMs
    peak_clock_MHz=2.5e15 / (160 * 8192) / 1e6,  # 1907.3 MHz: the dense BF16 peak's clock
    # no published soak measurement of GB300: an assumption, B200's measured sustained ratio
    sustained_clock_MHz=2.5e15 / (160 * 8192) / 1e6 * B200_SUSTAINED_RATIO,
    # an assumption as B200's: 64 INT32 lanes per SM, at the sustained clock
    int32_ops_per_s=160 * 64 * 2.5e15 / (160 * 8192) * B200_SUSTAINED_RATIO,
    exp_per_clock=BLACKWELL_ULTRA_EXP_PER_CLOCK,  # Blackwell Ultra blog: twice (see above)
)
TPU_V4 = Accelerator(
    name="TPU-v4",
    peak_flops=275e12,  # Cloud TPU v4 docs: 275 TFLOPS bf16 per chip
    memory_bytes=32 * 2**30,  # Cloud TPU v4 docs: 32 GiB HBM2
    hbm_bandwidth_Bps=1200e9,  # Cloud TPU v4 docs: 1200 GBps
    compute_units=8,  # Cloud TPU v4 docs: 2 TensorCores of 4 MXUs (128x128 systolic arrays)
    # TPU v4 (Jouppi et al., ISCA'23, Table 1): one clock, 1050 MHz, no boost above it:
    # 8 MXUs x 128x128 x 2 FLOPs x 1050 MHz = 275 TFLOP/s, and sustained at the same clock
    peak_clock_MHz=1050,
    sustained_clock_MHz=1050,  # the one clock: a TPU has no boost to fall back from
    # int32_ops_per_s left 0: XLA draws random bits on the vector units, whose integer rate
    # Google does not publish (so dropout's draws cost nothing on a TPU here)
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Preset:
    """A node type and the fabric it usually sits on."""

    name: str
    accelerator: Accelerator
    server: ServerSpec
    fabric: str
    """Default fabric: 'fat-tree', 'rail' or 'torus'."""
    switch_radix: int = 0
    """Ports per fabric switch (sets the default servers per leaf)."""
    switch_latency_s: float = SWITCH_HOP_LATENCY_S
    torus_dims: tuple[int, ...] = ()
    ici_Bps: float = 0.0
    ici_latency_s: float = 0.0
    max_nodes: int = 0
    """Most servers the preset can describe (0: no limit)."""
    max_gpus_per_node: int = 0
    """Most accelerators per server (0: no limit)."""


DGX_A100 = Preset(
    name="dgx-a100",
    accelerator=A100_80GB,
    server=ServerSpec(
        gpus=8,
        nvlink_Bps=300e9,  # NVLink3: 12 links x 25 GB/s per direction (600 GB/s both ways)
        nvlink_efficiency=NVLINK_EFFICIENCY,
        nvlink_latency_s=NVLINK_LINK_LATENCY_S,
        nics=8,  # DGX A100 data sheet: 8x single-port ConnectX-6 for compute traffic
        nic_Bps=200e9 / 8,  # HDR InfiniBand 200 Gb/s
        nic_efficiency=IB_EFFICIENCY,
        pcie_Bps=32e9,  # PCIe 4.0 x16: 16 GT/s x 16 lanes, 128b/130b -> ~31.5 GB/s per direction
        pcie_latency_s=PCIE_NIC_LATENCY_S,
    ),
    fabric="fat-tree",
    switch_radix=40,  # Quantum QM8700 HDR switch: 40 ports of 200 Gb/s
)

DGX_H100 = Preset(
    name="dgx-h100",
    accelerator=H100_SXM,
    server=ServerSpec(
        gpus=8,
        nvlink_Bps=450e9,  # NVLink4: 18 links x 25 GB/s per direction (900 GB/s both ways)
        nvlink_efficiency=NVLINK_EFFICIENCY,
        nvlink_latency_s=NVLINK_LINK_LATENCY_S,
        nics=8,  # DGX H100 data sheet: 8x single-port ConnectX-7 (OSFP) for compute traffic
        nic_Bps=400e9 / 8,  # NDR InfiniBand 400 Gb/s
        nic_efficiency=IB_EFFICIENCY,
        pcie_Bps=64e9,  # PCIe 5.0 x16: 32 GT/s x 16 lanes -> ~63 GB/s per direction
        pcie_latency_s=PCIE_NIC_LATENCY_S,
    ),
    fabric="fat-tree",
    switch_radix=64,  # Quantum-2 QM9700 NDR switch: 64 ports of 400 Gb/s
)

DGX_H200 = Preset(
    name="dgx-h200",
    accelerator=H200_SXM,
    server=DGX_H100.server,  # DGX H200: same NVLink4 / 8x ConnectX-7 NDR system design
    fabric="fat-tree",
    switch_radix=64,  # Quantum-2 QM9700
)

DGX_B200 = Preset(
    name="dgx-b200",
    accelerator=B200,
    server=ServerSpec(
        gpus=8,
        # NVLink 5: 18 links x 50 GB/s per direction (1.8 TB/s both ways; DGX B200 data sheet:
        # 14.4 TB/s aggregate for 8 GPUs); NVLink 5's data rate in NCCL's model.
        nvlink_Bps=900e9,
        nvlink_efficiency=NVLINK5_EFFICIENCY,
        nvlink_latency_s=NVLINK_LINK_LATENCY_S,
        nics=8,  # DGX B200 data sheet: 8x single-port ConnectX-7 VPI, up to 400 Gb/s
        nic_Bps=400e9 / 8,
        nic_efficiency=IB_EFFICIENCY,
        pcie_Bps=64e9,  # PCIe 5.0 x16 to the NICs (DGX B200 data sheet)
        pcie_latency_s=PCIE_NIC_LATENCY_S,
    ),
    fabric="fat-tree",
    switch_radix=64,  # Quantum-2 QM9700 NDR switch: 64 ports of 400 Gb/s
)

# One GB200 NVL72 rack is one "server": 72 GPUs on one NVLink domain (18 NVLink 5 links per
# GPU to nine NVLink Switch trays, modelled as one crossbar as the NVSwitches of a DGX are), so
# TP, CP and EP groups up to 72 stay on NVLink; racks are joined by the InfiniBand fabric, one
# 400 Gb/s ConnectX-7 per GPU (GB200 NVL72 reference design: four per compute tray of four
# GPUs). The NVLink hop crosses a switch tray: NCCL's per-step NVLink latency is kept.
GB200_NVL72 = Preset(
    name="gb200-nvl72",
    accelerator=GB200,
    server=ServerSpec(
        gpus=72,
        nvlink_Bps=900e9,  # GB200 NVL72 spec: 130 TB/s for 72 GPUs = 1.8 TB/s each, both ways
        nvlink_efficiency=NVLINK5_EFFICIENCY,
        nvlink_latency_s=NVLINK_LINK_LATENCY_S,
        nics=72,
        nic_Bps=400e9 / 8,
        nic_efficiency=IB_EFFICIENCY,
        pcie_Bps=64e9,  # PCIe 5.0 x16 from each GPU's NIC
        pcie_latency_s=PCIE_NIC_LATENCY_S,
    ),
    fabric="fat-tree",
    switch_radix=64,  # Quantum-2 QM9700 NDR
)

# DeepSeek-V3's cluster (technical report §3.1): H800 nodes of 8 GPUs on NVLink and NVSwitch,
# InfiniBand across nodes, "eight 400G Infiniband (IB) CX7 NICs" a node (Zhao et al., "Insights
# into DeepSeek-V3", ISCA'25). The H800 SXM is the H100 SXM die, data sheet figures for BF16 and
# FP8 and HBM3 unchanged, with NVLink cut to 400 GB/s both ways (8 of NVLink 4's 18 links).
DGX_H800 = Preset(
    name="dgx-h800",
    accelerator=H100_SXM,
    server=dataclasses.replace(DGX_H100.server, nvlink_Bps=200e9),  # 8 links x 25 GB/s a way
    fabric="fat-tree",
    switch_radix=64,  # Quantum-2 QM9700 NDR switch: 64 ports of 400 Gb/s
)
# torchtitan's cluster (docs/performance.md): Grand Teton hosts of 8 H100s "fully connected
# with NVLink" (NVLink 4, as DGX H100), "400 Gb/s per GPU" RDMA between hosts, 500 W GPUs.
H100_96GB_POD = Preset(
    name="h100-96gb",
    accelerator=H100_96GB,
    server=DGX_H100.server,
    fabric="fat-tree",
    switch_radix=64,  # not stated (a RoCE fabric): Quantum-2's 64 ports of 400 Gb/s assumed
)
# Blackwell Ultra. DGX B300 data sheet: NVLink 5, 14.4 TB/s aggregate for 8 GPUs (1.8 TB/s each
# both ways), "8x OSFP ports serving 8x single-port NVIDIA ConnectX-8 VPI, up to 800Gb/s".
DGX_B300 = Preset(
    name="dgx-b300",
    accelerator=B300,
    server=dataclasses.replace(DGX_B200.server, nic_Bps=800e9 / 8),  # ConnectX-8: 800 Gb/s
    fabric="fat-tree",
    switch_radix=144,  # Quantum-X800 Q3400 XDR switch: 144 ports of 800 Gb/s
)
# GB300 NVL72 spec: 72 GPUs on one NVLink 5 domain, 130 TB/s (1.8 TB/s each both ways), and a
# ConnectX-8 SuperNIC of 800 Gb/s per GPU; one rack is one "server" as GB200 NVL72's.
GB300_NVL72 = Preset(
    name="gb300-nvl72",
    accelerator=GB300,
    server=dataclasses.replace(GB200_NVL72.server, nic_Bps=800e9 / 8),
    fabric="fat-tree",
    switch_radix=144,  # Quantum-X800 Q3400 XDR switch: 144 ports of 800 Gb/s
)

TPU_V4_POD = Preset(
    name="tpu-v4",
    accelerator=TPU_V4,
    server=ServerSpec(  # a TPU v4 host: 4 chips; chips talk over ICI only
        gpus=4, nvlink_Bps=0.0, nvlink_latency_s=0.0, nics=0, nic_Bps=0.0, pcie_Bps=0.0,
        pcie_latency_s=0.0,
    ),
    fabric="torus",
    torus_dims=(4, 4, 4),  # one TPU v4 cube: 4x4x4 chips, the unit the optical switches join
    # TPU v4 (ISCA'23) and Cloud docs: 6 ICI links per chip at 50 GB/s per direction; consistent
    # with the docs' 1.1 PB/s all-reduce bandwidth per 4096-chip pod (~270 GB/s per chip).
    ici_Bps=50e9,
    ici_latency_s=1.0e-6,  # assumption: not published; order of one NIC-less hop
)

# The machine at hand: up to 8 ranks as processes on one host (whatever its core count),
# talking gloo over loopback TCP, computing on the CPU in fp32. Rough figures, to be replaced by
# measured ones (`parasim calibrate` writes a profile whose links and compute parameters
# override these): one core's AVX2 FMA peak is 2 units x 8 fp32 lanes x 2 FLOPs x ~3 GHz =
# ~96 GFLOP/s, of which a BLAS reaches about half; DDR4 gives a core ~10 GB/s; gloo over
# loopback moves ~2 GB/s per pair with tens of microseconds per message.
CPU_LOCALHOST = Accelerator(
    name="CPU-localhost",
    peak_flops=50e9,
    memory_bytes=3 * 2**30,  # 24 GiB shared by 8 processes
    hbm_bandwidth_Bps=10e9,
    compute_units=1,
)
LOCALHOST = Preset(
    name="localhost",
    accelerator=CPU_LOCALHOST,
    server=ServerSpec(gpus=8, nvlink_Bps=2e9, nvlink_latency_s=10e-6, nics=0, nic_Bps=0.0,
                      pcie_Bps=0.0, pcie_latency_s=0.0, link_kind="loopback"),
    fabric="rail",
    max_nodes=1,
    max_gpus_per_node=8,
)

PRESETS: dict[str, Preset] = {p.name: p for p in (
    DGX_A100, DGX_H100, DGX_H200, DGX_B200, GB200_NVL72, DGX_H800, H100_96GB_POD, DGX_B300,
    GB300_NVL72, TPU_V4_POD, LOCALHOST)}
