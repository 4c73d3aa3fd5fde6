"""Pooling requests: embeddings and reranker scores read from a prompt's hidden states."""

from metrale_server.pooling.params import POOLING_METHODS, PoolingMethod, PoolingParams

__all__ = ["POOLING_METHODS", "PoolingMethod", "PoolingParams"]
