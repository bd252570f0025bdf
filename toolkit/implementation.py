"""--impl, the one place that chooses between the model's two implementations: model.Transformer
(the paper on plain TensorFlow ops) and fast.model.FastTransformer (fast/), which is imported only
when --impl says fast; and the optimizer of the implementation chosen."""
import tensorflow as tf

from model import ModelConfig, Transformer, schedule_total_steps
from modules import noam_cooldown_scheme, noam_scheme, warmup_decay_scheme

tf1 = tf.compat.v1


def transformer_class(impl):
    """The class of --impl: Transformer ("reference") or FastTransformer ("fast", imported only
    then)."""
    if impl == "reference":
        return Transformer
    from fast.model import FastTransformer
    return FastTransformer


def build_transformer(config):
    """The model of config (a ModelConfig) in the implementation it names."""
    return transformer_class(config.impl)(config)


def resolve_kernels(hp):
    """Replaces hp.kernels "auto" by "fused" or "tf" (fast.kernels.resolve_kernels); the reference
    implementation runs no kernel of fast/ and does not import it: "tf"."""
    if hp.impl == "reference":
        hp.kernels = "tf"
        return
    from fast.kernels import resolve_kernels as resolve_fast_kernels
    resolve_fast_kernels(hp)


def make_optimizer(hp, global_step):
    """Adam (Section 5.3; the implementation's optimizer) on the learning-rate schedule of
    hp.lr_schedule.
    Returns optimizer, lr, and the variable that holds the schedule's end step
    (schedule_total_steps).

    Under --precision fp16 it is wrapped in dynamic loss scaling (Micikevicius et al., 2018): the
    loss is multiplied by a scale before differentiation so that small float16 gradients do not
    flush to zero, the gradients are divided by it, and a step with non-finite gradients is skipped
    and halves the scale (which doubles after 2,000 good steps).
    """
    schedule, total_steps = hp.lr_schedule, schedule_total_steps()
    if schedule == "noam":
        lr = noam_scheme(hp.lr, global_step, hp.warmup_steps)
    elif schedule == "noam_cooldown":
        lr = noam_cooldown_scheme(hp.lr, global_step, hp.warmup_steps, total_steps,
                                  hp.cooldown_fraction)
    else:
        lr = warmup_decay_scheme(hp.lr, global_step, hp.warmup_steps, total_steps, decay=schedule)
    config = ModelConfig.from_flags(hp)
    optimizer = transformer_class(config.impl).optimizer(config, lr)
    if hp.precision == "fp16":
        optimizer = tf1.mixed_precision.MixedPrecisionLossScaleOptimizer(optimizer, "dynamic")
    return optimizer, lr, total_steps
