"""toolkit/base/runtime.py's process settings: TensorFlow imported without Keras, freed heap memory and library pages handed back.

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
    code = ("import sys; from toolkit.base import runtime; import tensorflow as tf; "
            "tf.compat.v1.disable_eager_execution(); "
            "x = tf.ones([2, 2]); print(tf.compat.v1.Session().run(tf.reduce_sum(tf.matmul(x, x))), "
            "'keras' in sys.modules, 'matplotlib' in sys.modules)")
    assert run_python(code) == ["8.0", "False", "False"]


def test_a_process_that_imported_keras_first_keeps_it_whole():
    code = ("import sys, keras; from toolkit.base import runtime; import tensorflow; "
            "print(sys.modules.get(runtime.KERAS_BLOCKED) is not None, hasattr(keras, 'optimizers'))")
    assert run_python(code) == ["True", "True"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status; malloc_trim is glibc's")
def test_release_freed_memory_returns_freed_heap_to_the_system():
    # 200 MB of 1,000-byte objects (each a malloc below glibc's mmap threshold), freed except one allocated last,
    # which keeps the heap's top in use, so glibc cannot give the rest back by itself.
    code = """
from toolkit.base import machine
def anon_mb():
    return next(int(line.split()[1]) // 1024 for line in open("/proc/self/status") if line.startswith("RssAnon"))
blocks = [bytes(1000) for _ in range(200000)]
last = bytes(1000)
del blocks
held = anon_mb()
print(machine.release_freed_memory(), held - anon_mb())
"""
    trimmed, released_mb = run_python(code)
    assert trimmed == "True"
    assert int(released_mb) > 150


def test_library_mappings_are_the_read_only_maps_of_shared_libraries(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text(
        "7f0000000000-7f0000400000 r-xp 00000000 08:01 12 /usr/lib/libtensorflow_cc.so.2\n"
        "7f0000400000-7f0000500000 r--p 00400000 08:01 12 /usr/lib/libtensorflow_cc.so.2\n"
        "7f0000500000-7f0000510000 rw-p 00500000 08:01 12 /usr/lib/libtensorflow_cc.so.2\n"
        "7f0000600000-7f0000700000 r--p 00000000 08:01 13 /data/train.ids\n"
        "7f0000800000-7f0000900000 rw-p 00000000 00:00 0 \n"
        "7f0000900000-7f0000a00000 r-xp 00000000 08:01 14 /opt/so.data/tool\n")
    from toolkit.base import machine
    assert machine.library_mappings(str(maps)) == [(0x7f0000000000, 0x7f0000400000),
                                                   (0x7f0000400000, 0x7f0000500000)]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status; madvise is Linux's")
def test_release_library_pages_drops_them_from_the_resident_set_and_loses_nothing(tmp_path):
    # a 64 MB read-only private map of a file named like a library, every page read: the resident set's file part
    # falls by about 64 MB, and the bytes read again are the file's
    path = tmp_path / "pages.so"
    with open(path, "wb") as f:
        f.write(os.urandom(64 << 20))
        f.flush()
        os.fsync(f.fileno())
    code = """
import hashlib, mmap
from toolkit.base import machine
def file_mb():
    return next(int(line.split()[1]) // 1024 for line in open("/proc/self/status") if line.startswith("RssFile"))
with open(%r, "rb") as f:
    pages = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ)
digest = hashlib.sha256(pages).hexdigest()
held = file_mb()
advised = machine.release_library_pages()
print(advised >= 64, held - file_mb(), hashlib.sha256(pages).hexdigest() == digest)
""" % str(path)
    advised, released_mb, same = run_python(code)
    if advised == "False":
        pytest.skip("this kernel does not take MADV_PAGEOUT (Linux 5.4 and later)")
    assert int(released_mb) > 56
    assert same == "True"
