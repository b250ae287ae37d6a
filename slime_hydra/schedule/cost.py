"""The cost model: model dimensions (conf/model/*.yaml) and their FLOPs per sequence.

Pure (no torch, no files) so that schedule metrics, FLOPs balancing and `trainer=plan` use it
without building a model; dims of an HF checkpoint are read in slime_hydra/hf/checks.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from typing import Any

from slime_hydra.errors import SlimeHydraError


@dataclass(frozen=True)
class ModelDims:
    """Shape of a decoder-only GPT (Qwen/Llama family): what conf/model/<name>.yaml holds."""

    name: str
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    vocab_size: int
    max_position_embeddings: int
    kv_channels: int | None = None
    """Per-head dim; None means hidden_size // num_attention_heads."""
    normalization: str = "RMSNorm"
    norm_epsilon: float = 1e-6
    swiglu: bool = True
    position_embedding_type: str = "rope"
    rotary_base: float = 10000.0
    add_qkv_bias: bool = False
    untie_embeddings_and_output_weights: bool = True
    path: str | None = None
    """An HF checkpoint dir (model=hf): the dims come from its config.json (any given beside it
    are ignored; hf.checks.model_dims reads it) and the trainers load its weights; null: seeded
    random weights."""
    require_path: bool = False
    """A trainer refuses to start without model.path (an experiment that post-trains real
    weights); trainer=plan needs no weights."""

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_query_groups != 0:
            raise SlimeHydraError(
                f"model {self.name}: num_attention_heads={self.num_attention_heads} is not a "
                f"multiple of num_query_groups={self.num_query_groups}; fix model.num_query_groups."
            )
        if self.kv_channels is None and self.hidden_size % self.num_attention_heads != 0:
            raise SlimeHydraError(
                f"model {self.name}: hidden_size={self.hidden_size} is not a multiple of "
                f"num_attention_heads={self.num_attention_heads}; set model.kv_channels."
            )
        if self.normalization not in ("RMSNorm", "LayerNorm"):
            raise SlimeHydraError(
                f"model {self.name}: normalization={self.normalization!r}; "
                "use RMSNorm or LayerNorm."
            )
        if self.position_embedding_type != "rope":
            raise SlimeHydraError(
                f"model {self.name}: position_embedding_type={self.position_embedding_type!r}; "
                "only 'rope' is supported."
            )

    @property
    def head_dim(self) -> int:
        """Per-head query/key/value width."""
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @property
    def layer_matrix_params(self) -> int:
        """Weights of one layer's matrices: QKV h·(n·d + 2·g·d), the output projection n·d·h,
        the MLP k·h·f (k = 3 with SwiGLU, else 2); no biases, no norms."""
        h, d = self.hidden_size, self.head_dim
        attention = h * (2 * self.num_attention_heads * d + 2 * self.num_query_groups * d)
        return attention + (3 if self.swiglu else 2) * h * self.ffn_hidden_size

    @classmethod
    def from_mapping(cls, cfg: Mapping[str, Any]) -> ModelDims:
        """Build from a conf/model mapping (dict or DictConfig) that states every dim, naming
        any unknown or missing key (with model.path, hf.checks.model_dims fills the dims)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(cfg) - known)
        if unknown:
            raise SlimeHydraError(
                f"model config {cfg.get('name', '?')!r} has unknown keys {unknown}; "
                f"allowed keys: {sorted(known)}."
            )
        missing = sorted(f.name for f in fields(cls) if f.name not in cfg and f.default is MISSING)
        if missing:
            raise SlimeHydraError(
                f"model config {cfg.get('name', '?')!r} lacks required keys {missing}."
            )
        return cls(**{k: cfg[k] for k in cfg})


def flops_coefficients(dims: ModelDims) -> tuple[int, int]:
    """(a, b) with forward+backward FLOPs of one causal sequence of length L = a·L + b·L².

    Counts matmuls only, 2 FLOPs per multiply-add, backward = 2× forward (so 6 per weight per
    token). With l layers, h hidden, n heads, g query groups, d head dim, f FFN width, V vocab:
      dense per token   6·[l·(h·(2·n·d + 2·g·d) + k·h·f) + h·V],  k = 3 with SwiGLU else 2
                        (QKV and output projections, MLP, output layer; embeddings are lookups);
      causal attention  6·l·n·d·L·(L+1): QKᵀ and AV each take d multiply-adds for the
                        L·(L+1)/2 (query, key) pairs of a causal mask, per head and layer.
    So a = dense + 6·l·n·d and b = 6·l·n·d. Norms, softmax and activations are ignored.
    """
    dense = 6 * (dims.num_layers * dims.layer_matrix_params + dims.hidden_size * dims.vocab_size)
    b = 6 * dims.num_layers * dims.num_attention_heads * dims.head_dim
    return dense + b, b
