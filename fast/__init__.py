"""The fast path (--impl fast): model.Transformer computed with fewer passes over memory,
behind one seam.

toolkit.implementation.build_transformer(config) is the only door in: for config.impl "fast" it
imports fast.model.FastTransformer, which overrides the reference Transformer's encode, decode,
loss, cached_decoder and optimizer with
  fast/layers.py   modules.py's functions with fused q/k/v products, mixed precision, 16-bit
                   dropout decisions and layer norm's gradient written out; the C++ kernels in
                   training with --kernels fused;
  fast/loss.py     the output layer's label-smoothed loss in chunks of rows, with no
                   (tokens, V) logits;
  fast/kernels.py  the C++ kernels (fast/csrc/) and their builder.
Nothing outside this package and toolkit/implementation.py imports it (train.py resolves --kernels
through toolkit.implementation.resolve_kernels). The two paths make the same variables under the
same names; tests/test_model.py, test_decoding.py and test_impl.py hold them to the same loss,
gradients and tokens.
"""
