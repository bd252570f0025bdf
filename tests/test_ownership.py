"""Ownership: a tool deletes only the files it made, by the exact names it recorded, and never
writes an output over one of its inputs or over a file of a logdir or data dir it reads, however
the path is spelt (relative, a symbolic link, a hard link). Each refusal is one line, and nothing
on disk changes."""
import os
import shutil

import pytest
import tensorflow as tf

from test_faults import fresh_train, model, one_line  # noqa: F401 (model: a fixture)
from toolkit.training.logdir import record_dev_bleu


def snapshot(*directories):
    """{path: bytes} of every file under the directories, to see that nothing changed (but the
    lock, which train.py takes, and describes itself in, before it reads anything)."""
    return {path: path.read_bytes() for directory in directories for path
            in sorted(directory.rglob("*")) if path.is_file() and path.name != "train.lock"}


def test_dev_evaluations_remove_only_the_best_checkpoints_they_made(model):  # noqa: F811
    logdir, _ = model
    (logdir / "best-notes.txt").write_text("my notes\n")
    (logdir / "best-plots").mkdir()
    (logdir / "best-plots" / "bleu.png").write_bytes(b"png")
    ckpt = tf.train.latest_checkpoint(str(logdir))
    record_dev_bleu(str(logdir), ckpt, 10, 1000.0)
    assert (logdir / "best-10.index").is_file()
    record_dev_bleu(str(logdir), ckpt, 20, 2000.0)
    assert not list(logdir.glob("best-10.*")) and (logdir / "best-20.index").is_file()
    assert (logdir / "best-notes.txt").read_text() == "my notes\n"
    assert (logdir / "best-plots" / "bleu.png").read_bytes() == b"png"


def spell(path, how, tmp_path):
    """Another name of path: relative to the working directory, a symbolic link or a hard link."""
    other = tmp_path / ("%s-%s" % (how, path.name))
    if how == "relative":
        return os.path.relpath(path)
    if how == "symlink":
        other.symlink_to(path)
    else:
        os.link(path, other)
    return other


@pytest.mark.parametrize("how", ["relative", "symlink", "hardlink"])
@pytest.mark.parametrize("target, what", [("reference", "--score"), ("hparams.json", "logdir"),
                                          ("bpe.model", "data dir")])
def test_translate_never_writes_over_what_it_reads(model, tmp_path, capsys, monkeypatch,  # noqa: F811
                                                   how, target, what):
    logdir, data_dir = model
    monkeypatch.chdir(tmp_path)
    source, reference = tmp_path / "source.txt", tmp_path / "reference.txt"
    source.write_text("eins\n")
    reference.write_text("one\n")
    path = {"reference": reference, "hparams.json": logdir / "hparams.json",
            "bpe.model": data_dir / "bpe.model"}[target]
    output = spell(path, how, tmp_path)
    before = snapshot(logdir, data_dir, tmp_path)
    line = one_line(capsys, "translate.py", "--logdir", logdir, "--input", source, "--score",
                    reference, "--output", output)
    held = {"--score": "the file given as --score %s" % reference,
            "logdir": "hparams.json, a file of the logdir %s" % logdir,
            "data dir": "bpe.model, a file of the data dir %s" % data_dir}[what]
    assert line == ("error: --output %s is %s: it would be replaced by the output; pass another "
                    "--output" % (output, held))
    assert snapshot(logdir, data_dir, tmp_path) == before


def test_test_py_never_writes_its_hypotheses_over_its_source(model, tmp_path, capsys):  # noqa: F811
    logdir, data_dir = model
    testdir = tmp_path / "tests"
    testdir.mkdir()
    source, reference = testdir / "hypotheses.1.txt", tmp_path / "reference.txt"
    source.write_text("eins\n")
    reference.write_text("one\n")
    before = snapshot(logdir, data_dir, tmp_path)
    line = one_line(capsys, "test.py", "--logdir", logdir, "--testdir", testdir, "--src", source,
                    "--ref", reference)
    assert line == ("error: --testdir %s: its hypotheses.1.txt is the file given as --src %s: it would be "
                    "replaced by the output; pass another --testdir" % (testdir, source))
    for directory, what in ((logdir, "logdir"), (data_dir, "data dir")):
        assert one_line(capsys, "test.py", "--logdir", logdir, "--testdir", directory) == (
            "error: --testdir %s is the %s %s: the outputs would go among the files it reads; pass another "
            "--testdir" % (directory, what, directory))
    assert snapshot(logdir, data_dir, tmp_path) == before


