"""The papers' tables recomputed: see README.md beside this file."""
