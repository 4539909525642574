"""The SST-2 files the LoRA and prompting runs share, exactly as research/fewlabel/sst2_fewlabel.py builds
them: the 872 clean held-out sentences (whole sentences, none of their phrases left in training) and 1,000
whole training sentences (draw 0).
    python research/lora/sst2_split.py OUT_DIR   ->  OUT_DIR/heldout-872.tsv, OUT_DIR/train-1000.tsv
"""
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fewlabel"))
from sst2_fewlabel import _write, sentences_of  # noqa: E402

from attnlab.tasks import get_task  # noqa: E402
from attnlab.tasks.base import data_root  # noqa: E402
from attnlab.tasks.splits import sentence_holdout  # noqa: E402

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
task = get_task("sst2")
rest, held = sentence_holdout(task.read(data_root() / task.train_file), 872, 0)
_write(out / "heldout-872.tsv", held)
_write(out / "train-1000.tsv", random.Random(0).sample(sentences_of(rest), 1000))
