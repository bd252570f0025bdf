"""The whole suite runs in TF1 graph mode, as the command-line tools do: tests that build their own tf.Graph and
tests that call train.main()/test.main() in the same process must not mix eager and graph tensors. TensorFlow's
environment defaults (runtime.py) are set before it is imported, as in the tools."""
import runtime  # noqa: F401
import tensorflow as tf

tf.compat.v1.disable_eager_execution()
