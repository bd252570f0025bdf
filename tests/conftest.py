"""The whole suite runs in TF1 graph mode, as the command-line tools do: tests that build their own tf.Graph and
tests that call train.main()/test.main() in the same process must not mix eager and graph tensors."""
import tensorflow as tf

tf.compat.v1.disable_eager_execution()
