"""Building blocks, each a small file: attention, positions, norms, feed-forward, embeddings, block."""
from .attention import Attention, AttentionMask, scaled_dot_product_attention
from .block import Block
from .embeddings import Embeddings
from .feedforward import FeedForward
from .norms import RMSNorm, make_norm
from .positions import RelativePositionBias, RotaryEmbedding, apply_rotary, sinusoidal_table

__all__ = ["Attention", "AttentionMask", "Block", "Embeddings", "FeedForward", "RMSNorm", "RelativePositionBias",
           "RotaryEmbedding", "apply_rotary", "make_norm", "scaled_dot_product_attention", "sinusoidal_table"]
