"""Speculative decoding: the n-gram, draft-model and MTP proposers, and the verification of
drafts."""

from metrale_server.speculative.draft_model import DraftModelProposer, check_same_tokenizer
from metrale_server.speculative.mtp import MtpProposer, check_mtp_model
from metrale_server.speculative.ngram import propose_ngram
from metrale_server.speculative.verify import target_probs, verify_greedy, verify_sampled

__all__ = [
    "DraftModelProposer",
    "MtpProposer",
    "check_mtp_model",
    "check_same_tokenizer",
    "propose_ngram",
    "target_probs",
    "verify_greedy",
    "verify_sampled",
]
