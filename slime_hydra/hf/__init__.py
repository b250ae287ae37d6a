"""Hugging Face checkpoints: Qwen2-family config.json and safetensors in (dims, weights) and out
(`trainer.export_hf`), and their tokenizer.

`checkpoint` reads config.json and the safetensors headers in plain Python (no torch), so
config validation and `trainer=plan` stay light; `bridge` moves the weights between an HF
checkpoint and our megatron-core chunks with mbridge; `tokenizer` loads the checkpoint's
tokenizer offline and checks it against the model.
"""
