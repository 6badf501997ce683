"""The studies that made docs' figures and tables: one folder each, with its README (what it
measured, the commands, the docs that cite it) and its modules, run from the repository root as
``python -m studies.<folder>.<module>``. They drive caffe8 as a user would and share the run
helpers of ``studies._runs`` (scripts/ uses them too); their tests mirror them under
tests/studies/."""
