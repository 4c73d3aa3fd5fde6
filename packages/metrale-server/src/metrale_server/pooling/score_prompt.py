"""The prompt a yes/no reranker scores a (query, document) pair with: Qwen3-Reranker's.

The score is the probability of ``yes`` against ``no`` as the next token
(:attr:`~metrale_server.pooling.params.PoolingParams.score_token_ids`).
"""

from __future__ import annotations

DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
SCORE_PROMPT_PREFIX = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query "
    'and the Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n'
    "<|im_start|>user\n"
)
SCORE_PROMPT_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def score_prompt(query: str, document: str, instruction: str = DEFAULT_INSTRUCTION) -> str:
    """The whole prompt text; it is tokenized without the tokenizer's special tokens."""
    body = f"<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}"
    return SCORE_PROMPT_PREFIX + body + SCORE_PROMPT_SUFFIX
