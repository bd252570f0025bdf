"""Metadata is checked before it is used: --init_from's checkpoint is read whole before a new run
writes anything, a logdir that holds a run does not take another's weights, --config's file and
values are named when wrong, and every JSON file the toolkit reads (best.json, manifest.json,
hparams.json, configs) has the types of its values checked, ending a hand edit in one line."""
import hashlib
import json
import os
import re
import shutil

import pytest
import tensorflow as tf

import prepro
import serve
import translate
from in_process import run_in_process
from test_faults import fresh_train, model, one_line  # noqa: F401 (model: a fixture)
from test_ownership import snapshot
from toolkit.data.datadir import MANIFEST_NAME
from toolkit.training.flags import with_config


def halve(path):
    os.truncate(path, os.path.getsize(path) // 2)


def test_a_damaged_init_from_is_one_line_and_writes_nothing(model, tmp_path, capsys):  # noqa: F811
    logdir, data_dir = model
    ckpt = tf.train.latest_checkpoint(str(logdir))
    for damage, target in ((halve, ckpt + ".data-00000-of-00001"), (halve, ckpt + ".index"),
                           (None, str(logdir / "specs.txt"))):
        if damage:
            damage(target)
        source = ckpt if damage else target
        new = tmp_path / ("new-%s" % os.path.basename(target))
        line = one_line(capsys, *fresh_train(data_dir, new, "--init_from", source))
        assert re.fullmatch(r"error: cannot read checkpoint %s \(.+\): it is damaged; pass another "
                            r"--init_from" % re.escape(source), line), line
        assert not new.exists()


def test_an_init_from_whose_weights_do_not_fit_is_one_line_and_writes_nothing(model, tmp_path, capsys):  # noqa: F811
    logdir, data_dir = model
    edit_json(logdir / "hparams.json", d_model=48)  # its checkpoints hold d_model 32
    new = tmp_path / "new"
    line = one_line(capsys, "train.py", "--data_dir", data_dir, "--logdir", new, "--max_steps", "2",
                    "--init_from", logdir)  # the model's flags from the source run
    assert re.fullmatch(r"error: --init_from %s \(.+\) does not fit the model of this run: .+ is \[\d+, 32\] in "
                        r"the checkpoint but \[\d+, 48\] in the model" % re.escape(str(logdir)), line), line
    assert not new.exists()


def test_a_json_file_with_a_key_given_twice_is_one_line_and_a_byte_order_mark_is_read(model, tmp_path,  # noqa: F811
                                                                                     capsys):
    logdir, data_dir = model
    config, new = tmp_path / "config.json", tmp_path / "new"
    config.write_text('{"lr": 0.001, "lr": 5}')
    assert one_line(capsys, *fresh_train(data_dir, new, "--config", config)) == (
        'error: %s is not valid JSON (the key "lr" is given twice): fix it, or pass another --config' % config)
    hparams = logdir / "hparams.json"
    hparams.write_text(hparams.read_text().replace('"d_model": 32', '"d_model": 32, "d_model": 64'))
    line = one_line(capsys, "translate.py", "--logdir", logdir, "eins")
    assert line.startswith('error: %s is not valid JSON (the key "d_model" is given twice): ' % hparams), line
    assert not new.exists()
    config.write_text("\ufeff" + json.dumps({"lr": 0.002}), encoding="utf-8")
    assert with_config({}, str(config)) == {"lr": 0.002}


def test_an_existing_logdir_does_not_take_another_runs_weights(model, tmp_path, capsys):  # noqa: F811
    logdir, data_dir = model
    other = tmp_path / "other"
    before = snapshot(logdir)
    line = one_line(capsys, *fresh_train(data_dir, logdir, "--init_from", other))
    assert line == ("error: --logdir %s already holds a run, which resumes from its own "
                    "checkpoints, not from --init_from %s: pass a new --logdir to fine-tune from "
                    "it, or leave out --init_from to resume" % (logdir, other))
    assert snapshot(logdir) == before


def test_config_errors_name_the_file_and_the_key(model, tmp_path, capsys):  # noqa: F811
    _, data_dir = model
    new = tmp_path / "new"
    line = one_line(capsys, *fresh_train(data_dir, new, "--config", tmp_path))
    assert line == ("error: --config %s is a directory: pass a JSON file of flag values, e.g. a "
                    "run's hparams.json" % tmp_path)
    config = tmp_path / "config.json"
    config.write_text("[" * 100000 + "]" * 100000)
    line = one_line(capsys, *fresh_train(data_dir, new, "--config", config))
    assert line == ("error: %s is nested too deeply to be read: fix it, or pass another --config"
                    % config)
    config.write_text(json.dumps({"lr": -1}))
    line = one_line(capsys, *fresh_train(data_dir, new, "--config", config))
    assert line.startswith("error: %s: lr is -1, out of range: it must be " % config), line
    assert not new.exists()


def test_the_command_line_overrides_a_config_with_one_line(tmp_path, capsys):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"lr": 0.01, "d_model": 32, "d_ff": 64}))
    given = with_config({"lr": 0.5, "d_model": 32}, str(config))
    assert given == {"lr": 0.5, "d_model": 32, "d_ff": 64}
    assert capsys.readouterr().err == ("note: the command line overrides --config %s for --lr\n"
                                       % config)


