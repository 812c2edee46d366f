"""The benchmark (`overlapdecode bench`), the profiler view (`overlapdecode profile`) and the report.

It calls only the public API (`overlapdecode.generate`, `load_model`) and Hugging Face `generate()` as a
peer; plots and tables read only the JSON it writes.
"""
