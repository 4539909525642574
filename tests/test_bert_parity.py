"""attnlab vs transformers on the same weights: the real MiniLM checkpoint on real sentences, and
random-init BertForPreTraining round trips in both directions."""
import csv
import warnings

import pytest
import torch

import attnlab
from attnlab.interop.files import CheckpointError

transformers = pytest.importorskip("transformers")


def sst2_sentences(data_dir, n):
    with open(data_dir / "glue" / "SST-2" / "train.tsv", encoding="utf-8") as fh:
        rows = list(csv.reader(fh, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]
    # spread over the file so lengths vary (short phrases and long sentences)
    step = len(rows) // n
    return [rows[i * step][0] for i in range(n)]


@torch.no_grad()
def test_minilm_hidden_states_and_embeddings_match_transformers(minilm, data_dir):
    sentences = sst2_sentences(data_dir, 256)
    tok = attnlab.load_tokenizer(minilm)
    ours = attnlab.load(minilm)
    theirs = transformers.BertModel.from_pretrained(minilm).eval()
    worst, cos_min, padded = 0.0, 1.0, 0
    for i in range(0, len(sentences), 32):
        batch = tok(sentences[i:i + 32], padding=True, return_tensors="pt")
        padded += int((batch["attention_mask"] == 0).sum())
        a = ours(**batch).last_hidden_state
        b = theirs(**batch).last_hidden_state
        real = batch["attention_mask"].bool()
        worst = max(worst, (a - b)[real].abs().max().item())
        m = batch["attention_mask"].unsqueeze(-1).float()
        ea = torch.nn.functional.normalize((a * m).sum(1) / m.sum(1), dim=-1)
        eb = torch.nn.functional.normalize((b * m).sum(1) / m.sum(1), dim=-1)
        cos_min = min(cos_min, (ea * eb).sum(-1).min().item())
    assert padded > 0, "the batches must contain padding for this test to mean something"
    assert worst <= 1e-5, worst
    assert cos_min >= 0.99999, cos_min


@torch.no_grad()
def test_eager_and_sdpa_give_the_same_real_outputs(minilm):
    tok = attnlab.load_tokenizer(minilm)
    batch = tok(["a short one", "a considerably longer sentence with several more words in it"],
                padding=True, return_tensors="pt")
    sdpa = attnlab.load(minilm)
    eager = attnlab.load(minilm)
    for layer in eager.layers:
        layer.attn.explicit = True
    a = sdpa(**batch).last_hidden_state
    out = eager(**batch, output_attentions=True)
    real = batch["attention_mask"].bool()
    assert (a - out.last_hidden_state)[real].abs().max() <= 1e-5
    t = batch["input_ids"].shape[1]
    assert len(out.attentions) == 6 and out.attentions[0].shape == (2, 12, t, t)


def hf_pretraining(hidden, layers, heads, inter, vocab=30522, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.BertConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                                  intermediate_size=inter, vocab_size=vocab)
    return transformers.BertForPreTraining(cfg).eval()


def inputs(vocab, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(min(1000, vocab // 2), vocab, (3, 20), generator=g)
    ids[:, 0] = 101
    mask = torch.ones_like(ids)
    mask[1, 14:] = 0
    mask[2, 7:] = 0
    types = torch.zeros_like(ids)
    types[:, 10:] = 1
    return dict(input_ids=ids, attention_mask=mask, token_type_ids=types)


def compare(ours, theirs, batch):
    a, b = ours(**batch), theirs(**batch)
    real = batch["attention_mask"].bool()
    return ((a.logits - b.prediction_logits)[real].abs().max().item(),
            (a.nsp_logits - b.seq_relationship_logits).abs().max().item())


@pytest.mark.parametrize("shape", [(64, 2, 4, 128), (768, 12, 12, 3072)], ids=["small", "bert-base"])
@torch.no_grad()
def test_pretraining_round_trips(tmp_path, shape):
    theirs = hf_pretraining(*shape)
    theirs.save_pretrained(tmp_path / "hf")
    ours = attnlab.load(tmp_path / "hf")
    assert type(ours).__name__ == "PreTraining"
    batch = inputs(30522)
    mlm, nsp = compare(ours, theirs, batch)
    assert mlm <= 1e-5 and nsp <= 1e-5, (mlm, nsp)
    # and back: attnlab writes, transformers reads
    ours.save(tmp_path / "ours")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # transformers must find every tensor it expects
        again = transformers.BertForPreTraining.from_pretrained(tmp_path / "ours").eval()
    mlm, nsp = compare(ours, again, batch)
    assert mlm <= 1e-5 and nsp <= 1e-5, (mlm, nsp)
    assert again.cls.predictions.decoder.weight.data_ptr() == again.bert.embeddings.word_embeddings.weight.data_ptr()


@torch.no_grad()
def test_pytorch_bin_loads_with_weights_only(tmp_path):
    theirs = hf_pretraining(32, 1, 2, 64, vocab=200)
    # transformers 5 writes safetensors only; an older checkpoint is a pickled state dict
    torch.save(theirs.state_dict(), tmp_path / "pytorch_model.bin")
    theirs.config.save_pretrained(tmp_path)
    ours = attnlab.load(tmp_path, architecture="BertForPreTraining")
    batch = inputs(200)
    mlm, nsp = compare(ours, theirs, batch)
    assert mlm <= 1e-5 and nsp <= 1e-5


def test_backbone_checkpoint_into_head_wrapper_warns_by_name(minilm):
    with pytest.warns(UserWarning, match="newly initialised.*nsp.linear.weight"):
        model = attnlab.load(minilm, architecture="BertForPreTraining")
    ref = attnlab.load(minilm)
    assert torch.equal(model.backbone.layers[3].ffn.up.weight, ref.layers[3].ffn.up.weight)


def corrupted_checkpoint(tmp_path, edit):
    """A small random BertForPreTraining saved by transformers, its tensors edited by `edit(sd)`."""
    from safetensors.torch import load_file, save_file
    hf_pretraining(32, 2, 2, 64, vocab=200).save_pretrained(tmp_path)
    sd = load_file(tmp_path / "model.safetensors")
    edit(sd)
    save_file(sd, tmp_path / "model.safetensors")
    return tmp_path


def test_missing_tensor_is_named(tmp_path):
    path = corrupted_checkpoint(tmp_path, lambda sd: sd.pop("bert.encoder.layer.1.attention.self.key.weight"))
    with pytest.raises(CheckpointError, match=r"missing 1 tensors: bert\.encoder\.layer\.1\.attention\.self\.key\.weight"):
        attnlab.load(path)


def test_shape_mismatch_names_tensor_and_shapes(tmp_path):
    path = corrupted_checkpoint(tmp_path, lambda sd: sd.update(
        {"bert.encoder.layer.0.intermediate.dense.weight": torch.zeros(65, 32)}))
    with pytest.raises(CheckpointError, match=r"layers\.0\.ffn\.up\.weight: checkpoint \(65, 32\) vs model \(64, 32\)"):
        attnlab.load(path)


def test_unexpected_tensor_is_named(tmp_path):
    path = corrupted_checkpoint(tmp_path, lambda sd: sd.update({"bert.encoder.layer.0.surprise.weight": torch.zeros(3)}))
    with pytest.warns(UserWarning, match=r"unused tensors.*surprise\.weight"):
        attnlab.load(path)


def test_missing_config_and_weights_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        attnlab.load(tmp_path)
    (tmp_path / "config.json").write_text('{"model_type": "bert", "hidden_size": 32, "num_attention_heads": 2, '
                                          '"num_hidden_layers": 1, "intermediate_size": 64, "vocab_size": 100}')
    with pytest.raises(FileNotFoundError, match="no weights found"):
        attnlab.load(tmp_path)
    (tmp_path / "config.json").write_text('{"model_type": "bert", ')
    with pytest.raises(ValueError, match="not valid JSON"):
        attnlab.load(tmp_path)
    (tmp_path / "config.json").write_text('{"model_type": "wavenet"}')
    with pytest.raises(ValueError, match="model_type='wavenet' is not supported"):
        attnlab.load(tmp_path)


def test_bad_inputs_are_named(minilm):
    model = attnlab.load(minilm)
    with pytest.raises(ValueError, match="token id 40000 is outside the vocabulary"):
        model(input_ids=torch.tensor([[101, 40000, 102]]))
    with pytest.raises(ValueError, match=r"attention_mask has shape \(1, 2\)"):
        model(input_ids=torch.tensor([[101, 102, 0]]), attention_mask=torch.ones(1, 2))
    with pytest.raises(ValueError, match="max_position_embeddings=512"):
        model(input_ids=torch.full((1, 600), 1000))
