"""The performance model (caffe8.comm.perf_model) against Oyama et al.'s figure 7 and against
measured runs: see README.md beside this file."""
