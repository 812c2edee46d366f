"""The `fused` decode path: the project's own one-token step (Triton kernels on CUDA, their torch twins
elsewhere) on weights re-laid out once, for the Llama family, GPT-2 and the decoders of layout.DECODERS. See
docs/KERNELS.md.

path.py is what a decoder imports on every call; it imports the rest (and so Triton) only where a fused call runs."""
