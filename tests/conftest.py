"""The whole suite runs in TF1 graph mode, as the command-line tools do: tests that build their own tf.Graph and
tests that call train.main()/test.main() in the same process must not mix eager and graph tensors. TensorFlow's
environment defaults (toolkit/base/runtime.py) are set before it is imported, as in the tools.

The tests that need a trained model share tiny_model, trained once per session. A test that needs a trained model
(tiny_model, or test_reliability.py's trained) is marked slow: the quick tier,
`bash scripts/test.sh -m "not slow"`, trains nothing but a few steps inside single tests."""
import pytest

from toolkit.base import runtime  # noqa: F401
import tensorflow as tf

from model_fixtures import train_tiny_model

tf.compat.v1.disable_eager_execution()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """(logdir, data_dir) of a 1-block model trained 60 steps on 2000 generated pairs (vocabulary of 300 pieces,
    --maxlen1 TINY_MODEL_MAXLEN1) in fp32 on every CPU (tests compare its translations with CTranslate2's float32
    ones; --precision auto would train and decode in bf16 on a CPU with bfloat16), trained once for the whole
    session. Tests only read it: anything they write goes elsewhere (--testdir, --export_dir)."""
    return train_tiny_model(tmp_path_factory.mktemp("tiny_model"))


@pytest.fixture(scope="session")
def small_numbers_dir(tmp_path_factory):
    """A data dir of 600 generated training pairs (vocabulary of 200 pieces) for tests that only read it: the
    benchmarks' and the recipe's, which time or count a few steps on it."""
    import prepro
    data_dir = str(tmp_path_factory.mktemp("small_numbers") / "data")
    assert prepro.main(["--dataset", "numbers", "--n_train", "600", "--n_eval", "40", "--n_test", "10",
                        "--vocab_size", "200", "--data_dir", data_dir]) == 0
    return data_dir


#: Fixtures that train a model; every test that uses one, directly or through another fixture, is slow.
TRAINING_FIXTURES = {"tiny_model", "trained"}


def pytest_collection_modifyitems(items):
    for item in items:
        if TRAINING_FIXTURES & set(item.fixturenames):
            item.add_marker(pytest.mark.slow)
