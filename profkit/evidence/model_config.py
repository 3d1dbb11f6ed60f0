"""A model's Hugging Face `config.json` (capture copies the served model's into the folder; `--model-config` gives
one for a bare trace) -> `ModelShape`: what a step of the model computes and reads.

Dense decoder-only transformers (Llama, Qwen, Mistral and the like: attention with grouped KV heads and a gated
MLP of three matrices) are modelled; a mixture-of-experts config is read but not modelled (`dense` False)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from profkit.errors import ProfkitError
from profkit.escape import one_line
from profkit.inputs import read_json
from profkit.numbers import json_int

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4, "float8_e4m3fn": 1, "fp8": 1}


class ModelShape(msgspec.Struct, frozen=True):
    path: str
    architecture: str | None
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    dtype: str | None  # the checkpoint's torch_dtype
    quantization: str | None  # quantization_config.quant_method of a quantized checkpoint
    dense: bool  # False: experts (MoE); the per-step model below is a dense one's

    @property
    def matmul_params(self) -> int:
        """Weights every token multiplies (per layer q, k, v, o and the gated MLP's three matrices; the LM head):
        what a step reads once and what 2 x params FLOPs per token come from. The embedding table is looked up,
        not multiplied."""
        per_layer = (self.hidden * (self.heads + 2 * self.kv_heads) * self.head_dim
                     + self.heads * self.head_dim * self.hidden + 3 * self.hidden * self.intermediate)
        return self.layers * per_layer + self.hidden * self.vocab

    def activation_bytes_per_token(self, act_bytes: int = 2) -> int:
        """What one token's GEMMs read (their inputs) and write (their outputs) in every layer: the qkv, o,
        gate-up and down projections; 16-bit activations unless told."""
        qkv = (self.heads + 2 * self.kv_heads) * self.head_dim
        inputs = self.hidden + self.heads * self.head_dim + self.hidden + self.intermediate
        outputs = qkv + self.hidden + 2 * self.intermediate + self.hidden
        return act_bytes * self.layers * (inputs + outputs)

    def kv_bytes_per_token(self, kv_bytes: int) -> int:
        """K and V of one token in every layer."""
        return 2 * self.layers * self.kv_heads * self.head_dim * kv_bytes

    def attention_flops(self, query_tokens: float, context: float) -> float:
        """QK^T and PV for `query_tokens` tokens each attending to `context` tokens, in every layer."""
        return 4.0 * self.layers * self.heads * self.head_dim * query_tokens * context


# Wide physical bounds on a transformer's shape (the largest published models are far inside them): a value
# outside is not a model this profkit can reason about, and would print MFU in the billions.
BOUNDS = {"hidden": 1 << 20, "layers": 10_000, "heads": 1 << 16, "kv_heads": 1 << 16, "head_dim": 1 << 16,
          "intermediate": 1 << 24, "vocab": 1 << 27, "experts": 1 << 20}


def _int(data: dict[str, Any], path: str, field: str, *keys: str) -> int | None:
    """The first of `keys` the config has, which must be a positive integer within the field's bound; None when
    the config has none of them. A value of another type or out of bounds is one error line naming the key: never
    replaced silently by another key's value or a default."""
    key = next((k for k in keys if data.get(k) is not None), None)
    if key is None:
        return None
    value = data[key]
    if json_int(value) is None:
        raise ProfkitError(f"{path}: {key} is {one_line(repr(value), 40)}, not an integer")
    if not 0 < value <= BOUNDS[field]:
        raise ProfkitError(f"{path}: {key} = {one_line(repr(value), 40)} is not a plausible model size "
                           f"(1 to {BOUNDS[field]:,})")
    return value


# keys a mixture of experts names its experts by (Mixtral, Qwen-MoE, DeepSeek, ERNIE; experts a token)
EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts", "num_experts_per_tok")


def parse_model_config(data: Any, path: str) -> ModelShape:
    if not isinstance(data, dict):
        raise ProfkitError(f"{path}: not a model config (expected a JSON object)")
    wrapped = data.get("text_config")
    text: dict[str, Any] = wrapped if isinstance(wrapped, dict) else data  # multimodal wrappers
    hidden = _int(text, path, "hidden", "hidden_size", "n_embd", "d_model")
    layers = _int(text, path, "layers", "num_hidden_layers", "n_layer", "num_layers")
    heads = _int(text, path, "heads", "num_attention_heads", "n_head")
    vocab = _int(text, path, "vocab", "vocab_size")
    intermediate = _int(text, path, "intermediate", "intermediate_size", "ffn_dim", "n_inner")
    if hidden is None or layers is None or heads is None or vocab is None or intermediate is None:
        raise ProfkitError(f"{path}: not a decoder model config this profkit reads (needs hidden_size, "
                           "num_hidden_layers, num_attention_heads, intermediate_size, vocab_size)")
    kv_heads = _int(text, path, "kv_heads", "num_key_value_heads", "num_kv_heads") or heads
    if heads % kv_heads:  # grouped-query attention: each KV head serves a whole group of query heads
        raise ProfkitError(f"{path}: {kv_heads} KV heads do not divide {heads} attention heads")
    head_dim = _int(text, path, "head_dim", "head_dim") or hidden // heads
    if head_dim == 0:
        raise ProfkitError(f"{path}: {heads} attention heads for a hidden size of {hidden}")
    archs = data.get("architectures")
    quant = data.get("quantization_config")
    dtype = text.get("torch_dtype", data.get("torch_dtype", text.get("dtype")))
    # Some dense configs carry num_experts 0: no experts.
    # ERNIE-4.5-VL gives its experts per modality, a list ([64, 64]): experts all the same
    counts = {k: max(v) if isinstance(v, list) and v and all(json_int(x) is not None for x in v) else v
              for k, v in text.items() if k in EXPERT_KEYS}
    experts = _int({k: v for k, v in counts.items() if v != 0}, path, "experts", *EXPERT_KEYS)
    # a mixture of experts named by its architecture alone (Qwen2MoeForCausalLM, OlmoeForCausalLM)
    moe_named = isinstance(archs, list) and any(isinstance(a, str) and "moe" in a.lower() for a in archs)
    return ModelShape(path=path, architecture=str(archs[0]) if isinstance(archs, list) and archs else None,
                      layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                      intermediate=intermediate, vocab=vocab, dtype=dtype if isinstance(dtype, str) else None,
                      quantization=str(quant.get("quant_method")) if isinstance(quant, dict) else None,
                      dense=experts is None and not moe_named)


def read_model_config(path: Path) -> ModelShape:
    return parse_model_config(read_json(Path(path), "model config"), str(path))
