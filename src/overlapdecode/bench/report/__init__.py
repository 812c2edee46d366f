"""The bench's results and report: the results file (results.py), the output directory every file is written
into (outdir.py), figures computed from the rows (figures.py), the claims they support (claims.py), the tables
and plots (report.py, plots.py, markdown.py), the README's results table (results_table.py) and the
tensor-parallel summaries (gather.py, tp_summary.py). It reads the bench's JSON only."""
