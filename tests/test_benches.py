"""The benchmarks in scripts/ run against the current code and report figures that agree with each other (their
speed itself is measured by running them, never asserted here)."""
import io
import json
import os
import sys
from types import SimpleNamespace

import pytest
import tensorflow as tf

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
import bench_data  # noqa: E402
import bench_iterator  # noqa: E402
import bench_train  # noqa: E402
import model_flops  # noqa: E402
from data_load import get_batch  # noqa: E402
from toolkit.data.datadir import load_manifest  # noqa: E402
from toolkit.base.errors import UserError  # noqa: E402

TINY = ["--d_model", "32", "--d_ff", "64", "--num_blocks", "1", "--num_heads", "2", "--batch_size", "500",
        "--threads", "1"]


def last_json(capsys):
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_forward_flops_hand_computed():
    # d 2, d_ff 3, one block, vocabulary 5; one sentence of one source and one target position, one real token:
    # encoder 2 * (4 * 2 * 2 + 2 * 2 * 3) + 2 * 2 * 2 = 64 (projections and FF, then Q.K and A.V);
    # decoder 2 * (6 * 4 + 12) + 2 * 2 * 4 + 2 * 2 * 2 + 2 * 2 * 2 = 104 (cross-attention K, V of the memory);
    # output layer 2 * 2 * 5 = 20
    hp = SimpleNamespace(d_model=2, d_ff=3, num_blocks=1, vocab_size=5)
    assert model_flops.forward_flops(hp, 1, 1, 1, 1) == 188
    # every term but the output layer grows with the batch; the output layer with the real target tokens only
    assert model_flops.forward_flops(hp, 2, 1, 1, 1) == 2 * 168 + 20


def test_a_training_step_is_three_forward_passes_and_twice_that_under_rdrop():
    hp = SimpleNamespace(d_model=2, d_ff=3, num_blocks=1, vocab_size=5)  # a model from before --rdrop
    assert model_flops.training_flops(hp, 1, 1, 1, 1) == 3 * 188
    assert model_flops.training_flops(SimpleNamespace(**vars(hp), rdrop=0.0), 1, 1, 1, 1) == 3 * 188
    # both passes of the rows count; the real target tokens, which set the output layer's share, stay those given
    assert model_flops.training_flops(SimpleNamespace(**vars(hp), rdrop=0.5), 1, 1, 1, 1) == 2 * 3 * 188
    assert bench_train.training_flops is model_flops.training_flops  # bench_train's FLOPs, FLOP/s and mfu


def test_profile_splits_into_matrix_products_and_the_rest():
    profile = {"_MklMatMul": 10.0, "BatchMatMulV2": 2.5, "_MklFusedMatMul": 1.0, "Mul": 4.0, "ResidualDropoutLn": 0.5}
    assert bench_train.matmul_share(profile) == {"matmul_ms_per_step": 13.5, "other_ms_per_step": 4.5}


