"""Hugging Face checkpoints, read without torch: Qwen2-family config.json and safetensors
headers (`checkpoint`: dims and weight shapes, so config validation and `trainer=plan` stay
light), the checks a trainer makes before its workers start (`checks`), and the checkpoint's
tokenizer, loaded offline and checked against the model (`tokenizer`). Moving the weights into
and out of our megatron-core chunks is training's job: train/step/hf_bridge.py.
"""
