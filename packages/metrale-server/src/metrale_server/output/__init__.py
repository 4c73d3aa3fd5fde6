"""Output processing: incremental detokenization, stop strings, request outputs."""
