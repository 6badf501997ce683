"""Scaling and overlap: see README.md beside this file."""