def test_bench_train_reports_the_steps_it_timed_and_an_mfu_that_is_its_own_ratio(small_numbers_dir, capsys,
                                                                                      monkeypatch):
    # a smaller matmul than the 2048^2 of a real run: what is checked is the ratio, not the figure
    real_matmul_gflops = bench_train.matmul_gflops
    monkeypatch.setattr(bench_train, "matmul_gflops",
                        lambda config, dtype: real_matmul_gflops(config, n=512, repeats=3, dtype=dtype))
    with tf.Graph().as_default():  # fp32 asked for: --precision auto would pick bf16 on a CPU with bfloat16
        bench_train.main(["--data_dir", small_numbers_dir, "--steps", "3", "--warmup", "2", "--precision", "fp32"]
                         + TINY)
    result = last_json(capsys)
    assert result["timed_steps"] == 3 and result["d_model"] == 32 and result["precision"] == "fp32"
    model, matmul = result["model_gflops_per_s"], result["matmul_gflops_per_s"]
    # both GFLOP/s figures are rounded to 0.1, which moves their ratio by up to 0.05 * (1 + model / matmul) / matmul
    # (much more than mfu's own rounding when a loaded machine makes both small)
    assert result["mfu"] == pytest.approx(model / matmul, abs=1e-3 + 0.05 * (1 + model / matmul) / matmul)
    assert 0 <= result["padding_fraction"] < 1 and result["real_tgt_tokens_per_s"] > 0
    # the epoch's mean batch: every training line's target pieces and its </s>, over the epoch's batches
    with open(os.path.join(small_numbers_dir, "train.2.bpe"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    batches = get_batch(small_numbers_dir, load_manifest(small_numbers_dir), "train", 100, 100, 500, shuffle=True,
                        batch_type="tokens", seed=1234)[1](0)
    tokens_per_step = sum(len(line.split()) + 1 for line in lines) / batches
    assert result["epoch_tgt_tokens_per_step"] == pytest.approx(tokens_per_step, abs=0.05)
    # the rate is the epoch's tokens per step over the step time; both are rounded (to 0.1 tokens/s and 0.1 ms),
    # which moves their product by at most rate * 0.05 ms + 0.05 * step_s
    rate, step_s = result["epoch_tgt_tokens_per_s"], result["step_s"]
    assert rate * step_s == pytest.approx(tokens_per_step, abs=rate * 5e-5 + 0.05 * step_s + 1e-9)
    assert set(result["isa_flags"]) <= {"avx2", "avx512f", "avx512_bf16", "amx_bf16"}


def test_mfu_is_the_models_share_of_each_matmul_and_each_matmul_is_read_once(monkeypatch):
    reads = []
    monkeypatch.setattr(bench_train, "matmul_gflops", lambda config, dtype: reads.append(dtype) or (
        400.0 if dtype == tf.bfloat16 else 100.0))
    matmuls = {}
    for _ in range(2):
        fields = bench_train.mfu_fields(SimpleNamespace(precision="bf16"), None, 50.0, matmuls)
        assert fields == {"matmul_gflops_per_s": 100.0, "mfu": 0.5, "matmul_bf16_gflops_per_s": 400.0,
                          "mfu_bf16": 0.125}
    assert reads == [tf.float32, tf.bfloat16]
    assert bench_train.mfu_fields(SimpleNamespace(precision="fp32"), None, 25.0, matmuls) == {
        "matmul_gflops_per_s": 100.0, "mfu": 0.25}


def test_bench_train_says_to_raise_max_steps_when_no_step_was_timed(small_numbers_dir):
    # without warm-up the first step is on a new batch shape, so with --max_steps 1 none is steady-state
    with tf.Graph().as_default(), pytest.raises(UserError) as error:
        bench_train.main(["--data_dir", small_numbers_dir, "--steps", "1", "--warmup", "0", "--max_steps", "1"] + TINY)
    assert str(error.value) == ("no step of the 1 after warm-up came on a batch shape seen before, so none was "
                                "timed: raise --max_steps")


def test_flags_from_stdin_measures_accumulation_and_goes_on_after_a_model_that_fails(small_numbers_dir, capsys,
                                                                                     monkeypatch):
    """A model under --accum_steps is measured (its accumulators initialised, its gradients applied every
    other batch); a model whose graph fails when run gets its error, and the models after it are measured."""
    real_measure = bench_train.measure

    def measure(hp, *args, **kwargs):
        if hp.dropout_rate == 0.3:
            raise tf.errors.InternalError(None, None, "a kernel failed\nwith its details")
        return real_measure(hp, *args, **kwargs)
    monkeypatch.setattr(bench_train, "measure", measure)
    lines = [["--accum_steps", "2"], ["--dropout_rate", "0.3"], []]
    monkeypatch.setattr(sys, "stdin", io.StringIO("".join(json.dumps(line) + "\n" for line in lines)))
    bench_train.main(["--data_dir", small_numbers_dir, "--steps", "2", "--warmup", "2", "--max_steps", "20",
                      "--batches", "2", "--precision", "fp32", "--flags_from_stdin"] + TINY)
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    results = [result for result in printed if result.keys() != {"graph_build_s"}]
    assert len(results) == 3 and results[1] == {"error": "InternalError: a kernel failed"}
    for result in (results[0], results[2]):
        assert result["timed_steps"] == 2 and result["epoch_tgt_tokens_per_s"] > 0


def test_bench_iterator_times_every_switch_between_training_and_dev_data(small_numbers_dir, capsys):
    with tf.Graph().as_default():
        bench_iterator.main(["--data_dir", small_numbers_dir, "--rounds", "2", "--test_batch_size", "8"] + TINY)
    result = last_json(capsys)
    assert len(result["train_init_s"]) == len(result["eval_init_s"]) == 2
    assert result["max_after_first_round_s"] == max(result["train_init_s"][1:] + result["eval_init_s"][1:])


def test_bench_data_corpus_joins_two_training_sentences_per_line(tmp_path):
    source = tmp_path / "multi30k"
    source.mkdir()
    for lang in ("de", "en"):
        (source / f"train.{lang}").write_text("".join(f"{lang}{i}\n" for i in range(3)), encoding="utf-8")
        for name in ("dev", "test"):
            (source / f"{name}.{lang}").write_text("".join(f"{name}{i}\n" for i in range(5)), encoding="utf-8")
    paths = bench_data.make_corpus(str(source), tmp_path / "corpus", 7, eval_lines=2)
    # line k joins sentences i = k mod 3 and (i + 1 + k // 3) mod 3: no line repeats within 3 * 3 lines
    assert paths["train2"].read_text(encoding="utf-8").splitlines() == [
        "en0 en1", "en1 en2", "en2 en0", "en0 en2", "en1 en0", "en2 en1", "en0 en0"]
    assert paths["train1"].read_text(encoding="utf-8").splitlines()[3] == "de0 de2"
    assert paths["eval1"].read_text(encoding="utf-8").splitlines() == ["dev0", "dev1"]
    assert paths["test2"].read_text(encoding="utf-8").splitlines() == ["test0", "test1"]
