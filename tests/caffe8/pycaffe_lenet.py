"""A pycaffe user's script, unchanged but for the import: LeNet from NetSpec, trained with
SGDSolver on the digits LMDB in the working directory, saved, then used through Classifier.

Run from a folder holding data/digits (``caffe8 train`` or engine.datasets prepares it).
Prints one JSON line of results at the end.
"""
import json
import sys

import numpy as np

import caffe8 as caffe
from caffe8 import layers as L, params as P
from caffe8.proto import caffe_pb2


def lenet(lmdb, batch_size):
    n = caffe.NetSpec()
    n.data, n.label = L.Data(batch_size=batch_size, backend=P.Data.LMDB, source=lmdb,
                             transform_param=dict(scale=1. / 255), ntop=2)
    n.conv1 = L.Convolution(n.data, kernel_size=3, pad=1, num_output=20,
                            weight_filler=dict(type='xavier'))
    n.pool1 = L.Pooling(n.conv1, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    n.conv2 = L.Convolution(n.pool1, kernel_size=3, pad=1, num_output=50,
                            weight_filler=dict(type='xavier'))
    n.pool2 = L.Pooling(n.conv2, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    n.fc1 = L.InnerProduct(n.pool2, num_output=100, weight_filler=dict(type='xavier'))
    n.relu1 = L.ReLU(n.fc1, in_place=True)
    n.score = L.InnerProduct(n.relu1, num_output=10, weight_filler=dict(type='xavier'))
    n.loss = L.SoftmaxWithLoss(n.score, n.label)
    return n.to_proto()


def lenet_deploy():
    n = caffe.NetSpec()
    n.data = L.Input(shape=dict(dim=[10, 1, 8, 8]))
    n.conv1 = L.Convolution(n.data, kernel_size=3, pad=1, num_output=20)
    n.pool1 = L.Pooling(n.conv1, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    n.conv2 = L.Convolution(n.pool1, kernel_size=3, pad=1, num_output=50)
    n.pool2 = L.Pooling(n.conv2, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    n.fc1 = L.InnerProduct(n.pool2, num_output=100)
    n.relu1 = L.ReLU(n.fc1, in_place=True)
    n.score = L.InnerProduct(n.relu1, num_output=10)
    n.prob = L.Softmax(n.score)
    return n.to_proto()


with open('lenet_auto_train.prototxt', 'w') as f:
    f.write(str(lenet('data/digits/train_lmdb', 64)))
with open('lenet_auto_test.prototxt', 'w') as f:
    f.write(str(lenet('data/digits/test_lmdb', 100)))
with open('lenet_deploy.prototxt', 'w') as f:
    f.write(str(lenet_deploy()))

s = caffe_pb2.SolverParameter()
s.train_net = 'lenet_auto_train.prototxt'
s.test_net.append('lenet_auto_test.prototxt')
s.test_interval = 100
s.test_iter.append(3)
s.max_iter = 10000
s.base_lr = 0.01
s.momentum = 0.9
s.weight_decay = 5e-4
s.lr_policy = 'inv'
s.gamma = 1e-4
s.power = 0.75
s.display = 100
s.snapshot = 0
s.snapshot_prefix = 'lenet'
s.random_seed = 1
s.solver_mode = caffe_pb2.SolverParameter.CPU
with open('lenet_auto_solver.prototxt', 'w') as f:
    f.write(str(s))

caffe.set_mode_cpu()
solver = caffe.SGDSolver('lenet_auto_solver.prototxt')
print([(k, v.data.shape) for k, v in solver.net.blobs.items()], file=sys.stderr)
print([(k, v[0].data.shape) for k, v in solver.net.params.items()], file=sys.stderr)

niter = int(sys.argv[1]) if len(sys.argv) > 1 else 300
train_loss = np.zeros(niter)
test_acc = []
for it in range(niter):
    solver.step(1)
    train_loss[it] = solver.net.blobs['loss'].data
    if it % 100 == 0 or it == niter - 1:
        correct = 0
        for test_it in range(3):
            solver.test_nets[0].forward()
            correct += sum(solver.test_nets[0].blobs['score'].data.argmax(1)
                           == solver.test_nets[0].blobs['label'].data)
        test_acc.append(correct / 300.)

solver.net.save('lenet_digits.caffemodel.h5')

# Classify the test images from their PNG files.
files, labels = [], []
with open('data/digits/test.txt') as f:
    for line in f:
        name, label = line.split()
        files.append('data/digits/' + name)
        labels.append(int(label))
images = [caffe.io.load_image(fn, color=False) for fn in files]
net = caffe.Classifier('lenet_deploy.prototxt', 'lenet_digits.caffemodel.h5',
                       image_dims=(8, 8), raw_scale=255, input_scale=1. / 255)
center = net.predict(images, oversample=False)
ten = net.predict(images[:20])

# The same net by hand: Transformer and forward.
deploy = caffe.Net('lenet_deploy.prototxt', caffe.TEST, weights='lenet_digits.caffemodel.h5')
t = caffe.io.Transformer({'data': deploy.blobs['data'].data.shape})
t.set_transpose('data', (2, 0, 1))
t.set_raw_scale('data', 255)
t.set_input_scale('data', 1. / 255)
deploy.blobs['data'].data[...] = [t.preprocess('data', im) for im in images[:10]]
by_hand = deploy.forward()['prob'].copy()

print(json.dumps({
    'loss_first': float(train_loss[:10].mean()), 'loss_last': float(train_loss[-10:].mean()),
    'test_acc': [float(a) for a in test_acc], 'iter': solver.iter,
    'center_shape': list(center.shape), 'ten_shape': list(ten.shape),
    'center_acc': float(np.mean(center.argmax(1) == np.array(labels))),
    'ten_agree': float(np.mean(ten.argmax(1) == center[:20].argmax(1))),
    'by_hand_max_diff': float(np.abs(by_hand - center[:10]).max()),
}))
