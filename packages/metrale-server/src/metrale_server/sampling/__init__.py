"""Sampling: ``SamplingParams``, the batched sampler and its per-row tensors, logprobs."""
