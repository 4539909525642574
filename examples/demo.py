"""`make demo`: a tour of attnlab on bundled small data, offline, in a few minutes.

Each section shows one capability with a real model. Run it with `make demo`, or
`.venv/bin/python examples/demo.py` once `.venv` exists.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
MINILM = "sentence-transformers/all-MiniLM-L6-v2"  # resolved to the locally installed package, never downloaded
OUT = HERE.parent / "out" / "demo"  # everything the demo writes (git-ignored)


def cli(argv: list[str]) -> None:
    """Run one `attnlab` command; a failing step fails the demo instead of scrolling past."""
    from attnlab.cli import main as attnlab
    if attnlab(argv) != 0:
        raise SystemExit(f"demo: `attnlab {' '.join(argv)}` failed")


_last = [time.perf_counter()]


def section(title: str) -> None:
    now = time.perf_counter()
    print(f"(previous step: {now - _last[0]:.1f}s)", flush=True)  # where the demo's time goes
    _last[0] = now
    print(f"\n{'=' * 100}\n{title}\n{'=' * 100}", flush=True)


def show_info() -> None:
    section(f"1. attnlab info {MINILM}: what the model is made of, one layer walked through")
    cli(["info", MINILM, "--seq-len", "128"])
    cli(["info", "mixtral-8x7b", "--seq-len", "16"])  # a mixture of experts: 46.7B parameters, 12.9B active


def nearest_neighbours() -> None:
    import attnlab
    from attnlab.inference.embed import embed, read_lines
    section("2. sentence embeddings with the real all-MiniLM-L6-v2 weights: nearest neighbours")
    model, tokenizer = attnlab.load(MINILM), attnlab.load_tokenizer(MINILM)
    corpus = read_lines(HERE / "data" / "sentences.txt")
    start = time.perf_counter()
    vectors = embed(model, tokenizer, corpus, batch_size=16)
    print(f"embedded {len(corpus)} sentences into {vectors.shape[1]}-d vectors in {time.perf_counter() - start:.2f}s")
    queries = ["My pet cat is sleeping.", "How do neural networks understand language?",
               "Prices dropped on Wall Street today."]
    qv = embed(model, tokenizer, queries)
    for query, scores in zip(queries, qv @ vectors.T):
        print(f"\nquery: {query}")
        for i in np.argsort(-scores)[:3]:
            print(f"  {scores[i]:.3f}  {corpus[i]}")
    from attnlab.inference.quantize import calibration_batches, linear_precision, quantize
    int8 = quantize(model, "int8", calibration=calibration_batches(tokenizer))
    cos = (embed(int8, tokenizer, corpus, batch_size=16) * vectors).sum(-1)
    print(f"\nint8 ({linear_precision(int8)} linear layers: per-token int8 + SmoothQuant; `attnlab embed --dtype int8`): "
          f"cosine to fp32 min {cos.min():.4f}, mean {cos.mean():.4f} over the {len(corpus)} sentences")


def attention_page() -> None:
    section("3. attention views: one self-contained HTML page (head, model and neuron views)")
    cli(["viz", MINILM, "--text", "The cat sat on the mat.", "--text-b", "It was happy.",
          "--output", str(OUT / "attention.html")])
    print(f"open {OUT / 'attention.html'} in any browser (works offline)")


def chat_with_smollm2() -> None:
    section("4. a real pretrained decoder: SmolLM2-135M-Instruct from its GGUF file, KV-cached greedy decoding")
    print("attnlab generate smollm2 --chat --prompt 'What is the capital of France?'\n")
    cli(["generate", "smollm2", "--chat", "--prompt", "What is the capital of France?", "--max-new-tokens", "24"])
    print("\nhow well it predicts a text (~450 tokens; perplexity, bits per byte, word perplexity as JSON):")
    print(f"attnlab evaluate lm --model smollm2 --data {HERE / 'data' / 'sentences.txt'} --context 256\n")
    cli(["evaluate", "lm", "--model", "smollm2", "--data", str(HERE / "data" / "sentences.txt"), "--context", "256"])


_COMPILED_STEP = """
import sys, time
t0 = time.perf_counter()
import torch, attnlab
from attnlab.config import ModelConfig
from attnlab.inference import aot
from attnlab.inference.generate import generate
torch.manual_seed(0)  # the same weights in every process: the package is keyed on their bytes
cfg = ModelConfig(model_type="llama", vocab_size=512, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                  intermediate_size=192, position="rope", norm="rmsnorm", activation="swiglu", bias=False,
                  causal=True, max_position_embeddings=256)
