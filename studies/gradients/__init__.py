"""Gradients as the exchange sees them: see README.md beside this file."""
