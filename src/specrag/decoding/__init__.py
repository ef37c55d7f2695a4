"""Decoding engines: plain typed tensor code, no LangGraph and no LangChain inside.

* :mod:`.state` - a causal LM paired with its own KV cache (extend / crop).
* :mod:`.sampling` - logits -> probabilities, greedy or tempered sampling.
* :mod:`.speculative` - decoding verified against deterministic candidates (draft or prompt
  n-grams): greedy output identical to plain decoding, sampling distribution unchanged.
* :mod:`.candidates` - the n-gram candidate generator over the draft and the prompt.
* :mod:`.rapid` - RAPID: a drafter on retrieved chunks, a target on the whole document.
* :mod:`.prefix_cache` - reuse of a long document's KV cache across questions.
"""