@pytest.mark.parametrize("tool, flag", [("translate.py", "--plot_attention"), ("plot_attention.py", "--dir")])
def test_attention_plots_never_go_among_or_over_what_they_read(model, tmp_path, capsys, monkeypatch,  # noqa: F811
                                                               tool, flag):
    logdir, data_dir = model
    monkeypatch.chdir(tmp_path)
    source, plots = tmp_path / "source.txt", tmp_path / "plots"
    source.write_text("eins\n")
    plots.mkdir()
    before = snapshot(logdir, data_dir, tmp_path)
    inputs = ["--input", source] if tool == "translate.py" else ["eins"]

    def refusal(directory):
        return one_line(capsys, tool, "--logdir", logdir, flag, directory, *inputs)

    assert refusal(spell(data_dir, "relative", tmp_path)) == (
        "error: %s %s is the data dir %s: the outputs would go among the files it reads; pass another %s"
        % (flag, os.path.relpath(data_dir), data_dir, flag))
    assert refusal(spell(logdir, "symlink", tmp_path)).startswith(
        "error: %s %s is the logdir %s:" % (flag, tmp_path / "symlink-run", logdir))
    os.link(logdir / "hparams.json", plots / "positional_encoding.png")
    assert refusal(plots) == ("error: %s %s: its positional_encoding.png is hparams.json, a file of the logdir %s: "
                              "it would be replaced by the output; pass another %s" % (flag, plots, logdir, flag))
    if tool == "translate.py":
        os.unlink(plots / "positional_encoding.png")
        (plots / "0001.png").symlink_to(source)
        assert refusal(plots) == ("error: --plot_attention %s: its 0001.png is the file given as --input %s: it would "
                                  "be replaced by the output; pass another --plot_attention" % (plots, source))
    assert snapshot(logdir, data_dir, source.parent) == before | snapshot(plots)


def test_export_never_writes_over_what_it_reads(model, tmp_path, capsys):  # noqa: F811
    logdir, data_dir = model
    package = tmp_path / "de_en.argosmodel"
    package.symlink_to(logdir / "hparams.json")
    before = snapshot(logdir, data_dir)
    assert one_line(capsys, "export.py", "--logdir", logdir, "--export_dir", data_dir) == (
        "error: --export_dir %s already exists and is not empty: remove it or choose another" % data_dir)
    assert one_line(capsys, "export.py", "--logdir", logdir, "--export_dir", package, "--format", "argos") == (
        "error: --export_dir %s already exists: remove it or choose another" % package)
    assert snapshot(logdir, data_dir) == before


def test_averaging_replaces_the_names_it_writes_never_the_files_they_link_to(model, capsys):  # noqa: F811
    import avg_checkpoints
    from in_process import run_in_process
    logdir, _ = model
    newest = tf.train.latest_checkpoint(str(logdir))
    step = newest.rsplit("-", 1)[1]
    os.link(newest + ".index", logdir / ("avg_last1-%s.index" % step))
    (logdir / ("avg_last1-%s.data-00000-of-00001" % step)).symlink_to(newest + ".data-00000-of-00001")
    for name in ("notes.tempstate.txt", "E01.index.tempstate.bak"):  # a user's, not a killed save's
        (logdir / name).write_text("mine\n")
    before = snapshot(logdir)
    code, _, err = run_in_process(capsys, "avg_checkpoints.py", avg_checkpoints.main, "--logdir", logdir,
                                  "--last", "1")
    assert code == 0, err
    after = snapshot(logdir)
    assert {path: after[path] for path in before if not path.name.startswith(("avg_", "checkpoint"))} == {
        path: data for path, data in before.items() if not path.name.startswith(("avg_", "checkpoint"))}
    assert not (logdir / ("avg_last1-%s.data-00000-of-00001" % step)).is_symlink()


