"""The fast path (--impl fast): model.Transformer computed with fewer passes over memory, behind
one seam: the functions below are the only door in.

For --impl fast, build_transformer imports fast.model.FastTransformer, which overrides the
reference Transformer's encode, decode, loss, cached_decoder and optimizer with
  fast/layers.py   modules.py's functions with fused q/k/v products, mixed precision, 16-bit
                   dropout decisions and layer norm's gradient written out; the C++ kernels in
                   training with --kernels fused;
  fast/loss.py     the output layer's label-smoothed loss in chunks of rows, with no
                   (tokens, V) logits;
  fast/kernels.py  the C++ kernels (fast/csrc/) and their builder.
For --impl reference nothing else of this package is imported. The two paths make the same
variables under the same names; tests/test_model.py, test_decoding.py and test_impl.py hold them to
the same loss, gradients and tokens.
"""


def transformer_class(impl):
    """The class of --impl: model.Transformer ("reference") or
    fast.model.FastTransformer ("fast")."""
    if impl == "reference":
        from model import Transformer
        return Transformer
    from fast.model import FastTransformer
    return FastTransformer


def build_transformer(config):
    """The model of config (a model.ModelConfig) in the implementation it names."""
    return transformer_class(config.impl)(config)


def resolved_kernels(impl, kernels):
    """--kernels resolved for --impl: "fused" or "tf" (fast.kernels.chosen_kernels says why when
    "auto" falls back); the reference implementation runs no kernel of this package: "tf"."""
    if impl == "reference":
        return "tf"
    from fast.kernels import chosen_kernels
    return chosen_kernels(kernels)
