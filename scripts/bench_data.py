"""The data path on a large corpus: prepro.py's time and memory, train.py's start-up and memory, and how fast the
input pipeline alone makes batches, against the same train.py run on Multi30k.

    python scripts/bench_data.py --pairs 4500000 --workdir /work/bigdata [--steps 200] [train.py flags]

Makes (once; kept in WORKDIR/corpus-PAIRS) a synthetic corpus of --pairs training pairs of WMT-like length: line k
joins Multi30k training sentences i and (i + 1 + k // 29000) mod 29000, i = k mod 29000, on both sides (about 28
BPE pieces a side with an 8000-piece vocabulary, against 14 for Multi30k). Dev and test are the first --eval_lines
lines of Multi30k's. Then:
  - prepro.py --dataset files on it, in a subprocess: wall time and peak RSS (--reuse skips it when
    WORKDIR/data-PAIRS is complete);
  - prepro.py on Multi30k's own training set with the same dev and test (WORKDIR/data-multi30k);
  - train.py --max_steps --steps on each data dir, in a subprocess: seconds from its start to the end of its first
    step, and its peak RSS (the run ends with a dev evaluation and a checkpoint, as every train.py run does);
  - the input pipeline alone on the large data dir: the training batches of --pipeline_batches steps, through
    tf.data as train.py reads them, per second (against the training steps per second of the train.py run).
The last line is one JSON object, with the CPU model, its ISA flags and a 2048x2048 fp32 matmul's GFLOP/s.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from toolkit.base import runtime  # noqa: E402  (first: TensorFlow's environment defaults)
from toolkit.base import machine

import tensorflow as tf  # noqa: E402

from bench_train import matmul_gflops  # noqa: E402
from data_load import get_batch  # noqa: E402
from toolkit.data.datadir import MANIFEST_NAME, load_manifest  # noqa: E402
from hparams import Hparams  # noqa: E402
from toolkit.base.reading import iter_lines  # noqa: E402

tf1 = tf.compat.v1

MULTI30K = "/work/shared/data/multi30k"
VOCAB_SIZE = "8000"


def make_corpus(multi30k, folder, pairs, eval_lines):
    """Write the synthetic corpus (see the module docstring) into folder, unless it is there already; returns
    {flag: path} for prepro.py --dataset files."""
    folder = Path(folder)
    paths = {"train1": folder / "train.de", "train2": folder / "train.en", "eval1": folder / "dev.de",
             "eval2": folder / "dev.en", "test1": folder / "test.de", "test2": folder / "test.en"}
    done = folder / "complete"
    if done.exists():
        return paths
    folder.mkdir(parents=True, exist_ok=True)
    for lang, side in (("de", "1"), ("en", "2")):
        sentences = list(iter_lines(os.path.join(multi30k, "train." + lang)))
        n = len(sentences)
        with open(paths["train" + side], "w", encoding="utf-8") as out:
            for k in range(pairs):
                i = k % n
                out.write(sentences[i] + " " + sentences[(i + 1 + k // n) % n] + "\n")
        for split, name in (("eval", "dev"), ("test", "test")):
            lines = list(iter_lines(os.path.join(multi30k, "%s.%s" % (name, lang))))[:eval_lines]
            paths[split + side].write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    done.write_text("%d pairs\n" % pairs)
    return paths


def rss_parts(pid):
    """{"RssAnon": MB, "RssFile": MB} of a running process now (anonymous memory; pages of mapped files, which the
    kernel can drop and re-read), or {} once it is gone."""
    try:
        with open("/proc/%d/status" % pid) as status:
            fields = dict(line.split(":", 1) for line in status)
    except (OSError, ValueError):
        return {}
    return {key: int(fields[key].split()[0]) / 1024 for key in ("RssAnon", "RssFile") if key in fields}


def run_measured(command, marker=None):
    """Run command (a list) from the repository root; returns (wall seconds, {"peak_rss": MB, "peak_rss_anon": MB,
    "peak_rss_file": MB}, seconds until a line of its standard output started with marker (or None), its output
    lines). The output is echoed to our standard error. peak_rss is the kernel's; the two parts are sampled every
    0.2 s, so they may miss a short peak."""
    start = time.time()
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    peaks = {"RssAnon": 0.0, "RssFile": 0.0}

    def sample():
        while process.returncode is None:
            for key, value in rss_parts(process.pid).items():
                peaks[key] = max(peaks[key], value)
            time.sleep(0.2)

    threading.Thread(target=sample, daemon=True).start()
    marked, lines = None, []
    for line in process.stdout:
        print(line, end="", file=sys.stderr, flush=True)
        lines.append(line)
        if marker and marked is None and line.startswith(marker):
            marked = time.time() - start
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = status
    if status:
        raise SystemExit("%s failed (status %d)" % (" ".join(command), status))
    memory = {"peak_rss": usage.ru_maxrss / 1024, "peak_rss_anon": peaks["RssAnon"], "peak_rss_file": peaks["RssFile"]}
    return time.time() - start, memory, marked, lines


def prepro(paths, data_dir):
    """prepro.py --dataset files on paths into data_dir: (wall s, memory as run_measured reports it)."""
    command = [sys.executable, "prepro.py", "--dataset", "files", "--vocab_size", VOCAB_SIZE, "--data_dir",
               str(data_dir), "--force"]
    for flag, path in paths.items():
        command += ["--" + flag, str(path)]
    wall, memory, _, _ = run_measured(command)
    return wall, memory


def train(data_dir, steps, train_flags):
    """train.py for steps steps on data_dir in a fresh logdir: (s to the end of the first step, memory as
    run_measured reports it, wall s, target tokens per second of its training steps, as its epoch line says)."""
    with tempfile.TemporaryDirectory() as logdir:
        wall, rss, first, lines = run_measured([sys.executable, "train.py", "--data_dir", str(data_dir), "--logdir",
                                                logdir, "--max_steps", str(steps), "--eval_every", "0"] + train_flags,
                                               marker="first step of this run")
    rate = [line.split(" tgt tok/s")[0].rsplit("| ", 1)[1] for line in lines if " tgt tok/s" in line]
    return first, rss, wall, float(rate[-1])


def pipeline_rates(data_dir, batches, train_flags):
    """Training batches and target tokens (y_seqlen summed) per second of the input pipeline alone (tf.data, as
    train.py reads it), after the first batch."""
    hp = Hparams().parser.parse_args(["--data_dir", str(data_dir), "--logdir", "unused"] + train_flags)
    with tf.Graph().as_default():
        dataset, _, _, _ = get_batch(str(data_dir), load_manifest(str(data_dir)), "train", hp.maxlen1, hp.maxlen2,
                                     hp.batch_size, shuffle=True, batch_type=hp.batch_type, seed=hp.seed,
                                     growth=hp.bucket_growth, bpe_dropout=hp.bpe_dropout)
        target_tokens = tf.reduce_sum(tf1.data.make_one_shot_iterator(dataset.repeat()).get_next()[1][2])
        with tf1.Session(config=machine.session_config(hp)) as sess:
            sess.run(target_tokens)
            start, tokens = time.time(), 0
            for _ in range(batches):
                tokens += sess.run(target_tokens)
    seconds = time.time() - start
    return batches / seconds, tokens / seconds


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=1000000, help="training pairs of the synthetic corpus")
    parser.add_argument("--workdir", default="/work/bigdata", help="where the corpus and the data dirs are kept")
    parser.add_argument("--multi30k", default=MULTI30K, help="Multi30k's train/dev/test .de/.en")
    parser.add_argument("--eval_lines", type=int, default=100, help="dev and test lines (from Multi30k's)")
    parser.add_argument("--steps", type=int, default=200, help="train.py steps on each data dir")
    parser.add_argument("--pipeline_batches", type=int, default=300, help="batches timed from the pipeline alone")
    parser.add_argument("--reuse", action="store_true", help="skip prepro.py on a data dir that is complete")
    args, train_flags = parser.parse_known_args(argv)
    runtime.start_graph_mode()
    workdir = Path(args.workdir)
    result = {"pairs": args.pairs}
    paths = make_corpus(args.multi30k, workdir / ("corpus-%d" % args.pairs), args.pairs, args.eval_lines)
    big = workdir / ("data-%d" % args.pairs)
    if not (args.reuse and (big / MANIFEST_NAME).exists()):
        result["prepro_s"], memory = prepro(paths, big)
        result.update({"prepro_%s_mb" % key: value for key, value in memory.items()})
    reference_paths = {**paths, "train1": Path(args.multi30k) / "train.de", "train2": Path(args.multi30k) / "train.en"}
    reference = workdir / "data-multi30k"
    result["multi30k_prepro_s"], memory = prepro(reference_paths, reference)
    result["multi30k_prepro_peak_rss_mb"] = memory["peak_rss"]
    manifest = load_manifest(str(big))
    result["bpe_training"] = manifest["bpe_training"]
    result["train_pairs"] = manifest["splits"]["train"]["lines"]
    for name, data_dir in (("multi30k", reference), ("large", big)):
        first, memory, wall, rate = train(data_dir, args.steps, train_flags)
        result.update({"%s_first_step_s" % name: first, "%s_train_wall_s" % name: wall,
                       "%s_train_tgt_tokens_per_s" % name: rate})
        result.update({"%s_train_%s_mb" % (name, key): value for key, value in memory.items()})
    result["train_peak_rss_difference_mb"] = result["large_train_peak_rss_mb"] - result["multi30k_train_peak_rss_mb"]
    result["pipeline_batches_per_s"], result["pipeline_tgt_tokens_per_s"] = pipeline_rates(
        big, args.pipeline_batches, train_flags)
    result.update({"steps": args.steps, "train_flags": " ".join(train_flags),
                   "matmul_gflops_per_s": matmul_gflops(machine.session_config(Hparams().parser.parse_args(train_flags))),
                   **machine.machine_summary()})
    print(json.dumps({key: round(value, 2) if isinstance(value, float) else value for key, value in result.items()}))


if __name__ == "__main__":
    main()