def edit_json(path, **values):
    path.write_text(json.dumps({**json.loads(path.read_text()), **values}))


def test_a_hand_edited_best_json_is_one_line(model, capsys):  # noqa: F811
    logdir, data_dir = model
    best = logdir / "best.json"
    for key, value, must_be in (("bleu", "18.0", "a number"), ("checkpoint", 7, "a string"),
                                ("step", "60", "an integer")):
        original = best.read_text()
        edit_json(best, **{key: value})
        before = snapshot(logdir)
        expected = ("error: %s: %s is %s but must be %s: fix it, or delete it: the next dev "
                    "evaluation of train.py writes it again" % (best, key, json.dumps(value),
                                                                must_be))
        assert one_line(capsys, "test.py", "--logdir", logdir, "--ckpt", "best") == expected
        assert one_line(capsys, *fresh_train(data_dir, logdir, "--max_steps", "100")) == expected
        assert snapshot(logdir) == before
        best.write_text(original)


def test_a_hand_edited_manifest_is_one_line(model, capsys):  # noqa: F811
    logdir, data_dir = model
    manifest = data_dir / MANIFEST_NAME
    edit_json(manifest, vocab_size="300")
    before = snapshot(logdir, data_dir)
    expected = ("error: %s: vocab_size is \"300\" but must be an integer: rebuild the data dir "
                "with `python prepro.py --data_dir %s --force`" % (manifest, data_dir))
    assert one_line(capsys, "test.py", "--logdir", logdir) == expected
    assert one_line(capsys, *fresh_train(data_dir, logdir, "--max_steps", "100")) == expected
    assert snapshot(logdir, data_dir) == before


def test_avg_checkpoints_on_a_truncated_index_is_one_line(model, capsys):  # noqa: F811
    logdir, _ = model
    ckpt = tf.train.latest_checkpoint(str(logdir))
    halve(ckpt + ".index")
    before = snapshot(logdir)
    line = one_line(capsys, "avg_checkpoints.py", "--logdir", logdir, "--last", "1")
    assert re.fullmatch(r"error: cannot read checkpoint %s \(.+\): it is damaged; average other "
                        r"checkpoints \(a smaller --last\) or delete it" % re.escape(ckpt), line)
    assert snapshot(logdir) == before


def test_a_fifo_for_hparams_json_and_a_damaged_ids_file_are_one_line(model, tmp_path, capsys):  # noqa: F811
    logdir, data_dir = model
    hparams = logdir / "hparams.json"
    saved = hparams.read_text()
    hparams.unlink()
    os.mkfifo(hparams)  # read, it would block forever
    line = one_line(capsys, "translate.py", "--logdir", logdir, "eins")
    assert line.startswith("error: %s is not a regular file: " % hparams), line
    hparams.unlink()
    hparams.write_text(saved)
    manifest = data_dir / MANIFEST_NAME
    original = manifest.read_text()
    for key, value in (("ids_dtype", "complex128"), ("special_ids", {"<pad>": 5, "<unk>": 1, "<s>": 2, "</s>": 3})):
        edit_json(manifest, **{key: value})
        line = one_line(capsys, *fresh_train(data_dir, tmp_path / "new"))
        assert line.startswith("error: %s: %s is %s, but prepro.py writes " % (manifest, key, json.dumps(value))), line
        manifest.write_text(original)
    ids = data_dir / "train.1.ids"
    os.truncate(ids, os.path.getsize(ids) - 3)
    line = one_line(capsys, *fresh_train(data_dir, tmp_path / "new"))
    assert line.startswith("error: %s holds %d bytes, not a whole number of uint16 ids: the data dir is damaged"
                           % (ids, os.path.getsize(ids))), line
    assert not (tmp_path / "new").exists()


def exported(logdir, export_dir, capsys):
    """logdir's model exported by export.py --format ctranslate2 to export_dir; its translate.json."""
    import export
    pytest.importorskip("ctranslate2")
    assert export.main(["--logdir", str(logdir), "--export_dir", str(export_dir), "--format", "ctranslate2"]) == 0
    capsys.readouterr()
    return export_dir / "translate.json"


#: What every line about a damaged translate.json ends with.
EXPORT_AGAIN = "export the model again with export.py --format ctranslate2"


