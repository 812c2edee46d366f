"""Speculative decoding: draft several tokens, verify them in one forward of the model, keep the ones it agrees with.

options.py checks a call's speculation arguments (Hugging Face's names: prompt_lookup_num_tokens, assistant_model,
num_assistant_tokens); candidates.py drafts (prompt lookup, a draft model); accept.py holds the acceptance math
(greedy compare, speculative sampling); cache.py a model's cache whose rows keep different slots; rounds.py the
round loop of the eager presets, the reference. docs/SPECULATIVE.md explains the whole.
"""
