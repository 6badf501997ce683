"""Solvers and learning-rate policies."""
