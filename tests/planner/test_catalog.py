"""GPU and model catalogs: every entry loads, aliases resolve, unknown names are refused with choices."""

import json

import pytest

from servingtopology.planner.errors import InvalidSpec
from servingtopology.planner.hardware import Precision, gpu_catalog, gpu_for_product, resolve_gpu
from servingtopology.planner.model.catalog import from_hf_config, model_catalog, resolve_model
from tests.groundtruth import GROUNDTRUTH

SHARED_MODELS = GROUNDTRUTH / "models"

REQUIRED_GPUS = ["a100_sxm", "a100_40gb", "h100_sxm", "h100_pcie", "h200_sxm", "b200_sxm", "b300_sxm", "gb200", "gb300",
                 "l40s", "mi300x", "rtx_4090", "rtx_pro_6000"]


@pytest.mark.parametrize("gid", REQUIRED_GPUS)
def test_every_required_gpu_is_in_the_catalog_with_positive_figures(gid):
    g = gpu_catalog()[gid]
    assert g.memory_gib > 0 and g.hbm_gbps > 0 and g.bf16_tflops > 0 and g.gpus_per_node >= 1


@pytest.mark.parametrize(("alias", "gid"), [("H100", "h100_sxm"), ("h100-sxm", "h100_sxm"), ("H200", "h200_sxm"),
                                            ("B200", "b200_sxm"), ("A100", "a100_sxm"), ("RTX4090", "rtx_4090")])
def test_common_gpu_aliases_resolve(alias, gid):
    assert resolve_gpu(alias).id == gid


def test_an_unknown_gpu_names_the_field_and_the_allowed_ids():
    with pytest.raises(InvalidSpec) as err:
        resolve_gpu("V100")
    assert err.value.field == "hardware.gpu"
    assert "h100_sxm" in str(err.value)


@pytest.mark.parametrize(("product", "gid"), [
    ("NVIDIA-H100-80GB-HBM3", "h100_sxm"),      # GPU feature discovery's spelling of the NVML name
    ("NVIDIA-H100-PCIe", "h100_pcie"),          # not the SXM part, though the name holds "H100"
    ("NVIDIA-A100-SXM4-40GB", "a100_40gb"),     # not the 80 GB part, though the name holds "A100"
    ("H100", "h100_sxm"),                       # the catalog's ids and aliases
    ("NVIDIA-H100-80GB-HBM3-SHARED", None),     # time-sliced: not whole GPUs
    ("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", None),  # a MIG slice
    ("NVIDIA-Tesla-T4", None),                  # not in the catalog: never guessed from a part of the name
    ("", None),
    (None, None),
])
def test_a_node_product_label_names_a_catalog_gpu_or_none(product, gid):
    gpu = gpu_for_product(product)
    assert (gpu.id if gpu else None) == gid


def test_link_overrides_replace_catalog_figures():
    g = resolve_gpu("h100_sxm", nic_gbit=100, gpus_per_node=4)
    assert g.nic_gbit == 100 and g.gpus_per_node == 4


def test_fp8_falls_back_to_bf16_peak_on_gpus_without_fp8():
    a100 = resolve_gpu("a100_sxm")
    assert not a100.supports(Precision.FP8)
    assert a100.peak_tflops(Precision.FP8) == a100.bf16_tflops


@pytest.mark.parametrize(("name", "billions"), [
    ("llama-2-7b", 6.74), ("llama-2-70b", 68.98), ("llama-3.1-8b", 8.03), ("llama-3.1-70b", 70.55), ("llama-3.1-405b", 405.85),
    ("qwen3-32b", 32.8), ("qwen3-235b-a22b", 235.1), ("mixtral-8x7b", 46.7), ("deepseek-v3", 671.0), ("gpt-oss-120b", 116.8),
])
def test_catalog_parameter_counts_match_the_published_sizes(name, billions):
    assert resolve_model(name).total_params / 1e9 == pytest.approx(billions, rel=0.01)


def test_active_parameters_of_moe_models_are_a_small_share():
    assert resolve_model("qwen3-235b-a22b").active_params_per_token / 1e9 == pytest.approx(22.1, rel=0.05)
    assert resolve_model("deepseek-v3").active_params_per_token / 1e9 == pytest.approx(37, rel=0.05)


def test_every_catalog_model_loads():
    names = set(model_catalog())
    for required in ["llama-2-7b", "llama-2-70b", "llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "qwen3-8b", "qwen3-32b",
                     "qwen3-235b-a22b", "qwen3-30b-a3b", "mixtral-8x7b", "deepseek-v3", "deepseek-r1", "gpt-oss-20b",
                     "gpt-oss-120b", "kimi-k2"]:
        assert required in names


def test_hugging_face_ids_resolve_case_insensitively():
    assert resolve_model("META-LLAMA/Llama-3.1-70B-Instruct").name == "llama-3.1-70b"


@pytest.mark.skipif(not SHARED_MODELS.is_dir(), reason="shared ground truth not present")
def test_every_shared_config_json_parses():
    for path in SHARED_MODELS.glob("*/*/config.json"):
        m = from_hf_config(json.loads(path.read_text()), name=path.parent.name)
        assert m.num_layers > 0 and m.total_params > 1e9


def test_mla_and_sliding_window_fields_are_read():
    ds, oss = resolve_model("deepseek-v3"), resolve_model("gpt-oss-120b")
    assert ds.is_mla and ds.kv_latent_dim == 576 and ds.num_dense_layers == 3 and ds.num_shared_experts == 1
    assert oss.num_sliding_layers == 18 and oss.sliding_window == 128 and oss.checkpoint_precision == "fp4"


def test_an_architecture_name_never_decides_whether_a_config_loads():
    m = from_hf_config({"architectures": ["SomeNewLabForCausalLM"], "num_hidden_layers": 2, "hidden_size": 64,
                        "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 1000})
    assert m.num_layers == 2 and m.total_params == 2 * (4 * 64 * 64 + 3 * 64 * 128) + 2 * 1000 * 64


def test_a_config_without_the_sizes_of_a_decoder_is_refused_naming_the_fields():
    with pytest.raises(InvalidSpec, match="num_hidden_layers and hidden_size"):
        from_hf_config({"architectures": ["WhisperForConditionalGeneration"], "d_model": 8, "encoder_layers": 2})
