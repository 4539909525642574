"""Checkpoints in and out: Hugging Face layout (hf.py), local name resolution (local.py)."""
