"""Caffe's schema (``caffe.proto``), its generated module ``caffe_pb2`` and helpers around it."""


def read_message(path, message, noun, kind, error):
    """Parse binary file ``path`` into ``message`` and return it; ``error(text)`` (an exception
    class) names the file when it cannot be read ("cannot read <noun>") or does not parse
    ("not <kind>")."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise error(f"{path}: cannot read {noun}: {e.strerror}") from None
    try:
        message.ParseFromString(raw)
    except Exception as e:  # protobuf's DecodeError, or an error of the C extension
        raise error(f"{path}: not {kind}: {e}") from None
    return message
