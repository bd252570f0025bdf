"""The support of the design's files and the tools, in four layers; docs/design.md's table names
what each module owns.

    base/         beneath the design: a tool's process and errors, files read and written, ids.
                  Imports none of the design's files.
    data/         beneath the design: the data dir, the corpora it is built from, BPE-dropout.
    training/     above the design: a training run (its step, graph, budget, checkpoints, logdir).
    translating/  above the design: a trained model loaded, text in and translations out, the
                  CTranslate2 and Argos forms of a model.
    serving/      serve.py's own: the model behind the API, its requests, LibreTranslate's extras.

A layer imports the layers above it in this list, never one below. Nothing here imports a tool.
"""
