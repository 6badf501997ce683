"""Accuracy of the exchange variants: see README.md beside this file."""
