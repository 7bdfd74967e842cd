"""Collectives priced by the link the GPUs share: NVLink, PCIe with or without peer-to-peer, a NIC.

The PCIe figures are checked against published nccl-tests and kernel measurements of PCIe-only cards (sources in
planner/perf/step.py and benchmarks/README.md, "Communication over PCIe")."""

from dataclasses import replace

import pytest

from servingtopology.planner.errors import InvalidSpec
from servingtopology.planner.hardware import Link, Precision, gpu_catalog, pcie_gbps, resolve_gpu
from servingtopology.planner.layout import Engine, KvDtype
from servingtopology.planner.model.catalog import resolve_model
from servingtopology.planner.perf.step import allreduce_s, perf_params, step_time_s

PRO6000 = resolve_gpu("rtx_pro_6000")
RTX4090 = resolve_gpu("rtx_4090")

# (GPU, GPUs in the group, bytes per GPU, measured µs, where it was published)
PUBLISHED_SMALL_ALLREDUCE = [
    (resolve_gpu("rtx_pro_6000", gpus_per_node=16), 16, 7168 * 2, 36.07, "local-inference-lab/b12x PR #139, NCCL, M=1"),
    (PRO6000, 8, 1024, 24.1, "voipmonitor/rtx6kpro pcie-bandwidth.md, NCCL 1 KB"),
    (PRO6000, 4, 4096 * 2, 8.31 + 13.61, "flashinfer-ai/flashinfer PR #5023, NCCL RS + AG, one row of 4096"),
    (RTX4090, 8, 8, 42.14, "NVIDIA/nccl issue #1530, all_reduce_perf 8 B"),
    (RTX4090, 2, 8, 2 * 11.87, "tinygrad/open-gpu-kernel-modules issue #17: two alltoall exchanges of 8 B, P2P off"),
]


def test_the_catalog_names_each_cards_link():
    assert resolve_gpu("h100_sxm").scaleup_link is Link.NVLINK
    assert PRO6000.scaleup_link is Link.PCIE_P2P
    assert RTX4090.scaleup_link is Link.PCIE_HOST and resolve_gpu("l40s").scaleup_link is Link.PCIE_HOST
    assert RTX4090.pcie_gbps == pytest.approx(31.5, abs=0.1) and PRO6000.pcie_gbps == pytest.approx(63.0, abs=0.1)
    assert all(g.scaleup_link in Link for g in gpu_catalog().values())
    # A bridge or a user's nvlinkGBps override makes the pair NVLink.
    assert resolve_gpu("h100_pcie", nvlink_gbps=300).scaleup_link is Link.NVLINK


def test_an_unknown_pcie_generation_is_refused_with_the_allowed_ones():
    with pytest.raises(InvalidSpec, match="allowed"):
        pcie_gbps(7, 16)


@pytest.mark.parametrize(("gpu", "n", "nbytes", "measured_us", "source"), PUBLISHED_SMALL_ALLREDUCE)
def test_small_pcie_allreduces_take_what_was_measured(gpu, n, nbytes, measured_us, source):
    assert float(allreduce_s(gpu, n, nbytes)) * 1e6 == pytest.approx(measured_us, rel=0.25), source


def test_large_pcie_allreduces_reach_the_measured_bus_bandwidth():
    # 37.6–41.7 GB/s of NCCL bus bandwidth on 7–8 RTX PRO 6000 over PCIe 5.0 x16 (rtx6kpro, 8 MB–4 GB sweeps).
    nbytes, n = 2**30, 8
    busbw = nbytes * 2 * (n - 1) / n / float(allreduce_s(PRO6000, n, nbytes)) / 1e9
    assert 37.6 <= busbw <= 41.7


def test_nvlink_allreduce_latency_grows_with_the_gpus_it_spans():
    # Fitted: the latency on two GPUs plus a per-GPU term beyond two (each rank signals and reads every peer).
    h100, p = resolve_gpu("h100_sxm"), perf_params()
    assert p.allreduce_peer_latency_s > 0
    for n in (2, 4, 8):
        assert float(allreduce_s(h100, n, 8)) == pytest.approx(p.allreduce_latency_s + p.allreduce_peer_latency_s * (n - 2), rel=1e-3)
    assert float(allreduce_s(h100, 2, 8)) < float(allreduce_s(h100, 4, 8)) < float(allreduce_s(h100, 8, 8))
    # Across 8 GPUs NVLink's fitted latency stays under the PCIe card's custom all-reduce: 21.0 against 25.2 µs under the
    # measured-terms fit. The fitted latency prices only what no measured table covers: NVLink GPUs without tables (B300,
    # GB200, GB300) and pipeline hand-offs. Where a table covers the GPU the engine's own is used (vLLM 0.19.0: 5.0 µs on
    # 8 H100s, planner/perf/step._measured_allreduce_line); the fit put it at 9.6 µs before the GEMMs were measured.
    assert float(allreduce_s(h100, 8, 8)) < float(allreduce_s(PRO6000, 8, 8))


def _tp2_step(gpu, **batch):
    return float(step_time_s(resolve_model("llama-3.1-70b"), gpu, precision=Precision.BF16, kv_dtype=KvDtype.AUTO, engine=Engine.VLLM,
                             tp=2, pp=1, dp=1, **batch))


def test_tensor_parallel_steps_over_pcie_cost_more_than_over_nvlink():
    bridged = replace(PRO6000, nvlink_gbps=450.0)
    decode = {"prefill_tokens": 0.0, "prefill_pairs": 0.0, "decode_tokens": 32.0, "decode_context_tokens": 32 * 2000.0}
    prefill = {"prefill_tokens": 8192.0, "prefill_pairs": 8192.0 * 4096, "decode_tokens": 0.0, "decode_context_tokens": 0.0}
    # Decode: each all-reduce's activations cross PCIe at 40 GB/s instead of NVLink's hundreds. Its fixed cost is the
    # PCIe card's custom all-reduce (7.5 µs on two) against the fitted NVLink latency of GPUs no table covers (13 µs
    # under the measured-terms fit), so the decode step is only a little slower (1.3 %).
    assert _tp2_step(PRO6000, **decode) > _tp2_step(bridged, **decode)
    # Prefill: 8192 tokens × 2 bytes × hidden per all-reduce at 40 GB/s instead of NVLink's hundreds.
    assert _tp2_step(PRO6000, **prefill) > _tp2_step(bridged, **prefill) * 1.1
    # Without peer-to-peer (RTX 4090) each small all-reduce bounces through host memory: slower than the PRO 6000's.
    assert float(allreduce_s(RTX4090, 2, 64 * 1024)) > 2 * float(allreduce_s(PRO6000, 2, 64 * 1024))