model = attnlab.from_config(cfg).eval()
prompt = torch.tensor([[1, 2, 3, 4]])
out = generate(model, prompt, max_new_tokens=32, eos_token_id=[], compile=True)
took = time.perf_counter() - t0
same = torch.equal(out, generate(model, prompt, max_new_tokens=32, eos_token_id=[]))
print(f"  {sys.argv[1]}: {took:.1f}s from process start to 32 tokens; packages compiled {aot.counts['built']}, "
      f"loaded {aot.counts['loaded']}; the same tokens as eager decoding: {same}")
"""


def compiled_decoding() -> None:
    section("4a. compiled decoding without compiling twice: a small LLaMA-style decoder's step is compiled once "
            "(AOTInductor, saved under $ATTNLAB_CACHE/compiled), a new process loads it")
    import os
    import subprocess
    env = dict(os.environ, ATTNLAB_CACHE=str(OUT / "cache"))  # the demo's own cache (a real run: ~/.cache/attnlab)
    for run in ("first process", "second process"):
        done = subprocess.run([sys.executable, "-c", _COMPILED_STEP, run], env=env, capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"demo: compiled decoding failed:\n{done.stderr[-2000:]}")
        print(done.stdout.rstrip())
    print("  (SmolLM2-135M fp32: ~2 min to compile, a second process decodes 5.8 s after it starts, quiet; "
          "benchmarks/compile_start.py)")


def pretrain_char_gpt() -> None:
    section("5. pretraining from scratch: a character-level GPT on a bundled Shakespeare sample, then its curves")
    run = OUT / "gpt-char"
    cli(["pretrain", "--config", str(HERE.parent / "configs" / "pretrain-gpt-shakespeare-char.yaml"),
         f"data.files=[{HERE / 'data' / 'shakespeare-sample.txt'}]", f"data.path={OUT / 'corpus-char'}",
         "data.eval_batches=10", f"train.output_dir={run}", "train.max_steps=150", "train.warmup_steps=20",
         "train.eval_every=75", "train.log_every=25", "train.save_every=150",
         "train.compile=false"])  # 150 steps do not pay for the recipe's compile (~20 s on a fresh machine)
    cli(["plot", str(run)])
    print("\nsampling from the model trained a few seconds ago:")
    cli(["generate", str(run / "model"), "--prompt", "ROMEO:", "--max-new-tokens", "58",
         "--temperature", "0.8", "--seed", "0"])


def finetune_demo_sentiment(name: str, *flags: str, lr: str = "1e-4", epochs: str = "8") -> None:
    """`attnlab finetune sst2` on the demo's 40 + 10 sentences into OUT/name, with `flags` on top of the shared schedule."""
    data = HERE / "data"
    cli(["finetune", "sst2", "--model", MINILM, "--output", str(OUT / name), *flags, "--train",
         str(data / "sentiment-train.tsv"), "--valid", str(data / "sentiment-valid.tsv"), "--epochs", epochs,
         "--lr", lr, "--batch-size", "8", "--eval-every", "40", "--no-progress"])


def finetune_sentiment() -> None:
    section("6. fine-tuning: a classifier on all-MiniLM-L6-v2 (mean pooling, as its 1_Pooling says), then evaluate "
            "and predict")
    data = HERE / "data"  # 40 + 10 sentences written for this demo (the real GLUE runs read ATTNLAB_DATA)
    finetune_demo_sentiment("sentiment")
    print("\nattnlab evaluate sst2 on the 10 held-out sentences:")
    cli(["evaluate", "sst2", "--model", str(OUT / "sentiment"), "--data", str(data / "sentiment-valid.tsv")])
    cli(["predict", "sst2", "--model", str(OUT / "sentiment"), "--input", str(data / "sentiment-inputs.txt"),
         "--output", str(OUT / "sentiment-predictions.tsv")])
    inputs = (data / "sentiment-inputs.txt").read_text().splitlines()
    labels = (OUT / "sentiment-predictions.tsv").read_text().splitlines()
    print(f"\nattnlab predict ({OUT / 'sentiment-predictions.tsv'}; 1 = positive):")
    for text, label in zip(inputs, labels):
        print(f"  {label}  {text}")


