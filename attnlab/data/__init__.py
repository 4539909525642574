"""Corpora -> token shards (`prepare_corpus`, `open_shards`); see corpus.py and shards.py."""
from .corpus import CorpusReader, Document, split_sentences
from .shards import Shard, open_shards, prepare_corpus, read_meta

__all__ = ["CorpusReader", "Document", "Shard", "open_shards", "prepare_corpus", "read_meta", "split_sentences"]
