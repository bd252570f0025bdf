"""The shape of the source tree (docs/design.md): the design's files and the tools at the top, the support in
toolkit/, each default stated once, lines that fit in 100 columns, and imports that go one way."""
import ast
import os
import sys

from hparams import MODEL_DEFAULTS, Hparams
from model import ModelConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: The top-level modules: the design's files and the tools a user runs.
DESIGN = {"hparams", "data_load", "modules", "model", "train", "test", "utils", "prepro", "decoding"}
TOOLS = {"train", "test", "prepro", "translate", "serve", "export", "avg_checkpoints", "plot_attention"}
#: Where lines are at most 100 columns: the top level, fast/ and toolkit/ with its layers.
LIMITED_DIRS = ("", "fast") + tuple(os.path.relpath(path, ROOT) for path, _, _
                                    in sorted(os.walk(os.path.join(ROOT, "toolkit")))
                                    if not path.endswith("__pycache__"))
#: toolkit/'s layers, lowest first (toolkit/__init__.py): base and data lie beneath the design's
#: files, the others above them; a layer imports only the layers before it.
LAYERS = ("toolkit.base", "toolkit.data", "toolkit.training", "toolkit.translating",
          "toolkit.serving")
MAX_COLUMNS = 100


def python_files(directory):
    path = os.path.join(ROOT, directory)
    return sorted(os.path.join(path, name) for name in os.listdir(path) if name.endswith(".py"))


def imported_modules(path):
    """The top-level module names and toolkit.* modules that the file at path imports."""
    names = set()
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            if node.module == "toolkit":
                names.update("toolkit." + alias.name for alias in node.names)
    return names


def module_name(path):
    relative = os.path.relpath(path, ROOT)[:-len(".py")].replace(os.sep, ".")
    return relative[:-len(".__init__")] if relative.endswith(".__init__") else relative


def project_import_graph():
    """{module: the project's modules it imports} over the top level, fast/ and toolkit/."""
    files = [path for directory in LIMITED_DIRS for path in python_files(directory)]
    modules = {module_name(path): path for path in files}
    return {name: {other for other in imported_modules(path) if other in modules and other != name}
            for name, path in modules.items()}


def test_the_top_level_holds_the_design_and_the_tools_only():
    top = {os.path.basename(path)[:-len(".py")] for path in python_files("")}
    assert top == DESIGN | TOOLS


def test_no_support_module_imports_a_tool():
    graph = project_import_graph()
    for name, imports in graph.items():
        if name.startswith(("toolkit", "fast")) or name in DESIGN - TOOLS:
            assert not imports & (TOOLS - DESIGN), (name, imports & TOOLS)


def layer_of(module):
    return next((layer for layer in LAYERS if (module + ".").startswith(layer + ".")), None)


def test_each_layer_imports_only_the_layers_beneath_it():
    for name, imports in project_import_graph().items():
        layer = layer_of(name)
        if layer is None:
            continue
        below = LAYERS[:LAYERS.index(layer) + 1]
        # a layer's own package (toolkit.translating) and toolkit.version stand with no layer
        assert all(layer_of(other) in below for other in imports if layer_of(other)), (name, sorted(imports))
        if layer in ("toolkit.base", "toolkit.data"):  # beneath the design
            assert not imports & DESIGN, (name, imports & DESIGN)


def test_the_import_graph_has_no_circle():
    graph = project_import_graph()
    done, path = set(), []

    def visit(name):
        assert name not in path, "import circle: %s" % " -> ".join(path[path.index(name):] + [name])
        if name in done:
            return
        path.append(name)
        for other in sorted(graph[name]):
            visit(other)
        path.pop()
        done.add(name)

    for name in sorted(graph):
        visit(name)


def test_lines_fit_in_100_columns():
    long_lines = ["%s:%d (%d columns)" % (os.path.relpath(path, ROOT), number, len(line))
                  for directory in LIMITED_DIRS for path in python_files(directory)
                  for number, line in enumerate(open(path, encoding="utf-8").read().splitlines(), 1)
                  if len(line) > MAX_COLUMNS]
    assert not long_lines


def test_the_model_config_defaults_are_the_flags_defaults():
    flags = Hparams().parser.parse_args([])
    config = ModelConfig(vocab_size=8, precision="fp32", kernels="tf")
    for name in MODEL_DEFAULTS:
        assert getattr(config, name) == getattr(flags, name) == MODEL_DEFAULTS[name], name
    assert flags.attention_dropout is None  # not given: the dropout rate
    assert config.attention_dropout == flags.dropout_rate


def test_train_py_does_not_import_the_fast_kernels_for_the_reference_implementation(tmp_path):
    import subprocess
    code = ("import sys, train; from argparse import Namespace; "
            "import fast; fast.resolved_kernels('reference', 'auto'); "
            "print('fast.kernels' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip().splitlines()[-1] == "False"
