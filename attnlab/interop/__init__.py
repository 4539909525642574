"""Every checkpoint format and the family registry (the layer above models and heads):

    registry.py   Family, FAMILIES, register(): one Family per Hugging Face model_type
    bert.py …     one module per family; each registers itself when imported (the list below)
    names.py      NameTable: our state-dict names <-> Hugging Face's, one table per family
    files.py      config.json / safetensors / .bin read defensively; atomic_write
    hf.py         the Hugging Face layout: load_pretrained, save_pretrained
    native.py     attnlab's own layout, for what no family can express; save_model falls back to it
    gguf.py       llama.cpp files (dequantized); local.py: packaged names -> local paths (no downloads)
    api.py        load, save, load_tokenizer, from_config (re-exported by `attnlab`)

A new family: a module that calls `register(Family(...))`, and one import line here.
"""
from . import bert  # noqa: F401
from . import gpt2, llama  # noqa: F401
from . import albert, distilbert, electra, modernbert, roberta  # noqa: F401  (the BERT family)
from . import t5  # noqa: F401  (T5 and the original Transformer)
from . import bart  # noqa: F401  (BART)
from . import m2m100  # noqa: F401  (M2M-100)
from . import deberta  # noqa: F401  (DeBERTa-v2/v3)
from . import xlnet  # noqa: F401  (XLNet: two streams, Transformer-XL relative attention, mems)
from . import xlm  # noqa: F401  (XLM with language embeddings; XLM-R registers in roberta.py)
from . import ctrl, gpt_neo, gpt_neox, openai_gpt  # noqa: F401  (CTRL, GPT-1, GPT-Neo, GPT-NeoX)
from . import mistral, mixtral  # noqa: F401  (sliding window, mixture of experts)
from . import longformer  # noqa: F401  (sliding window + global tokens)
from . import bigbird  # noqa: F401  (block-sparse attention: window + global + random blocks)
from .api import from_config, load, load_tokenizer, save

__all__ = ["from_config", "load", "load_tokenizer", "save"]
