"""What the tests share: oracles, batches, tiny models and the kernels' interpreter patches. No test module imports
another; each imports from here."""
