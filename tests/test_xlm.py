"""XLM and XLM-R (issue 23): parity with transformers both ways (language ids given), the xlm-roberta
preset's size, and the TLM objective (Lample & Conneau 2019, §3.3): positions reset at the second
sentence, language ids per side, both sides masked at the configured rate, and a model trained with it
predicts a masked word better when the translation is in the input."""
import json

import numpy as np
import pytest
import torch

from _families import padded_inputs, randomize, roundtrip
from attnlab.config import ModelConfig, preset
from attnlab.heads import MaskedLM
from attnlab.models.encoder import Encoder
from attnlab.objectives.mlm import IGNORE, Vocab, mlm_loss
from attnlab.objectives.tlm import mono_collate, tlm_collate

transformers = pytest.importorskip("transformers")
PAD = 2
XLM_TINY = dict(vocab_size=99, emb_dim=32, n_layers=2, n_heads=4, max_position_embeddings=40, n_langs=3,
                use_lang_emb=True, pad_token_id=PAD)


def _langs(mask: torch.Tensor) -> torch.Tensor:
    """A language per row, switching half-way along the first row as a TLM pair does."""
    langs = torch.tensor([[0], [1], [2]]).expand_as(mask).clone()
    langs[0, 6:] = 2
    return langs


@pytest.mark.parametrize("arch,ours_key,extra", [
    ("XLMModel", "last_hidden_state", {}),
    ("XLMWithLMHeadModel", "logits", {}),
    ("XLMModel", "last_hidden_state", {"sinusoidal_embeddings": True, "gelu_activation": False}),
])
def test_xlm_parity_and_save_back(arch, ours_key, extra, tmp_path):
    torch.manual_seed(0)
    hf = randomize(getattr(transformers, arch)(transformers.XLMConfig(**XLM_TINY, **extra)))
    if extra.get("sinusoidal_embeddings"):  # the table is fixed in XLM: undo the perturbation
        from transformers.models.xlm.modeling_xlm import create_sinusoidal_embeddings
        table = hf.position_embeddings.weight
        with torch.no_grad():
            table.copy_(create_sinusoidal_embeddings(*table.shape, out=torch.empty_like(table)))
    ids, mask = padded_inputs(99, PAD)
    inputs = dict(input_ids=ids, attention_mask=mask, langs=_langs(mask))
    diff, back, ours = roundtrip(hf, tmp_path, ours_key, ours_key, inputs, mask)
    assert diff <= 1e-5 and back <= 1e-5, (diff, back)
    assert ours.hf_architecture == arch and ours.config.num_languages == 3
    saved = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert saved["model_type"] == "xlm" and saved["n_langs"] == 3 and "head_transform" not in saved
    assert saved["sinusoidal_embeddings"] == bool(extra.get("sinusoidal_embeddings"))
    # the language embeddings matter: other ids, other outputs
    with torch.no_grad():
        other = getattr(ours(input_ids=ids, attention_mask=mask, langs=(_langs(mask) + 1) % 3), ours_key)
        same = getattr(ours(**inputs), ours_key)
    assert (other - same)[mask.bool()].abs().max() > 1e-3


def test_langs_checked():
    model = Encoder(ModelConfig(vocab_size=20, hidden_size=8, num_layers=1, num_heads=2, intermediate_size=16,
                                num_languages=2)).eval()
    ids = torch.tensor([[3, 4, 5]])
    with pytest.raises(ValueError, match=r"langs must lie in \[0, 2\)"):
        model(input_ids=ids, langs=torch.tensor([[0, 1, 2]]))
    with pytest.raises(ValueError, match="langs has shape"):
        model(input_ids=ids, langs=torch.tensor([[0, 1]]))
    with pytest.raises(ValueError, match="num_languages=0"):
        Encoder(ModelConfig(vocab_size=20, hidden_size=8, num_layers=1, num_heads=2, intermediate_size=16))(
            input_ids=ids, langs=torch.zeros_like(ids))


@pytest.mark.parametrize("arch,key", [("XLMRobertaModel", "last_hidden_state"), ("XLMRobertaForMaskedLM", "logits")])
def test_xlm_roberta_parity_and_save_back(arch, key, tmp_path):
    torch.manual_seed(0)
    cfg = transformers.XLMRobertaConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                        intermediate_size=37, max_position_embeddings=40, type_vocab_size=1,
                                        pad_token_id=1, bos_token_id=0, eos_token_id=2)
    hf = randomize(getattr(transformers, arch)(cfg))
    ids, mask = padded_inputs(99, 1, left_pad_row=True)
    diff, back, ours = roundtrip(hf, tmp_path, key, key, dict(input_ids=ids, attention_mask=mask), mask)
    assert diff <= 1e-5 and back <= 1e-5, (diff, back)
    assert ours.hf_architecture == arch
    assert json.loads((tmp_path / "ours" / "config.json").read_text())["model_type"] == "xlm-roberta"