def finetune_lora() -> None:
    section("6a. LoRA: the same classifier training only rank-8 adapters on the query/value projections + the head")
    finetune_demo_sentiment("sentiment-lora", "--lora", "r=8,alpha=16", lr="1e-3")
    print(f"(the adapter alone, in peft's layout: {OUT / 'sentiment-lora' / 'adapter'}; the merged model beside it)")


def finetune_averaged() -> None:
    section("6a'. the same classifier with layer-wise learning-rate decay (each layer down learns at 0.8x the one "
            "above) and an exponential moving average of the weights, the model kept and scored")
    finetune_demo_sentiment("sentiment-averaged", "--layer-decay", "0.8", "--ema", "0.9")
    print("(on the full SST-2 file, 3 epochs, --ema 0.999 kept 91.28% of the 872 held-out sentences against 90.71% "
          "without it (the same command otherwise; the best of 9 evaluations): README, fine-tuning)")


def finetune_soup() -> None:
    section("6c. a model soup: the section-6 classifier again with another seed, and the two runs' weights averaged "
            "into one model (attnlab soup), scored like either")
    finetune_demo_sentiment("sentiment-seed1", "--seed", "1")
    cli(["soup", str(OUT / "sentiment"), str(OUT / "sentiment-seed1"), "--output", str(OUT / "sentiment-soup")])
    cli(["evaluate", "sst2", "--model", str(OUT / "sentiment-soup"), "--data", str(HERE / "data" / "sentiment-valid.tsv")])
    print("(on the full SST-2 file two sets of three plain runs average to 91.40 and 90.60 on the 872 held-out "
          "sentences, +1.1 and +0.6 over their runs: README, fine-tuning)")


def finetune_with_teacher(name: str, flags: tuple[str, ...], measured: str) -> None:
    """A sentiment fine-tune that first trains a teacher (kept in OUT/name/teacher), and what it measured."""
    finetune_demo_sentiment(name, *flags)
    print(f"(the teacher is kept in {OUT / name / 'teacher'}. {measured}: README, fine-tuning)")


def finetune_self_trained() -> None:
    section("6a''. self-training on spans: a first fine-tune labels random spans of the 40 training sentences, and a "
            "fresh MiniLM trains on the confident ones with the labeled sentences")
    finetune_with_teacher("sentiment-self-trained", ("--self-train", "5"),
                          "At 1,000 SST-2 sentences it measured no gain over the plain fine-tune, so it is an option, "
                          "not a default")


def finetune_self_distilled() -> None:
    section("6a'''. self-distillation: after the same kind of teacher, a fresh MiniLM learns from the labels and "
            "the teacher's soft targets (born-again networks)")
    finetune_with_teacher("sentiment-self-distilled", ("--self-distill", "0.5"),
                          "On the full SST-2 file three students scored 90.48-90.71 (mean 90.60, +0.31 over their "
                          "teachers); at 1,000 sentences it lost, so it is an option")


def finetune_lm_teacher() -> None:
    section("6a''''. a bigger teacher: SmolLM2-135M tuned as a prompt classifier labels augmented copies of the 40 "
            "sentences, and a fresh MiniLM learns from them and the teacher's soft targets")
    # 2 epochs: the 40 sentences come with ~300 copies
    finetune_demo_sentiment("sentiment-lm-teacher", "--teacher", "smollm2", epochs="2")
    print(f"(the teacher's run log: {OUT / 'sentiment-lm-teacher' / 'teacher'}. From 500 to 1,999 SST-2 sentences it "
          "is the default, with SmolLM2's bottom 15 of 30 layers: at 900 the student scored 85.05% against 83.89% for "
          "the plain fine-tune (3 draws x 3 seeds), in ~4.3 minutes of two cores: README, fine-tuning)")


def learning_curve() -> None:
    section("6b. learning curve: accuracy vs labeled examples, MiniLM vs its architecture from random weights")
    data = HERE / "data"  # the same 40 + 10 demo sentences; the real curves use SST-2's 872-sentence hold-out
    out = OUT / "curve"
    cli(["curve", "sst2", "--model", MINILM, "--scratch", MINILM, "--sizes", "8,16,all", "--train",
         str(data / "sentiment-train.tsv"), "--valid", str(data / "sentiment-valid.tsv"), "--epochs", "8",
         "--lr", "1e-4", "--batch-size", "8", "--output", str(out)])
    print(f"(10 validation sentences: one is 10 points, so single runs are noisy; the plot is {out / 'curve.png'}; "
          "run the demo again and the curve is read back from curve.json instead of retrained)")


