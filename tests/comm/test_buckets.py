"""comm/buckets.py: the schedule of shared tensors and the bucket layout (the reductions
themselves run in tests/comm/test_exchange.py and the rank programs of tests/comm/mpi)."""
from caffe8.comm.buckets import Layout, build_buckets, build_schedule


def test_shared_tensor_goes_with_its_lowest_layer_and_empty_tensors_are_left_out():
    s0, s1, s2 = slice(0, 4), slice(4, 6), slice(6, 9)
    schedule = build_schedule({1: [(0, s0), (1, s1)], 3: [(0, s2)], 5: [(0, s0)],
                               6: [(0, slice(9, 9))]})
    assert schedule == {1: [s0, s1], 3: [s2]}


def test_the_layout_places_each_tensor_in_its_buckets_wire_buffer_in_backward_order():
    schedule = {i: [slice(a, b) for a, b in spans] for i, spans in
                {0: [(0, 10)], 1: [(10, 310), (310, 330)], 2: [(330, 360)], 3: [(360, 1060)]}
                .items()}
    # backward order; a bucket closes once its bytes reach the limit (1-byte items here)
    assert build_buckets(schedule, 1000, 1) == [[3, 2, 1], [0]]
    layout = Layout(schedule, 1000, 4)                   # 4-byte items: 250 a bucket
    assert layout.buckets == [[3], [2, 1], [0]] and layout.sizes == [700, 350, 10]
    assert layout.bucket_of == {3: 0, 2: 1, 1: 1, 0: 2}
    # in its bucket, each tensor after the layers before it, a layer's tensors side by side
    assert layout.offset == {(360, 1060): 0, (330, 360): 0, (10, 310): 30, (310, 330): 330,
                             (0, 10): 0}
