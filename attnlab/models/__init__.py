from .base import Model, ModelOutput
from .encoder import Encoder, Pooler

__all__ = ["Encoder", "Model", "ModelOutput", "Pooler"]