def test_a_logdir_and_a_data_dir_never_share_a_directory(model, tmp_path, capsys):  # noqa: F811
    logdir, data_dir = model
    link = spell(data_dir, "symlink", tmp_path)
    before = snapshot(logdir, data_dir)
    assert one_line(capsys, *fresh_train(data_dir, link)) == (
        "error: --logdir %s is a data dir written by prepro.py (it holds manifest.json): pass another --logdir" % link)
    numbers = ("prepro.py", "--dataset", "numbers", "--n_train", "300", "--n_eval", "20", "--n_test", "20",
               "--vocab_size", "100")
    assert one_line(capsys, *numbers, "--data_dir", logdir, "--force") == (
        "error: --data_dir %s is a logdir written by train.py (it holds hparams.json): pass another --data_dir"
        % logdir)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "train.1").write_text("my corpus\n")
    (mine / "bpe.model").write_text("my model\n")
    for force in ([], ["--force"]):
        assert one_line(capsys, *numbers, "--data_dir", mine, *force) == (
            "error: --data_dir %s holds bpe.model, train.1 but no manifest.json, so prepro.py did not write them "
            "and will not replace them: move them, or pass another --data_dir" % mine)
    assert sorted(os.listdir(mine)) == ["bpe.model", "train.1"] and (mine / "train.1").read_text() == "my corpus\n"
    assert snapshot(logdir, data_dir) == before


def other_run(logdir, tmp_path):
    """A copy of the run as another run's logdir, and its latest checkpoint there: what --ckpt names when a tool
    reads a checkpoint outside its --logdir."""
    other = shutil.copytree(logdir, tmp_path / "other")
    return other, other / os.path.basename(tf.train.latest_checkpoint(str(logdir)))


def test_no_output_replaces_the_checkpoint_it_reads_or_goes_among_its_files(model, tmp_path, capsys):  # noqa: F811
    logdir, data_dir = model
    other, ckpt = other_run(logdir, tmp_path)
    before = snapshot(logdir, data_dir, other)
    for suffix in (".index", ".data-00000-of-00001"):
        output = "%s%s" % (ckpt, suffix)
        assert one_line(capsys, "translate.py", "--logdir", logdir, "--ckpt", ckpt, "--output", output, "eins") == (
            "error: --output %s is %s, a file of the checkpoint's directory %s: it would be replaced by the output; "
            "pass another --output" % (output, os.path.basename(output), other))
    among = "is the checkpoint's directory %s: the outputs would go among the files it reads" % other
    assert one_line(capsys, "test.py", "--logdir", logdir, "--ckpt", ckpt, "--testdir", other) == (
        "error: --testdir %s %s; pass another --testdir" % (other, among))
    testdir = tmp_path / "tests"
    testdir.mkdir()
    os.link("%s.index" % ckpt, testdir / "hypotheses.txt")
    assert one_line(capsys, "test.py", "--logdir", logdir, "--ckpt", ckpt, "--testdir", testdir) == (
        "error: --testdir %s: its hypotheses.txt is %s.index, a file of the checkpoint's directory %s: it would be "
        "replaced by the output; pass another --testdir" % (testdir, ckpt.name, other))
    assert one_line(capsys, "plot_attention.py", "--logdir", logdir, "--ckpt", ckpt, "--dir", other, "eins") == (
        "error: --dir %s %s; pass another --dir" % (other, among))
    assert one_line(capsys, "translate.py", "--logdir", logdir, "--ckpt", ckpt, "--plot_attention", other,
                    "eins") == "error: --plot_attention %s %s; pass another --plot_attention" % (other, among)
    assert snapshot(logdir, data_dir, other) == before
    import export
    from in_process import run_in_process
    model_dir = tmp_path / "ct2"  # read as a whole by translate.py --engine ctranslate2 --model
    code, _, err = run_in_process(capsys, "export.py", export.main, "--logdir", logdir, "--ckpt", ckpt,
                                  "--export_dir", model_dir, "--format", "ctranslate2")
    assert code == 0, err
    exported = snapshot(model_dir)
    assert one_line(capsys, "translate.py", "--engine", "ctranslate2", "--model", model_dir, "--output",
                    model_dir / "model.bin", "eins") == (
        "error: --output %s is model.bin, a file of the model directory %s: it would be replaced by the output; "
        "pass another --output" % (model_dir / "model.bin", model_dir))
    assert snapshot(model_dir) == exported


