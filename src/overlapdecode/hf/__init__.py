"""The Hugging Face adapters: the KV-cache kinds (caches.py, sliding_cache.py), what a model's layers are
(architecture.py) and what a strategy cannot serve (refusals.py), and the patches a compiled step needs (rope.py,
graph_experts.py). The only folder that knows transformers' cache and masking classes."""
