"""The support beneath the design's files and the tools: one module to a concept (the process and
its errors, text and ids, how outputs are written, the data dir, the logdir, training's helpers,
loading a trained model, serving). docs/design.md's table names the concept each module owns.
Nothing here imports a tool."""
