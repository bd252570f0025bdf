"""export.py --format argos: the package installs into the real argostranslate and translates as
translate.py does at greedy, and the real LibreTranslate (in .venv-lt, which scripts/setup_env.sh
creates) serves two of them offline. argostranslate and LibreTranslate run in processes of their
own, with their data, config, cache and package folders in a temporary directory and every proxy
variable pointing at a closed port on 127.0.0.1, so that a request to anywhere but 127.0.0.1 fails
at once instead of leaving the machine."""
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from argparse import Namespace
from pathlib import Path

import pytest

import export
import translate
from in_process import run_in_process
from model_fixtures import train_tiny_model
from toolkit.translating import argos_package
from toolkit.base.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
LT_VENV = ROOT / ".venv-lt"
NOWHERE = "http://127.0.0.1:9"  # the discard port: nothing listens, a connection is refused at once
#: Argos's length limit, CTranslate2's default of 256 pieces whatever the source's length, as
#: translate.py's max_len_a * source length + max_len_b steps (counting </s>, hence 257).
ARGOS_LIMIT = ["--max_len_a", "0", "--max_len_b", "257"]

#: Installs the .argosmodel argv[1]; prints the translations of argv[2]'s lines as a JSON list.
ARGOS_TRANSLATE = """
import json, sys
import argostranslate.package, argostranslate.translate
argostranslate.package.install_from_path(sys.argv[1])
pkg = argostranslate.package.get_installed_packages()[0]
with open(sys.argv[2], encoding="utf-8") as f:
    lines = f.read().splitlines()
translate = argostranslate.translate.translate
print(json.dumps([translate(line, pkg.from_code, pkg.to_code) for line in lines]))
"""
INSTALL = "import sys, argostranslate.package as p; p.install_from_path(sys.argv[1])"


def offline_env(folder):
    """The environment of argostranslate or LibreTranslate: every folder of theirs under `folder`,
    spaCy's rule-based sentence splitting, greedy decoding, and no way out but to 127.0.0.1."""
    env = dict(os.environ, XDG_DATA_HOME=str(folder / "data"),
               XDG_CONFIG_HOME=str(folder / "config"), XDG_CACHE_HOME=str(folder / "cache"),
               ARGOS_PACKAGES_DIR=str(folder / "packages"), ARGOS_CHUNK_TYPE="SPACY",
               ARGOS_BEAM_SIZE="1", no_proxy="127.0.0.1,localhost", NO_PROXY="127.0.0.1,localhost")
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        env[name] = NOWHERE
    argos_package.write_offline_cache(env["XDG_CACHE_HOME"])
    return env


def export_package(capsys, logdir, path):
    code, _, err = run_in_process(capsys, "export.py", export.main, "--logdir", logdir,
                                  "--export_dir", path, "--format", "argos")
    assert (code, err) == (0, "")
    return path


def source_lines(data_dir, count):
    """The first `count` source lines of data_dir's test split."""
    with open(os.path.join(data_dir, "test.1"), encoding="utf-8") as f:
        return f.read().splitlines()[:count]


def greedy(capsys, logdir, lines, tmp_path):
    """translate.py's greedy translations of lines, within Argos's length limit (a looping sentence
    of the tiny model runs on to it)."""
    source = tmp_path / "greedy_input.txt"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    code, out, err = run_in_process(capsys, "translate.py", translate.main, "--logdir", logdir,
                                    "--beam_size", "1", *ARGOS_LIMIT, "--input", source)
    assert code == 0, err
    return out.splitlines()


def test_the_languages_come_from_the_flags_else_the_manifest_and_a_missing_one_is_one_line():
    flags = dict(from_code=None, to_code=None, from_name=None, to_name=None)
    langs = argos_package.languages(Namespace(**flags), {"src_lang": "de", "tgt_lang": "en"})
    assert langs == {"from_code": "de", "from_name": "German", "to_code": "en",
                     "to_name": "English"}
    esperanto = Namespace(**dict(flags, to_code="eo", to_name="Esperanto"))
    given = argos_package.languages(esperanto, {"src_lang": "de"})
    assert (given["to_code"], given["to_name"]) == ("eo", "Esperanto")
    with pytest.raises(UserError, match="names no target language: pass --to_code"):
        argos_package.languages(Namespace(**flags), {"src_lang": "de"})
    with pytest.raises(UserError, match="no name known for the language code eo: pass --to_name"):
        argos_package.languages(Namespace(**dict(flags, to_code="eo")), {"src_lang": "de"})


