"""Triton decode kernels, each beside its plain-PyTorch reference."""
