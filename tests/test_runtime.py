"""runtime.py's process settings: TensorFlow imported without Keras, and freed heap memory handed back.

Each check runs in a fresh Python process: what a process has imported, and the state of its heap, are the things
under test."""
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_python(code):
    """The standard output of `python -c code` run from the repository root; fails the test if it fails."""
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.split()


def test_tensorflow_imported_after_runtime_does_not_import_keras():
    code = ("import sys, runtime, tensorflow as tf; tf.compat.v1.disable_eager_execution(); "
            "x = tf.ones([2, 2]); print(tf.compat.v1.Session().run(tf.reduce_sum(tf.matmul(x, x))), "
            "'keras' in sys.modules, 'matplotlib' in sys.modules)")
    assert run_python(code) == ["8.0", "False", "False"]


def test_a_process_that_imported_keras_first_keeps_it_whole():
    code = ("import sys, keras, runtime, tensorflow; "
            "print(sys.modules.get(runtime.KERAS_BLOCKED) is not None, hasattr(keras, 'optimizers'))")
    assert run_python(code) == ["True", "True"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status; malloc_trim is glibc's")
def test_release_freed_memory_returns_freed_heap_to_the_system():
    # 200 MB of 1,000-byte objects (each a malloc below glibc's mmap threshold), freed except one allocated last,
    # which keeps the heap's top in use, so glibc cannot give the rest back by itself.
    code = """
import runtime
def anon_mb():
    return next(int(line.split()[1]) // 1024 for line in open("/proc/self/status") if line.startswith("RssAnon"))
blocks = [bytes(1000) for _ in range(200000)]
last = bytes(1000)
del blocks
held = anon_mb()
print(runtime.release_freed_memory(), held - anon_mb())
"""
    trimmed, released_mb = run_python(code)
    assert trimmed == "True"
    assert int(released_mb) > 150
