"""caffe8 engine: backend, prototxt, Blob, Layer, Net, training loop, log, snapshots, CLI."""
