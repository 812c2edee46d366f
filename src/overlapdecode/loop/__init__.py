"""The decode loop's machinery: the step objects (steps.py), the stop checks (stopping.py), the hand-captured
step (step_graph.py), the profiler's phase markers (markers.py) and the recompile limits (compiling.py).

It knows no Hugging Face cache class and no fused kernel: decode.py hands it a plan and the step objects of
hf/ or fused/, and it runs them the same way."""
