"""Speculative decoding: the n-gram proposer and the verification of its drafts."""

from metrale_server.speculative.ngram import propose_ngram
from metrale_server.speculative.verify import target_probs, verify_greedy, verify_sampled

__all__ = ["propose_ngram", "target_probs", "verify_greedy", "verify_sampled"]