def serve_over_http() -> None:
    import json
    import socket
    import subprocess
    import urllib.request
    section("7. attnlab serve: the fine-tuned classifier over HTTP (OpenAI-shaped embeddings, classify)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    print(f"attnlab serve {OUT / 'sentiment'} --port {port}")
    server = subprocess.Popen([sys.executable, "-m", "attnlab", "serve", str(OUT / "sentiment"), "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def post(path: str, body: dict) -> dict:
        req = urllib.request.Request(url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())
    try:
        for _ in range(600):  # the server is up once /health answers
            try:
                with urllib.request.urlopen(url + "/health", timeout=1) as r:
                    print("GET /health ->", json.loads(r.read())["status"])
                break
            except OSError:
                if server.poll() is not None:
                    raise SystemExit("demo: attnlab serve exited early")
                time.sleep(0.1)
        texts = ["I would watch it again tomorrow.", "Never again, what a letdown."]
        out = post("/v1/classify", {"input": texts})
        for text, item in zip(texts, out["data"]):
            print(f"POST /v1/classify  {text!r} -> {item['label']} ({item['score']:.2f})")
        emb = post("/v1/embeddings", {"input": texts})
        print(f"POST /v1/embeddings -> {len(emb['data'])} vectors of {len(emb['data'][0]['embedding'])} numbers")
    finally:
        server.terminate()
        server.wait(30)


def encoder_decoder() -> None:
    section("8. an encoder-decoder: the original Transformer preset, encoder layer and decoder layer (cross-attention) walked through")
    cli(["info", "transformer-base", "--seq-len", "32", "--explain"])


def translate_toy() -> None:
    section("9. translation: a small original Transformer trained from scratch on 716 self-written en->de pairs "
            "(joint BPE), BLEU on 40 unseen word combinations")
    d, out = HERE / "data", OUT / "translation"
    cli(["finetune", "translation", "--src-lang", "en", "--tgt-lang", "de",
         "--train-src", str(d / "parallel-train.en"), "--train-tgt", str(d / "parallel-train.de"),
         "--valid-src", str(d / "parallel-valid.en"), "--valid-tgt", str(d / "parallel-valid.de"),
         "--output", str(out), "--set", "hidden_size=64", "--set", "num_layers=2", "--set", "num_heads=4",
         "--set", "intermediate_size=128", "--vocab-size", "200", "--max-tokens", "1024", "--epochs", "12",
         "--warmup", "100", "--lr-factor", "0.5", "--eval-every", "36", "--no-progress"])
    inputs = OUT / "translate-in.en"
    inputs.write_text("The horse sleeps in the snow.\nA girl waits on the beach.\n", encoding="utf-8")
    cli(["translate", str(out), "--input", str(inputs), "--output", str(OUT / "translate-out.de"), "--num-beams", "4"])
    for en, de in zip(inputs.read_text(encoding="utf-8").splitlines(),
                      (OUT / "translate-out.de").read_text(encoding="utf-8").splitlines()):
        print(f"  {en}  ->  {de}")
    cli(["evaluate", "translation", "--model", str(out), "--source", str(d / "parallel-valid.en"),
         "--reference", str(d / "parallel-valid.de")])


def denoise_bart() -> None:
    section("10. BART: a tiny denoising autoencoder (2+2 layers x 64) pretrained for a few seconds on the 38 demo "
            "sentences with text infilling, then asked to fill <mask>s")
    run = OUT / "bart"
    cli(["pretrain", "--config", str(HERE.parent / "configs" / "pretrain-bart-mini.yaml"),
         f"data.files=[{HERE / 'data' / 'sentences.txt'}]", f"data.path={OUT / 'corpus-bart'}",
         "data.tokenizer=bart-bpe:400", "data.seq_len=32", "data.batch_size=8", "data.heldout=0.3",
         "data.eval_batches=2", "model.hidden_size=64", "model.num_layers=2", "model.num_heads=4",
         "model.intermediate_size=128", "model.max_position_embeddings=34", "model.extra={num_decoder_layers: 2}",
         "model.dropout=0.0", "model.attention_dropout=0.0", "objective.noise_permute=0.0", f"train.output_dir={run}",
         "train.max_steps=200", "train.lr=5e-3", "train.warmup_steps=20", "train.log_every=50", "train.eval_every=200",
         "train.save_every=200", "train.progress=false"])
    masked = OUT / "bart-in.txt"
    masked.write_text("The cat slept on the <mask> all afternoon.\nHorses grazed <mask> in the green meadow.\n",
                      encoding="utf-8")
    cli(["translate", str(run / "model"), "--input", str(masked), "--output", str(OUT / "bart-out.txt")])
    print("(these sentences are in its 38 training sentences: it shows the objective and the pipeline - noise, "
          "reconstruct, generate - from a memorised text, not language understanding)")
    for src, out in zip(masked.read_text(encoding="utf-8").splitlines(),
                        (OUT / "bart-out.txt").read_text(encoding="utf-8").splitlines()):
        print(f"  {src}  ->  {out}")


def claims_as_experiments() -> None:
    section("12. the notes' claims as experiments (attnlab experiment --list): why scores are divided by sqrt(d_k)")
    cli(["experiment", "sqrt-dk", "--output", str(OUT / "experiments")])


def long_attention() -> None:
    import torch
    from attnlab import ModelConfig
    from attnlab.models.decoder import CausalLM
    from attnlab.nn.linear_attention import LinearAttentionCache
    section("11. beyond O(n^2): FlashAttention's tiled algorithm equals SDPA; linear attention decodes with an O(1) state")
    ids = torch.randint(0, 100, (1, 300))
    logits = {}
    for impl in ("sdpa", "tiled"):
        torch.manual_seed(0)
        cfg = ModelConfig(model_type="gpt2", vocab_size=100, hidden_size=64, num_layers=2, num_heads=4,
                          intermediate_size=128, max_position_embeddings=512, causal=True, type_vocab_size=0,
                          pooler=False, dropout=0.0, attention_dropout=0.0, attn_implementation=impl)
        logits[impl] = CausalLM(cfg).eval()(ids).logits
    print(f"  tiled vs sdpa, T=300: max |diff| {(logits['tiled'] - logits['sdpa']).abs().max():.1e}")
    model = CausalLM(cfg.replace(attention_kind="linear", attn_implementation="sdpa")).eval()
    with torch.no_grad():
        cache, steps = LinearAttentionCache(2), []
        for t in range(40):
            steps.append(model(ids[:, t:t + 1], past_key_values=cache, use_cache=True).logits)
        parallel = model(ids[:, :40]).logits
    print(f"  linear attention, recurrent (40 steps) vs parallel: max |diff| "
          f"{(torch.cat(steps, 1) - parallel).abs().max():.1e}; state per layer {tuple(cache.states[0][0].shape)}")


def prompting_reasoning() -> None:
    import json
    section("13. prompting without training: chain of thought and self-consistency (SmolLM2, generated arithmetic)")
    out = OUT / "arithmetic.json"
    argv = ["evaluate-prompting", "--model", "smollm2", "--task", "arithmetic", "--problems", "2", "--shots", "2",
            "--mode", "cot,self-consistency", "--samples", "3", "--temperature", "0.7", "--max-new-tokens", "40",
            "--output", str(out)]
    print("attnlab " + " ".join(argv) + "\n")
    cli(argv)
    result = json.loads(out.read_text())
    first = result["cot"]["outputs"][0]
    print(f"  a chain of thought: {first['text']!r} -> {first['answer']} (right: {first['gold']})")
    print(f"  self-consistency, 3 sampled paths -> their answers and the vote: "
          f"{[(o['paths'], o['answer'], o['gold']) for o in result['self-consistency']['outputs']]}")


def retrieval() -> None:
    section("14. retrieval: one MiniLM, two indexes - dense (one vector per passage, DPR-style) and ColBERT-style "
            "(one vector per token, MaxSim)")
    for kind in ("dense", "colbert"):
        cli(["index", str(HERE / "data" / "sentences.txt"), "--model", MINILM, "--kind", kind,
             "--output", str(OUT / f"index-{kind}")])
        cli(["search", str(OUT / f"index-{kind}"), "Which animal was chasing something indoors?", "-k", "2"])
    print("  (SQuAD dev recall@k and latency of both: experiments/retrieval/RESULTS.md)")


def distill_narrow_student() -> None:
    section("15. distillation: the section-6 classifier into a 2-layer, 192-wide student, TinyBERT's way "
            "(attention KL + projected hidden states)")
    data = HERE / "data"  # the demo's 40 + 10 sentences: a mechanics check, not an accuracy (SST-2's is in the README)
    cli(["distill", "--task", "sst2", "--teacher", str(OUT / "sentiment"), "--student-layers", "2",
         "--student-width", "192", "--style", "tinybert", "--output", str(OUT / "sentiment-tinybert"),
         "--train", str(data / "sentiment-train.tsv"), "--valid", str(data / "sentiment-valid.tsv"),
         "--epochs", "8", "--lr", "3e-4", "--batch-size", "8", "--no-progress"])
    print("\nattnlab evaluate sst2: the student on the 10 held-out sentences")
    cli(["evaluate", "sst2", "--model", str(OUT / "sentiment-tinybert"), "--data", str(data / "sentiment-valid.tsv")])
    print("(the student has 2 random 192-wide layers: 40 sentences teach them the mechanics, not sentiment, so expect "
          "chance here; with 16,000 SST-2 sentences of the teacher's soft targets such students keep 90-95% of "
          "its accuracy at 1/3 of its parameters: README, 'Distillation')")


def deberta_rtd() -> None:
    import json

    from attnlab.interop.local import resolve
    section("16. DeBERTa-v3: disentangled attention (c2p + p2c over relative positions) pretrained by replaced-token "
            "detection with gradient-disentangled embedding sharing, a few seconds on the demo sentences")
    cli(["info", "deberta-v3-base", "--seq-len", "128"])  # 183,831,552 parameters, the c2p / p2c steps per layer
    run = OUT / "deberta-v3"
    cli(["pretrain", "--config", str(HERE.parent / "configs" / "pretrain-deberta-v3-mini.yaml"),
         f"data.files=[{HERE / 'data' / 'sentences.txt'}]", f"data.path={OUT / 'corpus-deberta'}",
         f"data.tokenizer={resolve(MINILM)}", "data.seq_len=32", "data.batch_size=8", "data.heldout=0.3",
         "data.eval_batches=2", "model.hidden_size=64", "model.num_layers=2", "model.num_heads=4",
         "model.intermediate_size=128", "model.max_position_embeddings=64", "model.position_buckets=16",
         f"train.output_dir={run}", "train.max_steps=40", "train.lr=2e-3", "train.warmup_steps=5",
         "train.log_every=20", "train.eval_every=40", "train.save_every=40", "train.progress=false"])
    losses = [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    print(f"  loss (generator MLM + 50 x discriminator RTD) at steps 20, 40: {', '.join(f'{x:.2f}' for x in losses)}; "
          f"{run / 'model'} holds the discriminator (embeddings E_G + E_delta), {run / 'model' / 'generator'} a "
          "DebertaV2ForMaskedLM that transformers loads (a smoke run: 40 steps learn nothing of language)")


def xlnet_plm() -> None:
    import json

    import numpy as np

    import attnlab
    from attnlab.interop.local import resolve
    from attnlab.objectives.plm import plm_masks, sample_permutation
    section("17. XLNet: permutation language modelling with two-stream attention over Transformer-XL relative "
            "positions; one sampled factorization order, then a few seconds of pretraining on the demo sentences")
    tok = attnlab.load_tokenizer(resolve(MINILM))
    words = tok.convert_ids_to_tokens(tok("horses grazed quietly in a green meadow")["input_ids"][1:-1])
    valid = np.ones((1, len(words)), dtype=bool)
    s = sample_permutation(valid, 3, np.random.default_rng(0))  # K = 3 on so short a sentence (the paper: 6)
    perm, _ = plm_masks(valid, s["rank"], s["num_predict"], s["targets"])
    print("  factorization order: " + " -> ".join(words[p] for p in s["order"][0]))
    for pos in s["targets"][0]:
        seen = [words[j] for j in range(len(words)) if perm[0, pos, j] == 0]
        print(f"  predict {words[pos]!r:12} its query stream sees {seen} (its content stream also sees itself)")
    run = OUT / "xlnet"
    cli(["pretrain", "--config", str(HERE.parent / "configs" / "pretrain-xlnet-mini.yaml"),
         f"data.files=[{HERE / 'data' / 'sentences.txt'}]", f"data.path={OUT / 'corpus-xlnet'}",
         f"data.tokenizer={resolve(MINILM)}", "data.seq_len=32", "data.batch_size=8", "data.heldout=0.3",
         "data.eval_batches=2", "model.hidden_size=64", "model.num_layers=2", "model.num_heads=4",
         "model.intermediate_size=128", "objective.plm_k=3", f"train.output_dir={run}", "train.max_steps=60",
         "train.lr=3e-3", "train.warmup_steps=5", "train.log_every=20", "train.eval_every=60",
         "train.save_every=60", "train.progress=false"])
    losses = [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]
    print(f"  permutation-LM loss at steps 20, 40, 60: {', '.join(f'{x:.2f}' for x in losses[:3])} (ln V = "
          f"{np.log(tok.vocab_size):.2f}); {run / 'model'} is an XLNetLMHeadModel directory transformers loads "
          "(a smoke run on 38 sentences: the loss falls, nothing of language is learnt)")


def text_to_text() -> None:
    section("19. T5 as text-to-text: a tiny T5 from random weights learns to WRITE the label word "
            "('sst2 sentence: ...' -> positive / negative), scored on its greedy generations")
    data = HERE / "data"
    cli(["finetune", "sst2", "--text-to-text", "--model", "t5-small", "--set", "hidden_size=64", "--set",
         "num_layers=2", "--set", "num_heads=2", "--set", "head_dim=32", "--set", "intermediate_size=128",
         "--train", str(data / "sentiment-train.tsv"), "--valid", str(data / "sentiment-valid.tsv"),
         "--epochs", "15", "--batch-size", "8", "--lr", "2e-3", "--vocab-size", "300",
         "--output", str(OUT / "t5-sentiment"), "--no-progress"])
    print("\nattnlab evaluate reads the label words saved in its config.json (unknown = strings naming no label):")
    cli(["evaluate", "sst2", "--model", str(OUT / "t5-sentiment"), "--data", str(data / "sentiment-valid.tsv")])
    print("(40 sentences teach a random T5 the answer format, not sentiment: see the README for SST-2 runs)")


def xlm_tlm() -> None:
    import attnlab
    from attnlab.interop.local import resolve
    from attnlab.objectives.mlm import Vocab
    from attnlab.objectives.tlm import tlm_collate
    section("18. XLM's translation language modelling: a sentence and its translation in one input, masks on both "
            "sides, positions restarting at the second sentence, a language id per token")
    tok = attnlab.load_tokenizer(resolve(MINILM))
    en, de = "A dog runs across the grass.", "Ein Hund rennt über das Gras."
    batch = tlm_collate([(tok.encode(en), tok.encode(de))], (0, 1), Vocab.from_tokenizer(tok),
                        np.random.default_rng(3), prob=0.25, swap=False)
    tokens = tok.convert_ids_to_tokens(batch["input_ids"][0].tolist())
    for name, row in (("token", tokens), ("position", batch["position_ids"][0].tolist()),
                      ("language", batch["langs"][0].tolist()),
                      ("predict", [tok.convert_ids_to_tokens(x) if x >= 0 else "" for x in batch["labels"][0].tolist()])):
        print(f"  {name:<9}" + " ".join(f"{str(x):>7}" for x in row))
    print("  MLM vs MLM+TLM on Multi30k, scored by cross-lingual retrieval: experiments/xlm/RESULTS.md")


SECTIONS = [show_info, nearest_neighbours, attention_page, chat_with_smollm2, compiled_decoding, pretrain_char_gpt,
            finetune_sentiment, finetune_lora, finetune_averaged, finetune_self_trained, finetune_self_distilled,
            finetune_lm_teacher, learning_curve, finetune_soup,
            serve_over_http, encoder_decoder, translate_toy, denoise_bart, long_attention, claims_as_experiments, prompting_reasoning, retrieval,
            distill_narrow_student, deberta_rtd, xlnet_plm, xlm_tlm, text_to_text]


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    for run in SECTIONS:
        run()
    print(f"\ndemo finished in {time.perf_counter() - start:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
