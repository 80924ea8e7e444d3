"""The model: loading, the encoder module with its pooling and heads, the sentence-transformers format
(written once, in st_format), unpadded layers, oneDNN linears, adapters, precision and the model card."""