@pytest.mark.parametrize("name,hf_cls,hf_cfg", [
    ("xlm-roberta-base", "XLMRobertaModel", lambda: transformers.XLMRobertaConfig(
        vocab_size=250002, max_position_embeddings=514, type_vocab_size=1, layer_norm_eps=1e-5)),
    ("xlm-mlm-enfr-1024", "XLMModel", lambda: transformers.XLMConfig(
        vocab_size=64139, emb_dim=1024, n_layers=6, n_heads=8, n_langs=2)),
])
def test_preset_parameter_count(name, hf_cls, hf_cfg):
    with torch.device("meta"):
        ours = Encoder(preset(name)).num_parameters()
        theirs = getattr(transformers, hf_cls)(hf_cfg()).num_parameters()
    assert ours == theirs, (ours, theirs)


# ------------------------------------------------------------------------------------------------- TLM
SPECIALS = np.array([0, 1, 2, 3, 4])  # [PAD] [UNK] [CLS] [SEP] [MASK]
VOCAB = Vocab(size=45, mask_id=4, special_ids=SPECIALS, continuation=None)


def _topic_pairs(rng, n: int):
    """A toy parallel corpus whose meaning is a topic t of 5: the A side is 4 words of topic t's 4 A-words
    (ids 5 + 4t ..), the B side one of its 4 B-words (ids 25 + 4t ..). B alone says nothing of its word
    (1 of 20); with A visible it is 1 of 4."""
    topics = rng.integers(0, 5, n)
    return [([2, *(5 + 4 * t + rng.integers(0, 4, 4)).tolist(), 3], [2, int(25 + 4 * t + rng.integers(0, 4)), 3])
            for t in topics]


def test_tlm_positions_languages_and_masking_rate():
    rng = np.random.default_rng(0)
    pairs = [([2, *range(5, 5 + n), 3], [2, *range(25, 25 + m), 3]) for n, m in ((20, 30), (40, 10), (7, 25))] * 20
    batch = tlm_collate(pairs, (0, 1), VOCAB, rng, prob=0.2)
    flips = 0
    for i, (a, b) in enumerate(pairs):
        valid = batch["attention_mask"][i].bool()
        langs, pos = batch["langs"][i][valid], batch["position_ids"][i][valid]
        first_lang = int(langs[0])
        flips += first_lang
        n1 = len(b) if first_lang else len(a)
        n2 = len(a) if first_lang else len(b)
        assert langs.tolist() == [first_lang] * n1 + [1 - first_lang] * n2
        assert pos.tolist() == list(range(n1)) + list(range(n2))  # reset where the second sentence starts
        labels = batch["labels"][i][valid]
        for part, n in ((labels[:n1], n1), (labels[n1:], n2)):  # each side: round(0.2 * its words) predicted
            assert int((part != IGNORE).sum()) == max(1, round(0.2 * (n - 2)))
        original = torch.tensor((b + a) if first_lang else (a + b))
        chosen = labels != IGNORE
        assert torch.equal(labels[chosen], original[chosen])
        assert not chosen[original < 5].any()  # specials never chosen
    assert 10 < flips < 50  # both orders drawn (60 pairs)
    assert torch.equal(batch["masked_positions"], batch["labels"] != IGNORE)


def test_mono_collate_languages():
    batch = mono_collate([[2, 5, 6, 7, 3], [2, 30, 3]], [1, 0], VOCAB, np.random.default_rng(0))
    assert batch["langs"].tolist() == [[1] * 5, [0] * 5]
    assert batch["attention_mask"].tolist() == [[1] * 5, [1, 1, 1, 0, 0]]


def test_tlm_uses_the_other_language():
    """A tiny encoder trained with TLM predicts a masked word of one language better when its translation is
    in the input than from its own side alone: the cross-lingual context is what TLM teaches to use (§3.3)."""
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    model = MaskedLM(ModelConfig(vocab_size=45, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                                 max_position_embeddings=16, type_vocab_size=0, num_languages=2, pooler=False,
                                 dropout=0.0, attention_dropout=0.0))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(200):
        loss, _ = mlm_loss(model, tlm_collate(_topic_pairs(rng, 32), (0, 1), VOCAB, rng))
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    test = _topic_pairs(np.random.default_rng(1), 256)
    both = tlm_collate(test, (0, 1), VOCAB, np.random.default_rng(2), swap=False)
    both["labels"][:, :6] = IGNORE  # score the B word only: A ([CLS] + 4 words + [SEP]) comes first
    both["masked_positions"] = both["labels"] != IGNORE
    alone = mono_collate([b for _, b in test], [1] * len(test), VOCAB, np.random.default_rng(2))
    with torch.no_grad():
        with_translation, _ = mlm_loss(model, both)
        own_side_only, _ = mlm_loss(model, alone)
    # chance is ln 20 = 3.0 nats alone and ln 4 = 1.4 with the topic known (less the 10% kept unmasked)
    assert with_translation < 2.0 and own_side_only - with_translation > 0.8, \
        (float(with_translation), float(own_side_only))
