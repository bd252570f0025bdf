"""Model FLOPs counted from the model's shapes, without TensorFlow: scripts/bench_train.py's model FLOP/s and MFU,
and scripts/recipe.py's estimate of a candidate's speed from another's measured one."""


def forward_flops(hp, n, t1, t2, target_tokens):
    """Multiply-add FLOPs (2 per MAC) of one forward pass on a padded batch (n, t1) -> (n, t2) whose output layer
    scores the target_tokens real (non-pad) target tokens only, as model.Transformer.loss does."""
    d, f = hp.d_model, hp.d_ff
    encoder = 2 * n * t1 * (4 * d * d + 2 * d * f) + 2 * 2 * n * t1 * t1 * d
    decoder = (2 * n * t2 * (6 * d * d + 2 * d * f) + 2 * n * t1 * 2 * d * d
               + 2 * 2 * n * t2 * t2 * d + 2 * 2 * n * t2 * t1 * d)
    return hp.num_blocks * (encoder + decoder) + 2 * target_tokens * d * hp.vocab_size


def training_flops(hp, n, t1, t2, target_tokens):
    """FLOPs of one training step on that batch: forward and backward, about 3 forward passes, over every row the
    step runs. Under R-Drop (--rdrop above 0) each row runs twice, so the step costs twice as much, while its real
    target tokens, which train.py counts once, stay target_tokens."""
    passes = 2 if getattr(hp, "rdrop", 0) > 0 else 1
    return 3 * passes * forward_flops(hp, n, t1, t2, target_tokens)
