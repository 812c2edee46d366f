"""Where models come from: `load_model` and `load_tokenizer` (loading.py), the embedded random-weight models (their
names, torch-free: embedded.py; their shapes as data: shapes.py; their weights drawn on the device:
random_init.py), and the byte-level tokenizer (tokenizer.py)."""
