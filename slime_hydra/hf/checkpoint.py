"""An HF checkpoint dir of the Qwen2 family: its config.json as model dims, and its safetensors
checked against that config before any worker starts. Plain Python: no torch, no transformers.

What `model=hf` supports is what our GPTModel computes exactly like transformers'
Qwen2ForCausalLM: RMSNorm, SwiGLU (silu), RoPE without scaling, biased q/k/v projections, full
causal attention (no sliding window), tied or untied embeddings. Anything else is refused by
name rather than loaded into a model that computes something else.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from slime_hydra.errors import SlimeHydraError
from slime_hydra.files import parse_json, read_text

ARCHITECTURES = ("Qwen2ForCausalLM",)
"""HF architectures `model=hf` loads (Qwen2, Qwen2.5 and their Coder/Math variants)."""

MODEL_TYPES = ("qwen2",)

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".safetensors.index.json")
"""Files an export does not copy from the source dir: it writes its own weights."""

_LAYER = re.compile(r"model\.layers\.(\d+)\.")


def read_safetensors_header(path: Path) -> dict[str, dict[str, Any]]:
    """{tensor name: {"dtype", "shape", "data_offsets"}} from a safetensors file's JSON header."""
    try:
        with path.open("rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            if size > 100 * 2**20:
                raise ValueError(f"a {size}-byte header")
            header = parse_json(f.read(size).decode("utf-8"), f"{path} (its header)")
    except (OSError, ValueError, struct.error) as exc:
        raise SlimeHydraError(f"{path} is not a readable safetensors file ({exc}).") from None
    if not isinstance(header, dict):
        raise SlimeHydraError(f"{path} is not a safetensors file: its header is not an object.")
    header.pop("__metadata__", None)
    return header


@dataclass(frozen=True)
class HfCheckpoint:
    """A checkpoint dir: config.json (required), safetensors weights, tokenizer files."""

    path: Path
    config: dict[str, Any]

    @classmethod
    def open(cls, path: str | Path) -> HfCheckpoint:
        """Read DIR/config.json and refuse any architecture but the Qwen2 family's."""
        root = Path(path).expanduser()
        if not root.is_dir():
            raise SlimeHydraError(
                f"model.path={str(path)!r} is not a directory; model=hf needs a Hugging Face "
                "checkpoint dir (config.json, *.safetensors, tokenizer files)."
            )
        file = root / "config.json"
        if not file.is_file():
            raise SlimeHydraError(
                f"model.path={str(path)!r} has no config.json, so the model's dims are unknown; "
                "point model.path at the dir that transformers' save_pretrained wrote."
            )
        fix = "point model.path at the dir that transformers' save_pretrained wrote."
        config = parse_json(read_text(file, "the checkpoint's config", fix), str(file))
        if not isinstance(config, dict):
            raise SlimeHydraError(f"{file} holds {type(config).__name__}, not a JSON object.")
        ckpt = cls(root, config)
        ckpt.check_supported()
        return ckpt

    @property
    def where(self) -> str:
        return str(self.path / "config.json")

    def get(self, key: str, default: Any = None, required: bool = False) -> Any:
        if required and self.config.get(key) is None:
            raise SlimeHydraError(f"{self.where} has no {key}; it is not a Qwen2 config.")
        return self.config.get(key, default)

    def check_supported(self) -> None:
        """The Qwen2 family, with nothing our model would compute differently."""
        archs = self.config.get("architectures") or []
        model_type = self.config.get("model_type")
        if model_type not in MODEL_TYPES or (archs and not set(archs) & set(ARCHITECTURES)):
            found = ", ".join(archs) if archs else "no architectures"
            raise SlimeHydraError(
                f"{self.where} describes {found} (model_type={model_type!r}); model=hf loads the "
                f"Qwen2 family only ({', '.join(ARCHITECTURES)}: Qwen2, Qwen2.5). Other "
                "architectures need their own bridge."
            )
        if self.config.get("use_sliding_window"):
            raise SlimeHydraError(
                f"{self.where} sets use_sliding_window=true; our attention is full causal, so "
                "the trained model would differ from the checkpoint's. Use a checkpoint without "
                "sliding-window attention."
            )
        rope = self.rope_parameters
        if rope.get("rope_type", rope.get("type", "default")) not in ("default", None):
            raise SlimeHydraError(
                f"{self.where} uses RoPE scaling {rope}; model=hf supports plain RoPE only "
                "(rope_type=default)."
            )
        act = self.config.get("hidden_act", "silu")
        if act != "silu":
            raise SlimeHydraError(
                f"{self.where} has hidden_act={act!r}; Qwen2's SwiGLU MLP needs 'silu'."
            )

    @property
    def rope_parameters(self) -> dict[str, Any]:
        """transformers ≥ 5 keeps rope_theta in rope_parameters; 4.x at the top level."""
        rope = self.config.get("rope_parameters") or self.config.get("rope_scaling") or {}
        return rope if isinstance(rope, dict) else {}

    @property
    def rope_theta(self) -> float:
        theta = self.rope_parameters.get("rope_theta", self.config.get("rope_theta"))
        return self.positive("rope_theta", theta if theta is not None else 10000.0)

    @property
    def tied(self) -> bool:
        return bool(self.config.get("tie_word_embeddings", False))

    def count(self, key: str, default: int | None = None) -> int:
        """config.json's `key` as a positive integer (required unless `default`); a float, a
        string or a number below 1 is refused, never rounded."""
        value = self.get(key, required=default is None)
        value = default if value is None else value
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value < 2**63:
            raise SlimeHydraError(
                f"{self.where}: {key}={value!r} is not a positive integer; a model dim is a "
                "whole count. Fix the checkpoint's config.json."
            )
        return value

    def positive(self, key: str, value: Any) -> float:
        """A finite number above 0 read from config.json's `key`."""
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        if not ok or not 0 < value < float("inf"):
            raise SlimeHydraError(
                f"{self.where}: {key}={value!r} is not a finite number above 0; fix the "
                "checkpoint's config.json."
            )
        return float(value)

    def dims(self) -> dict[str, Any]:
        """The conf/model mapping (ModelDims fields) this config.json describes."""
        hidden = self.count("hidden_size")
        heads = self.count("num_attention_heads")
        head_dim = self.config.get("head_dim")
        if head_dim is not None:
            head_dim = self.count("head_dim")
        return {
            "name": self.path.resolve().name,
            "num_layers": self.count("num_hidden_layers"),
            "hidden_size": hidden,
            "ffn_hidden_size": self.count("intermediate_size"),
            "num_attention_heads": heads,
            "num_query_groups": self.count("num_key_value_heads", heads),
            "vocab_size": self.count("vocab_size"),
            "max_position_embeddings": self.count("max_position_embeddings", 32768),
            "kv_channels": None if head_dim in (None, hidden // heads) else head_dim,
            "normalization": "RMSNorm",
            "norm_epsilon": self.positive("rms_norm_eps", self.config.get("rms_norm_eps", 1e-6)),
            "swiglu": True,
            "position_embedding_type": "rope",
            "rotary_base": self.rope_theta,
            "add_qkv_bias": True,
            "untie_embeddings_and_output_weights": not self.tied,
            "path": str(self.path),
        }

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor of a Qwen2ForCausalLM with this config, by HF name (lm_head if untied)."""
        d = self.dims()
        h, f, v = d["hidden_size"], d["ffn_hidden_size"], d["vocab_size"]
        head = d["kv_channels"] or h // d["num_attention_heads"]
        q, kv = d["num_attention_heads"] * head, d["num_query_groups"] * head
        shapes = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,)}
        if not self.tied:
            shapes["lm_head.weight"] = (v, h)
        for i in range(d["num_layers"]):
            p = f"model.layers.{i}."
            shapes |= {
                p + "input_layernorm.weight": (h,),
                p + "post_attention_layernorm.weight": (h,),
                p + "self_attn.q_proj.weight": (q, h),
                p + "self_attn.q_proj.bias": (q,),
                p + "self_attn.k_proj.weight": (kv, h),
                p + "self_attn.k_proj.bias": (kv,),
                p + "self_attn.v_proj.weight": (kv, h),
                p + "self_attn.v_proj.bias": (kv,),
                p + "self_attn.o_proj.weight": (h, q),
                p + "mlp.gate_proj.weight": (f, h),
                p + "mlp.up_proj.weight": (f, h),
                p + "mlp.down_proj.weight": (h, f),
            }
        return shapes

    @cached_property
    def weight_files(self) -> tuple[Path, ...]:
        return tuple(sorted(self.path.glob("*.safetensors")))

    def tensors(self) -> dict[str, tuple[Path, dict[str, Any]]]:
        """{name: (file, header entry)} over every safetensors file of the dir."""
        if not self.weight_files:
            other = sorted(p.name for p in self.path.glob("*.bin"))
            hint = f" (it has {', '.join(other)}: convert them to safetensors)" if other else ""
            raise SlimeHydraError(
                f"model.path={str(self.path)!r} has config.json but no *.safetensors weights"
                f"{hint}; model=hf loads safetensors (what save_pretrained writes)."
            )
        out = {}
        for file in self.weight_files:
            for name, entry in read_safetensors_header(file).items():
                out[name] = (file, entry)
        return out

    def check_weights(self) -> None:
        """Every tensor config.json implies is there with its shape: a checkpoint of another
        size, a truncated download or a config.json edited by hand fails here, by name."""
        tensors = self.tensors()
        expected = self.expected_shapes()
        missing = [n for n in expected if n not in tensors]
        if missing:
            raise SlimeHydraError(
                f"the weights in {self.path} lack {len(missing)} tensor(s) that config.json "
                f"implies, e.g. {', '.join(missing[:3])}; the safetensors files are incomplete "
                "or belong to another model."
            )
        layers = self.dims()["num_layers"]
        for name, (file, _) in tensors.items():
            match = _LAYER.match(name)
            if match and int(match.group(1)) >= layers:
                raise SlimeHydraError(
                    f"{file.name} holds {name}, but config.json says num_hidden_layers={layers}: "
                    "the weights and config.json disagree."
                )
        if "lm_head.weight" in tensors:  # a tied checkpoint may carry it too
            expected.setdefault("lm_head.weight", expected["model.embed_tokens.weight"])
        for name, want in expected.items():
            file, entry = tensors[name]
            shape = tuple(entry.get("shape", ()))
            if shape != want:
                raise SlimeHydraError(
                    f"{file.name}: {name} has shape {list(shape)} but config.json implies "
                    f"{list(want)} (hidden_size, intermediate_size, num_attention_heads, "
                    "num_key_value_heads, vocab_size); the weights and config.json disagree."
                )

    def weight_dtypes(self) -> dict[str, str]:
        """{name: safetensors dtype (e.g. BF16, F32)}: an export writes each tensor back in it."""
        return {name: entry["dtype"] for name, (_, entry) in self.tensors().items()}

    def side_files(self) -> list[Path]:
        """Files an export copies: config, generation config, tokenizer files, README, ..."""
        return sorted(
            p
            for p in self.path.iterdir()
            if p.is_file() and not p.name.endswith(WEIGHT_SUFFIXES) and not p.name.startswith(".")
        )
