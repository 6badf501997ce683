"""pycaffe's ``caffe.proto``: ``from caffe8.proto import caffe_pb2``."""