def test_argos_flags_are_refused_elsewhere_and_the_package_must_be_a_new_argosmodel(tmp_path):
    parser = export.build_parser()
    for argv, message in (
            (["--export_dir", str(tmp_path / "x"), "--from_code", "de"],
             "--from_code applies to --format argos"),
            (["--export_dir", str(tmp_path / "x.zip"), "--format", "argos"], "end in .argosmodel"),
            (["--export_dir", str(tmp_path), "--format", "argos"], "end in .argosmodel")):
        with pytest.raises(UserError, match=message):
            argos_package.check_flags(parser.parse_args(["--logdir", "l"] + argv))
    (tmp_path / "old.argosmodel").write_text("")
    with pytest.raises(UserError, match="already exists"):
        argos_package.check_output(str(tmp_path / "old.argosmodel"))


def test_the_installed_package_translates_as_translate_py_does_at_greedy(tiny_model, tmp_path,
                                                                         capsys):
    logdir, data_dir = tiny_model
    path = export_package(capsys, logdir, str(tmp_path / "de_en.argosmodel"))
    meta = argos_package.read_metadata(path)
    assert (meta["from_code"], meta["to_code"], meta["type"]) == ("de", "en", "translate")
    sources = source_lines(data_dir, 24)
    ours = greedy(capsys, logdir, sources, tmp_path)
    assert len(set(ours)) > 12, ours  # a comparison that can tell sentences apart
    (tmp_path / "sources.txt").write_text("\n".join(sources) + "\n", encoding="utf-8")
    command = [sys.executable, "-c", ARGOS_TRANSLATE, path, str(tmp_path / "sources.txt")]
    run = subprocess.run(command, env=offline_env(tmp_path / "argos"), capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "port=9" not in run.stderr  # nothing tried to download
    assert json.loads(run.stdout) == ours


@pytest.fixture(scope="module")
def tiny_reverse_model(tmp_path_factory):
    """(logdir, data_dir): tiny_model's recipe on the reversed numbers corpus (prepro.py --reverse),
    a real en->de model."""
    return train_tiny_model(tmp_path_factory.mktemp("tiny_reverse_model"), "--reverse")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def libretranslate_command(port):
    """The command that starts .venv-lt's LibreTranslate on 127.0.0.1:port; skips the test without
    it (fails it in CI)."""
    program = LT_VENV / "bin" / "libretranslate"
    if not program.exists():
        message = "needs LibreTranslate in %s: WITH_LIBRETRANSLATE=1 bash scripts/setup_env.sh" \
            % LT_VENV
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return [str(program), "--host", "127.0.0.1", "--port", str(port), "--disable-web-ui",
            "--disable-files-translation"]


def wait_for(url, process, seconds=180):
    """Polls url until it answers; fails if the process ends first or time runs out."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert process.poll() is None, "LibreTranslate ended with exit code %s" % process.returncode
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return json.load(response)
        except OSError:
            time.sleep(0.5)
    pytest.fail("LibreTranslate did not answer %s within %d s" % (url, seconds))


def formatted_alike(source, translation):
    """Whether LibreTranslate leaves translation as it is: it copies the source's final punctuation
    mark and first letter's case onto a translation, and here these already agree."""
    return source[-1] == translation[-1] == "." and source[0].isupper() == translation[0].isupper()


def stop(server):
    server.terminate()
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


@pytest.mark.slow
def test_libretranslate_serves_both_directions_offline(tiny_model, tiny_reverse_model, tmp_path,
                                                       capsys):
    from libretranslatepy import LibreTranslateAPI
    port = free_port()
    command = libretranslate_command(port)
    env = offline_env(tmp_path / "lt")
    expected = {}
    models = ((tiny_model, ("de", "en")), (tiny_reverse_model, ("en", "de")))
    for (logdir, data_dir), pair in models:
        path = export_package(capsys, logdir, str(tmp_path / ("%s_%s.argosmodel" % pair)))
        subprocess.run([str(LT_VENV / "bin" / "python"), "-c", INSTALL, path], env=env, check=True,
                       timeout=120, capture_output=True)
        sources = source_lines(data_dir, 12)
        expected[pair] = list(zip(sources, greedy(capsys, logdir, sources, tmp_path)))
    with open(tmp_path / "libretranslate.log", "w+", encoding="utf-8") as log:
        server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            languages = wait_for("http://127.0.0.1:%d/languages" % port, server)
            targets = {lang["code"]: sorted(lang["targets"]) for lang in languages}
            assert targets == {"de": ["de", "en"], "en": ["de", "en"]}
            client = LibreTranslateAPI("http://127.0.0.1:%d/" % port)
            for (source_lang, target_lang), pairs in expected.items():
                same = [(source, ours) for source, ours in pairs if formatted_alike(source, ours)]
                assert len(same) >= 3, pairs
                theirs = [client.translate(source, source_lang, target_lang) for source, _ in same]
                assert theirs == [ours for _, ours in same]
        finally:
            stop(server)
        log.seek(0)
        output = log.read()
    assert "Updating language models" not in output and "port=9" not in output, output[-2000:]
