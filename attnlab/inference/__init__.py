"""Inference: sentence embeddings (embed.py); generation, KV caches and serving engines come later."""
