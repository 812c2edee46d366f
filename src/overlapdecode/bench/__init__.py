"""The lab: the benchmark (`overlapdecode bench`: runner.py, worker.py), the profiler view (`overlapdecode profile`:
profile.py, timeline.py), the scale sweep's figures (scale.py) and the report (report/). Their commands are
cli/bench.py's.

It measures through the public API (`overlapdecode.generate`, `load_model`) and asks facts.py for what it must
know of a model beyond it, with Hugging Face `generate()` as a peer; plots and tables read only the JSON it writes.
"""
