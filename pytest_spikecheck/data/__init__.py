"""Corpus, tokenizer and batch samplers."""
