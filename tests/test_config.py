import json

import pytest

import attnlab
from attnlab.config import ConfigError, ModelConfig, PRESETS, preset
from attnlab.interop.bert import bert_config_from_hf, bert_config_to_hf


def test_unknown_key_is_named():
    with pytest.raises(ConfigError, match="unknown key 'hiden_size'"):
        ModelConfig.from_dict({"hiden_size": 128})


def test_heads_must_divide_hidden():
    with pytest.raises(ConfigError, match="num_heads=7 does not divide hidden_size=384"):
        ModelConfig(hidden_size=384, num_heads=7)


def test_kv_heads_must_divide_heads():
    with pytest.raises(ConfigError, match="num_kv_heads=5"):
        ModelConfig(num_heads=12, num_kv_heads=5)


@pytest.mark.parametrize("field,value", [("position", "absolute"), ("norm", "batchnorm"),
                                         ("activation", "tanh"), ("norm_placement", "middle")])
def test_bad_choice_names_field_and_value(field, value):
    with pytest.raises(ConfigError, match=f"{field}={value!r}"):
        ModelConfig(**{field: value})


@pytest.mark.parametrize("field,value", [("hidden_size", 0), ("num_layers", -1), ("dropout", 1.5),
                                         ("vocab_size", "many"), ("norm_eps", 0)])
def test_bad_numbers_name_field(field, value):
    with pytest.raises(ConfigError, match=field):
        ModelConfig(**{field: value})


def test_hf_config_errors_use_the_files_key_names():
    hf = {"model_type": "bert", "hidden_size": 384, "num_attention_heads": 7, "num_hidden_layers": 2,
          "intermediate_size": 64, "vocab_size": 100}
    with pytest.raises(ConfigError, match="num_attention_heads=7 does not divide hidden_size=384"):
        bert_config_from_hf(hf, "config.json")


def test_bert_hf_config_round_trip(minilm):
    hf = json.loads((minilm / "config.json").read_text())
    cfg = bert_config_from_hf(hf)
    assert (cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.intermediate_size) == (384, 6, 12, 1536)
    back = bert_config_to_hf(cfg)
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size",
                "layer_norm_eps", "hidden_act", "max_position_embeddings", "type_vocab_size"):
        assert back[key] == hf[key], key
    assert bert_config_from_hf(back) == cfg


@pytest.mark.parametrize("name,expected", [("bert-base", 109_482_240), ("bert-large", 335_141_888)])
def test_paper_parameter_counts(name, expected):
    from attnlab.models import Encoder
    from attnlab.viz.explain import build_on_meta
    assert build_on_meta(Encoder, preset(name)).num_parameters() == expected


def test_every_preset_builds():
    for name in PRESETS:
        cfg = preset(name)
        # T5 v1.1 sets head_dim (d_kv=64) with 6 heads over d_model=512; otherwise heads split hidden_size
        assert cfg.head_dim is not None or cfg.hidden_size % cfg.num_heads == 0
    assert attnlab.from_config("bert-tiny").num_parameters() > 0
    with pytest.raises(ConfigError, match="unknown preset"):
        preset("bert-huge")


def test_replace_validates():
    cfg = preset("bert-mini")
    assert cfg.replace(num_layers=2).num_layers == 2
    with pytest.raises(ConfigError):
        cfg.replace(num_heads=3)