def test_a_damaged_translate_json_is_one_line_in_translate_py_and_serve_py(model, tmp_path, capsys):  # noqa: F811
    logdir, _ = model
    settings = exported(logdir, tmp_path / "ct2", capsys)
    original = json.loads(settings.read_text())
    engine = ("--engine", "ctranslate2", "--model", tmp_path / "ct2")
    cases = [
        ("[]", "%s is not a settings file of export.py (not a JSON object): %s" % (settings, EXPORT_AGAIN)),
        ("{}", "%s: the key beam_size is missing: %s" % (settings, EXPORT_AGAIN)),
        ('{"beam_size": 4, "beam_size": 1}',
         'is not valid JSON (the key "beam_size" is given twice): %s' % EXPORT_AGAIN),
        (json.dumps({**original, "beam_size": "4"}), '%s: beam_size is "4" but must be an integer: %s'
         % (settings, EXPORT_AGAIN)),
        (json.dumps({**original, "nbest": 2}),
         "%s: nbest is not a key export.py writes: %s" % (settings, EXPORT_AGAIN)),
        (json.dumps({**original, "maxlen1": 0}),
         "%s: maxlen1 is 0, out of range: it must be at least 2 and at most 2147483647" % settings),
        (json.dumps({**original, "max_len_b": 10 ** 400}),
         "%s: max_len_b is 100000000000... (401 digits), out of range: it must be from 1 to 1000000" % settings),
    ]
    for text, expected in cases:
        settings.write_text(text)
        line = one_line(capsys, "translate.py", *engine, "eins")
        assert line.startswith("error: ") and line.endswith(expected), (text, line)
        code, _, err = run_in_process(capsys, "serve.py", serve.main, *engine)
        assert code == 2 and err == line + "\n", (text, err)
    settings.unlink()
    os.mkfifo(settings)  # read, it would block forever
    assert one_line(capsys, "translate.py", *engine, "eins") == (
        "error: %s is not a regular file: %s" % (settings, EXPORT_AGAIN))
    settings.unlink()
    settings.write_text("\ufeff" + json.dumps(original), encoding="utf-8")  # as some editors save it
    code, out, err = run_in_process(capsys, "translate.py", translate.main, *engine, "eins")
    assert code == 0 and out.strip(), err


def test_a_ctranslate2_model_dir_with_another_vocabularys_bpe_model_is_refused(model, tmp_path, capsys):  # noqa: F811
    logdir, _ = model
    settings = exported(logdir, tmp_path / "ct2", capsys)
    engine = ("--engine", "ctranslate2", "--model", tmp_path / "ct2")
    other = tmp_path / "other"
    assert prepro.main(["--dataset", "numbers", "--n_train", "300", "--n_eval", "5", "--n_test", "5",
                        "--vocab_size", "200", "--data_dir", str(other)]) == 0
    bpe_model = tmp_path / "ct2" / "bpe.model"
    original = bpe_model.read_bytes()
    shutil.copyfile(other / "bpe.model", bpe_model)
    expected = ("error: %s is not the sentencepiece model the model in %s was exported with (%s records another "
                "sha256): put back the one it was exported with, or %s"
                % (bpe_model, tmp_path / "ct2", settings, EXPORT_AGAIN))
    assert one_line(capsys, "translate.py", *engine, "eins") == expected
    code, _, err = run_in_process(capsys, "serve.py", serve.main, *engine)
    assert (code, err) == (2, expected + "\n")
    bpe_model.write_bytes(original)
    saved = json.loads(settings.read_text())
    assert saved["bpe_sha256"] == hashlib.sha256(original).hexdigest()
    del saved["bpe_sha256"]  # a directory exported before the sentencepiece model was recorded
    settings.write_text(json.dumps(saved))
    code, out, err = run_in_process(capsys, "translate.py", translate.main, *engine, "eins")
    assert code == 0 and out.strip(), err


def test_a_data_dir_of_the_other_direction_is_refused_naming_both(model, tmp_path, capsys):  # noqa: F811
    """prepro.py --reverse on the same corpus: the same vocabulary, to the other side."""
    logdir, data_dir = model
    reverse = tmp_path / "reverse"
    assert prepro.main(["--dataset", "numbers", "--n_train", "2000", "--n_eval", "50", "--n_test", "50",
                        "--vocab_size", "300", "--data_dir", str(reverse), "--reverse"]) == 0
    assert (reverse / "bpe.model").read_bytes() == (data_dir / "bpe.model").read_bytes()
    expected = ("error: the data dir %s translates en->de (its %s) but the model in %s translates de->en: pass the "
                "--data_dir it was trained on (%s), or one built in its direction"
                % (reverse, MANIFEST_NAME, logdir, data_dir))
    before = snapshot(logdir)
    for tool, args in (("translate.py", ["eins"]), ("test.py", []),
                       ("export.py", ["--export_dir", tmp_path / "x"])):
        assert one_line(capsys, tool, "--logdir", logdir, "--data_dir", reverse, *args) == expected, tool
    assert one_line(capsys, "train.py", "--logdir", logdir, "--data_dir", reverse, "--max_steps", "100") == expected
    assert snapshot(logdir) == before and not (tmp_path / "x").exists()
