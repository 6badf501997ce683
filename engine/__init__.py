"""caffe8's ground floor: backend, prototxt and schema, Blob, Layer, Net, data plumbing, the
training loop, log, snapshots.

It imports nothing above it (``layers``, ``solvers``, ``comm``, ``caffe8``). The public entry
point is ``import caffe8``, which also registers the layer and solver types.
"""
