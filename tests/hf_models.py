"""Tiny Hugging Face Qwen2 checkpoints and a byte-level BPE tokenizer, made offline in a test.

Norm weights and q/k/v biases are drawn too (transformers initialises them to 1 and 0), so a
mapping that swapped or dropped one would show in the logits.
"""

from __future__ import annotations

import json
from pathlib import Path

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "What is two plus three? The answer is five.",
    "Count the letters in the word banana: six letters.",
    "Reverse the string hello world: dlrow olleh.",
    "Tiny models learn to copy digits 0123456789 quickly.",
] * 20
VOCAB = 320
"""The model's vocabulary: larger than the tokenizer's (as Qwen pads 151,665 tokens to 151,936)."""


def train_tokenizer(out: Path, vocab_size: int = 300) -> int:
    """A byte-level BPE tokenizer with ChatML specials and chat template in `out`; its eos id."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    fast.chat_template = CHATML
    fast.save_pretrained(str(out))
    return fast.eos_token_id


def make_checkpoint(
    out: Path, tied: bool, num_layers: int = 2, seed: int = 0, vocab_size: int = VOCAB
) -> Path:
    """A random Qwen2ForCausalLM (hidden 64, 4 heads, 2 KV groups) saved with its tokenizer."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    eos = train_tokenizer(out)
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        tie_word_embeddings=tied,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        eos_token_id=eos,
        bos_token_id=None,
        pad_token_id=None,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.2 * torch.randn_like(param))
            elif name.endswith("bias"):
                param.copy_(0.2 * torch.randn_like(param))
    model.save_pretrained(str(out))
    return out


def edit_config(ckpt: Path, **changes: object) -> None:
    """Change config.json's keys in place (None deletes one)."""
    file = ckpt / "config.json"
    config = json.loads(file.read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    file.write_text(json.dumps(config, indent=2))


def hf_logits(ckpt: Path, sequences: list[list[int]]) -> list:
    """transformers' fp32 logits of each sequence on its own: [len, vocab] each."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        return [model(torch.tensor([s])).logits[0] for s in sequences]


def write_text_rollouts(path: Path, num_prompts: int = 2, per_prompt: int = 4) -> Path:
    """{prompt, response, reward} records, `per_prompt` responses for each prompt."""
    answers = ["five", "six letters", "dlrow olleh", "0123", "the answer is five", "banana"]
    with path.open("w") as f:
        for p in range(num_prompts):
            for s in range(per_prompt):
                record = {
                    "prompt": f"Question {p}: what is two plus three?",
                    "response": answers[(p + s) % len(answers)] * (1 + s % 2),
                    "reward": float(s % 2),
                }
                f.write(json.dumps(record) + "\n")
    return path
