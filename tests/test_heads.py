"""Fine-tuning heads: parity with transformers' Bert{SequenceClassification,TokenClassification,
QuestionAnswering} in both directions (their save -> our load, our save -> their load)."""
from __future__ import annotations

import json
import tempfile
import warnings

import pytest
import torch

import attnlab
from attnlab.heads import QuestionAnswering, SequenceClassification, TokenClassification, num_labels

transformers = pytest.importorskip("transformers")

TINY = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
            max_position_embeddings=64, type_vocab_size=2)
LABELS = {"BertForSequenceClassification": ["neg", "pos", "neutral"],
          "BertForTokenClassification": ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"],
          "BertForQuestionAnswering": None}
OURS = {"BertForSequenceClassification": SequenceClassification,
        "BertForTokenClassification": TokenClassification, "BertForQuestionAnswering": QuestionAnswering}


def _inputs():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 99, (3, 11), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    types = torch.zeros_like(ids)
    types[:, 6:] = 1
    return dict(input_ids=ids, attention_mask=mask, token_type_ids=types)


def _real(logits):
    """Token-level logits at real tokens only: padded positions carry no meaning (our encoder may skip
    them entirely, transformers computes them anyway)."""
    if logits.dim() == 2:
        return logits
    return logits[_inputs()["attention_mask"].bool()]


def _hf_logits(model, arch):
    with torch.no_grad():
        out = model(**_inputs())
    if arch == "BertForQuestionAnswering":
        return torch.stack([out.start_logits, out.end_logits], -1)
    return out.logits


def _hf_model(arch):
    torch.manual_seed(0)
    labels = LABELS[arch]
    kw = {} if labels is None else dict(id2label=dict(enumerate(labels)),
                                        label2id={l: i for i, l in enumerate(labels)})
    cfg = transformers.BertConfig(**TINY, **kw)
    return getattr(transformers, arch)(cfg).eval()


@pytest.mark.parametrize("arch", list(OURS))
def test_transformers_save_attnlab_load(arch, tmp_path):
    hf = _hf_model(arch)
    hf.save_pretrained(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a clean load: no missing or unused tensors
        ours = attnlab.load(tmp_path)
    assert type(ours) is OURS[arch]
    if LABELS[arch]:
        assert num_labels(ours.config) == len(LABELS[arch])
    with torch.no_grad():
        got = ours(**_inputs()).logits
    torch.testing.assert_close(_real(got), _real(_hf_logits(hf, arch)), atol=1e-5, rtol=0)


@pytest.mark.parametrize("arch", list(OURS))
def test_attnlab_save_transformers_load(arch, tmp_path):
    labels = LABELS[arch]
    src = tmp_path / "src"
    torch.manual_seed(0)
    transformers.BertModel(transformers.BertConfig(**TINY)).save_pretrained(src)  # a bare backbone, as MiniLM ships
    extra = {} if labels is None else dict(id2label={str(i): l for i, l in enumerate(labels)},
                                            label2id={l: i for i, l in enumerate(labels)}, num_labels=len(labels))
    with pytest.warns(UserWarning, match="newly initialised"):  # the fine-tuning case: a fresh head
        ours = attnlab.load(src, architecture=arch, extra=extra)
    torch.nn.init.normal_(ours.state_dict()[next(k for k in ours.state_dict() if not k.startswith("backbone."))])
    ours.eval().save(tmp_path / "out")
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["architectures"] == [arch]
    if labels:
        assert cfg["num_labels"] == len(labels) and cfg["id2label"]["1"] == labels[1]
        assert cfg["label2id"][labels[0]] == 0
    hf = getattr(transformers, arch).from_pretrained(tmp_path / "out").eval()
    if labels:
        assert hf.config.id2label[1] == labels[1] and hf.config.num_labels == len(labels)
    with torch.no_grad():
        want = ours(**_inputs()).logits
    torch.testing.assert_close(_real(_hf_logits(hf, arch)), _real(want), atol=1e-5, rtol=0)
    # and back again, unchanged
    again = attnlab.load(tmp_path / "out")
    with torch.no_grad():
        torch.testing.assert_close(again(**_inputs()).logits, want, atol=0, rtol=0)


def test_losses_match_transformers():
    inputs = _inputs()
    pad = inputs["attention_mask"] == 0
    for arch, kwargs in (("BertForSequenceClassification", dict(labels=torch.tensor([0, 2, 1]))),
                         ("BertForTokenClassification", dict(labels=torch.randint(0, 5, (3, 11)).masked_fill(
                             (torch.rand(3, 11) < 0.3) | pad, -100))),
                         ("BertForQuestionAnswering", dict(start_positions=torch.tensor([1, 3, 40]),  # 40: outside
                                                            end_positions=torch.tensor([2, 6, 40]))),):
        hf = _hf_model(arch)
        with tempfile.TemporaryDirectory() as sd_dir:
            hf.save_pretrained(sd_dir)
            ours = attnlab.load(sd_dir)
        x = dict(inputs)
        if arch == "BertForQuestionAnswering":  # its softmax spans padded positions too, whose logits differ
            x["attention_mask"] = torch.ones_like(x["attention_mask"])
        with torch.no_grad():
            torch.testing.assert_close(ours(**x, **kwargs).loss, hf(**x, **kwargs).loss, atol=1e-5, rtol=0)


def test_regression_head_uses_mse(tmp_path):
    torch.manual_seed(0)
    cfg = transformers.BertConfig(**TINY, num_labels=1, problem_type="regression")
    hf = transformers.BertForSequenceClassification(cfg).eval()
    hf.save_pretrained(tmp_path)
    ours = attnlab.load(tmp_path)
    y = torch.tensor([0.5, 3.0, 4.5])
    with torch.no_grad():
        out = ours(**_inputs(), labels=y)
        assert out.logits.shape == (3, 1)
        torch.testing.assert_close(out.loss, hf(**_inputs(), labels=y).loss, atol=1e-5, rtol=0)


def test_a_checkpoint_without_pooler_fine_tunes_with_a_fresh_one(tmp_path):
    """What MLM-only pretraining writes (BertForMaskedLM: no pooler) loads under a sequence classifier:
    the encoder weights exactly, the pooler and classifier new, named in a warning (transformers' behaviour)."""
    import attnlab
    from attnlab.heads import MaskedLM
    mlm = MaskedLM(attnlab.ModelConfig(vocab_size=40, hidden_size=16, num_layers=1, num_heads=2,
                                       intermediate_size=32, max_position_embeddings=16, pooler=False))
    mlm.save(tmp_path / "mlm")
    with pytest.warns(UserWarning, match=r"newly initialised.*backbone\.pooler\.dense\.weight"):
        clf = attnlab.load(tmp_path / "mlm", architecture="BertForSequenceClassification", extra={"num_labels": 2})
    assert torch.equal(clf.backbone.layers[0].attn.q.weight, mlm.backbone.layers[0].attn.q.weight)
    with pytest.raises(Exception, match="missing 1 tensors"):  # any other absent backbone tensor still fails
        from safetensors.torch import load_file, save_file
        sd = load_file(str(tmp_path / "mlm" / "model.safetensors"))
        del sd["bert.encoder.layer.0.attention.self.key.weight"]
        save_file(sd, str(tmp_path / "mlm" / "model.safetensors"))
        attnlab.load(tmp_path / "mlm", architecture="BertForSequenceClassification")
