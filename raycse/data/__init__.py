"""Corpus reading and batch construction (the first floors of the data flow)."""
