"""bf16 and int8 (dynamic quantization of linear layers): real MiniLM embeddings stay close to fp32, the
original model is left alone, `attnlab embed --dtype` works, and an int8 decoder runs in the engine."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import attnlab
from attnlab.cli import main
from attnlab.inference.embed import embed
from attnlab.inference.engine import Engine, SamplingParams
from attnlab.inference.quantize import linear_precision, quantize

from test_generate import tiny

SENTENCES = ["a gripping , funny and moving film .", "EU rejects German call to boycott British lamb .",
             "the plot is nowhere near as clever as it thinks it is", "Peter Blackburn",
             "it 's a charming and often affecting journey .", "BRUSSELS 1996-08-22",
             "unflinchingly bleak and desperate", "The European Commission said on Thursday it disagreed ."]


def test_minilm_int8_and_bf16_stay_close_to_fp32(minilm):
    model, tok = attnlab.load(minilm), attnlab.load_tokenizer(minilm)
    ref = embed(model, tok, SENTENCES)
    int8, bf16 = quantize(model, "int8"), quantize(model, "bf16")
    assert linear_precision(model) == "fp32" and linear_precision(int8) == "int8" and linear_precision(bf16) == "bf16"
    cos8 = (embed(int8, tok, SENTENCES) * ref).sum(-1)
    cos16 = (embed(bf16, tok, SENTENCES) * ref).sum(-1)
    assert cos8.mean() >= 0.95 and cos8.min() >= 0.9, cos8
    assert cos16.min() >= 0.999, cos16
    assert np.allclose(embed(model, tok, SENTENCES), ref)  # quantize() copied; the fp32 model is unchanged
    with pytest.raises(ValueError, match="dtype must be one of"):
        quantize(model, "fp8")


def test_embed_cli_dtype(minilm, tmp_path):
    (tmp_path / "in.txt").write_text("\n".join(SENTENCES[:3]) + "\n", encoding="utf-8")
    assert main(["embed", str(minilm), "--input", str(tmp_path / "in.txt"), "--output", str(tmp_path / "v.npy"),
                 "--dtype", "int8"]) == 0
    v = np.load(tmp_path / "v.npy")
    assert v.shape == (3, 384) and np.allclose(np.linalg.norm(v, axis=1), 1, atol=1e-4)


def test_int8_decoder_runs_in_the_engine():
    model = quantize(tiny("llama"), "int8", keep_fp32=())
    assert linear_precision(model) == "int8"
    outs = Engine(model, num_blocks=32, block_size=4).generate([[7, 8, 9], [10]], SamplingParams(max_new_tokens=5,
                                                                                                ignore_eos=True))
    assert [len(o) for o in outs] == [5, 5]
    with torch.no_grad():
        ref = tiny("llama")(torch.tensor([[7, 8, 9]])).logits
        q = model(torch.tensor([[7, 8, 9]])).logits
    assert torch.nn.functional.cosine_similarity(ref.flatten(), q.flatten(), dim=0) > 0.99
