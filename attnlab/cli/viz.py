"""Write a model's attention on a text as ONE self-contained HTML page (it works offline in any
browser), and optionally PNG heatmaps. Views: head (lines between tokens, per layer and head),
model (every layer x head as a small map), neuron (query, keys, q.k, scaled score and softmax for
one token); the page has all three, --view says which opens first. --pattern draws only which
token may see which (sliding window, global tokens, blocks) as a PNG, running nothing through the
model.

examples:
  attnlab viz minilm --text "The cat sat on the mat."
  attnlab viz minilm --text "The cat sat." --text-b "It was happy." --output pair.html --view model
  attnlab viz minilm --text "The cat sat." --view neuron --layer 2 --head 5 --png

Guide: docs/guides/inspection.md (XLNet streams, patterns: docs/guides/command-details.md)
"""
from __future__ import annotations

import argparse
from pathlib import Path

NAME = "viz"
HELP = "attention views of a model on a text, as one self-contained HTML page"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL", help="a model directory or packaged model name (e.g. minilm)")
    p.add_argument("--text", required=True, help="the text to look inside")
    p.add_argument("--text-b", help="a second sentence: the pair is encoded as [CLS] A [SEP] B [SEP]")
    p.add_argument("--output", "-o", default="attn.html", help="the HTML file to write (default attn.html)")
    p.add_argument("--view", choices=("head", "model", "neuron"), default="head", help="the view it opens on")
    p.add_argument("--layer", type=int, default=0, help="layer it opens on (default 0)")
    p.add_argument("--head", type=int, default=None, help="head it opens on (default: all heads)")
    p.add_argument("--stream", choices=("content", "query"), default="content",
                   help="XLNet: which of the two streams to show (query needs --order-seed)")
    p.add_argument("--order-seed", type=int, default=None,
                   help="XLNet: sample the factorization order with this seed (default: none, full attention)")
    p.add_argument("--png", action="store_true",
                   help="also write heatmaps: OUTPUT.png (every layer × head) and OUTPUT-L<l>H<h>.png")
    p.add_argument("--pattern", action="store_true",
                   help="write only the attention pattern (which token may see which) as OUTPUT with .png")
    p.add_argument("--global-tokens", default="",
                   help="with --pattern: comma-separated token positions that are global (Longformer), e.g. 0,5")


def run(args: argparse.Namespace) -> int:
    import attnlab
    from ..viz.attention import extract_text
    from ..viz.page import render_page, write_page
    model = attnlab.load(args.model)
    tokenizer = attnlab.load_tokenizer(args.model)
    title = "/".join(Path(str(args.model)).parts[-2:])  # "minilm", or the last two parts of a path
    if args.pattern:
        return _pattern(model, tokenizer, args, title)
    if getattr(model, "self_attention", True) is False:  # an RNN encoder-decoder: only its alignment
        return _alignment(model, tokenizer, args, title)
    if hasattr(model, "encoder") and hasattr(model, "decoder"):
        data = seq2seq_data(model, tokenizer, args.text, args.text_b, title)
    else:
        data = extract_text(model, tokenizer, args.text, args.text_b, neuron=True,
                            neuron_fallback=max(args.layer, 0), title=title, stream=args.stream,
                            order_seed=args.order_seed)
    page = write_page(args.output, render_page(data, view=args.view, layer=args.layer, head=args.head))
    print(f"wrote {page} ({page.stat().st_size / 1e3:.0f} kB, {len(data.tokens)} tokens, "
          f"{data.num_layers} layers × {data.num_heads} heads); open it in any browser")
    if args.png:
        from ..viz.heatmaps import save_heatmaps
        for png in save_heatmaps(data, Path(args.output).with_suffix(".png"), layer=args.layer,
                                 head=args.head or 0):
            print(f"wrote {png}")
    return 0


def _pattern(model, tokenizer, args: argparse.Namespace, title: str) -> int:
    from ..viz.patterns import attention_pattern, save_pattern
    if not args.text or not args.text.strip():
        raise ValueError("--text is empty: give the input whose attention pattern to draw")
    try:
        glob = [int(x) for x in args.global_tokens.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--global-tokens {args.global_tokens!r}: expected comma-separated token positions") from None
    enc = tokenizer(args.text, args.text_b, return_tensors="pt") if args.text_b else \
        tokenizer(args.text, return_tensors="pt")
    tokens = enc.tokens(0)
    allowed, how = attention_pattern(model.config, len(tokens), glob, layer=args.layer, head=args.head or 0)
    png = save_pattern(allowed, tokens, Path(args.output).with_suffix(".png"), f"{title}: {how}")
    print(f"wrote {png} ({len(tokens)} tokens; {how})")
    return 0


def _alignment(model, tokenizer, args: argparse.Namespace, title: str) -> int:
    """An RNN encoder-decoder has no self-attention: draw where its decoder looked in the source at each
    output step (Bahdanau et al. 2015, Fig. 3), as a PNG next to --output."""
    import torch

    from ..inference.seq2seq import generate
    from ..viz.heatmaps import save_alignment
    if model.attention == "none":
        raise ValueError(f"{args.model}: an RNN encoder-decoder without attention (extra.attention=none) has no "
                         "alignment to show: its decoder reads only the encoder's final state")
    src = tokenizer(args.text, return_tensors="pt")
    if args.text_b is None:
        dec = generate(model, src["input_ids"], max_new_tokens=48)
    else:
        start = torch.tensor([[model.decoder_start_token_id]])
        dec = torch.cat([start, tokenizer(args.text_b, return_tensors="pt")["input_ids"]], dim=1)
    with torch.inference_mode():
        weights = model(input_ids=src["input_ids"], decoder_input_ids=dec[:, :-1],
                        output_attentions=True).cross_attentions[0][0, 0]
    targets = tokenizer.convert_ids_to_tokens(dec[0, 1:].tolist())  # row t: the step that produced token t
    png = save_alignment(weights, src.tokens(0), targets, Path(args.output).with_suffix(".png"),
                         title=f"{title}: {model.attention} attention")
    print(f"wrote {png} ({len(targets)} target x {len(src.tokens(0))} source tokens)")
    return 0


def seq2seq_data(model, tokenizer, source: str, target: str | None, title: str):
    """An encoder-decoder: the decoder's self- and cross-attention for `target` (--text-b), or, without
    one, for the model's own greedy output on `source` (--text)."""
    import torch

    from ..inference.seq2seq import generate
    from ..viz.attention import extract_seq2seq
    if not source or not source.strip():
        raise ValueError("--text is empty: give the source sentence to look inside")
    src = tokenizer(source, return_tensors="pt")
    start = torch.tensor([[model.decoder_start_token_id]])
    if target is None:
        with torch.inference_mode():
            dec = generate(model, src["input_ids"], max_new_tokens=48)
    else:
        dec = torch.cat([start, tokenizer(target, return_tensors="pt")["input_ids"]], dim=1)
    target_tokens = ["<start>"] + tokenizer.convert_ids_to_tokens(dec[0, 1:].tolist())
    return extract_seq2seq(model, src["input_ids"], dec, src.tokens(0), target_tokens, title=title)