@pytest.mark.parametrize("how", ["savedmodel", "ctranslate2", "argos"])
def test_an_export_never_replaces_what_appeared_at_its_path_while_it_ran(model, tmp_path, capsys,  # noqa: F811
                                                                         monkeypatch, how):
    from toolkit.translating import argos_package, ctranslate2_engine
    logdir, _ = model
    exports = tmp_path / "exports"
    exports.mkdir()
    target = exports / ("de_en.argosmodel" if how == "argos" else "model")
    module, step = {"savedmodel": (tf.compat.v1.saved_model.Builder, "save"),
                    "ctranslate2": (ctranslate2_engine, "write_model"),
                    "argos": (argos_package, "zip_folder")}[how]
    original = getattr(module, step)

    def step_then_a_file_appears(*args, **kwargs):  # the last step before the output is published
        result = original(*args, **kwargs)
        target.write_text("mine\n")
        return result

    monkeypatch.setattr(module, step, step_then_a_file_appears)
    flags = [] if how == "savedmodel" else ["--format", how]
    assert one_line(capsys, "export.py", "--logdir", logdir, "--export_dir", target, *flags) == (
        "error: --export_dir %s already exists (it appeared while the export ran, and is left as it was): remove it "
        "or choose another" % target)
    assert target.read_text() == "mine\n" and os.listdir(exports) == [target.name]


@pytest.mark.parametrize("tool, flag, value", [
    ("export.py", "--from_code", "de/../../elsewhere"), ("export.py", "--to_code", ".."),
    ("export.py", "--from_code", "de\nen"), ("avg_checkpoints.py", "--output", "avg_last1/../../elsewhere"),
    ("avg_checkpoints.py", "--output", "avg_last1\nx"),
    ("avg_checkpoints.py", "--output", "last1\nx")])
def test_names_that_become_paths_hold_only_letters_digits_hyphens_and_underscores(model, tmp_path, capsys,  # noqa: F811
                                                                                  tool, flag, value):
    logdir, data_dir = model
    (tmp_path / "exports").mkdir()
    before = snapshot(logdir, data_dir, tmp_path)
    args = (["--export_dir", tmp_path / "exports" / "de_en.argosmodel", "--format", "argos", "--from_name", "German",
             "--to_name", "English"] if tool == "export.py"
            else ["--last", "1"])
    what = "a language code" if tool == "export.py" else "a checkpoint name"
    assert one_line(capsys, tool, "--logdir", logdir, *args, flag, value) == (
        "error: %s %s: %s may hold only ASCII letters, digits, '-' and '_' (it becomes part of a path); pass "
        "another %s" % (flag, ascii(value), what, flag))
    assert snapshot(logdir, data_dir, tmp_path) == before and not (tmp_path / "elsewhere").exists()


def test_a_checkpoint_name_too_long_for_a_file_name_is_one_line(model, tmp_path, capsys):  # noqa: F811
    """avg_checkpoints.py --output adds the step and the checkpoint's suffixes to the name: a name of 300 letters
    would end in TensorFlow's 'File name too long' after the average was computed."""
    logdir, data_dir = model
    before = snapshot(logdir, data_dir, tmp_path)
    assert one_line(capsys, "avg_checkpoints.py", "--logdir", logdir, "--last", "1", "--output", "a" * 300) == (
        "error: --output aaaaaaaaaaaaaaaaaaaa... (300 characters): a checkpoint name may be at most 128 characters "
        "long (it becomes part of a file name); pass another --output")
    assert snapshot(logdir, data_dir, tmp_path) == before
