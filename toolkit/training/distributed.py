"""The clusters train.py --distribute runs on (tf.distribute in TF1 graph mode, with sessions), and
how their processes agree on when to stop and where to start. The step itself, and how a replica
takes its rows of the global batch, is toolkit/training/step.py's.

    cluster = make_cluster(hp, session_config(hp))   # before any graph is built
    votes = build_votes(cluster)
    with tf1.Session(cluster.target, config=cluster.config) as sess:
        agree_on_checkpoint(sess, votes, latest_checkpoint_or_None)  # then restore or initialize
        while not any(agree_to_stop(sess, votes, signal, out_of_time)):  # before every step
            step.run(sess, ...)

--distribute none         one process, one device: no strategy; the step runs once on the
                          whole batch.
--distribute mirrored     one process, several devices (--devices, default every GPU):
                          tf.distribute.MirroredStrategy.
--distribute multiworker  one process per host (or per CPU worker), tf.compat.v1
                          MultiWorkerMirroredStrategy; the cluster and this process's place in it
                          come from the TF_CONFIG environment variable, e.g. {"cluster": {"worker":
                          ["host1:2222", "host2:2222"]}, "task": {"type": "worker", "index": 0}}.
                          Each process serves its part of the graph on a tf.distribute.Server
                          and runs its session on that server; worker 0 (or the "chief" task)
                          is the chief.

Every process reads the same sequence of global batches (same files, same seed). Variables are
mirrored: their checkpoint names are those of a single-process run, so checkpoints move freely
between --distribute none, mirrored and multiworker. In multiworker mode the chief's initial values
are broadcast to every worker when the variables are initialized; a resumed run restores the
chief's checkpoint on every worker, so the logdir must be on a file system that every host sees.
Only the chief writes checkpoints, summaries and BLEU.

All workers must run the same number of steps (each step is a collective operation), so stopping is
agreed on: before every step the workers all-reduce their stop votes (Ctrl-C, SIGTERM,
--max_minutes), and all of them stop before that step if any of them voted. A worker that dies makes
the next collective of the others fail (UnavailableError); restart all of them, they resume from the
chief's last checkpoint.
"""
import copy
import json
import os
import zlib
from collections import namedtuple

import tensorflow as tf

from toolkit.base.errors import UserError

tf1 = tf.compat.v1

DISTRIBUTE_MODES = ("none", "mirrored", "multiworker")

#: strategy: a tf.distribute strategy, None for --distribute none. is_chief: this process writes
#: checkpoints, summaries and BLEU. target, config: what tf1.Session takes. task: e.g. "worker 1 of
#: 2" (for messages).
#: process_index: 0 for the chief, 1, 2, ... for the other workers (add it to the graph seed, so
#: that their dropout masks differ; initial values come from the chief anyway).
#: server: the running tf.distribute.Server of a multiworker process (kept alive by this reference),
#: else None.
Cluster = namedtuple("Cluster", "strategy is_chief target config task process_index server")

#: A process's vote (a (2,) float64 placeholder) and its mean over the processes of the cluster (the
#: placeholder itself when this process is the only one).
Vote = namedtuple("Vote", "mine mean")

#: The Votes that agree_to_stop, agree_on_checkpoint and agree_on_total run (build_votes).
Votes = namedtuple("Votes", "stop checkpoint total")


# ---------------------------------------------------------------- strategies
def parse_devices(devices):
    """"/gpu:0,/gpu:1" -> ["/gpu:0", "/gpu:1"]; "" -> every visible GPU. Raises UserError with fewer
    than 2."""
    names = [d.strip() for d in devices.split(",") if d.strip()]
    if not names:
        names = ["/gpu:%d" % i for i in range(len(tf.config.list_physical_devices("GPU")))]
    if len(names) < 2:
        raise UserError("--distribute mirrored needs at least two devices but found %s: pass "
                        "--devices, e.g. --devices /gpu:0,/gpu:1 (or /cpu:0,/cpu:1 to try it on a "
                        "CPU)" % (names or "no GPU"))
    return names


def cpu_device_count(devices):
    """How many CPU devices a session must create for devices
    (["/cpu:0", "/cpu:1", "/gpu:0"] -> 2)."""
    indices = [tf.DeviceSpec.from_string(d).device_index or 0 for d in devices
               if tf.DeviceSpec.from_string(d).device_type.upper() == "CPU"]
    return max(indices, default=0) + 1


def read_tf_config():
    """The TF_CONFIG environment variable as (cluster dict, task type, task index). Raises UserError
    if it is missing or does not name this task inside the cluster."""
    text = os.environ.get("TF_CONFIG", "")
    if not text:
        raise UserError("--distribute multiworker needs the TF_CONFIG environment variable, e.g. "
                        '{"cluster": {"worker": ["host1:2222", "host2:2222"]}, "task": {"type": '
                        '"worker", "index": 0}} (scripts/launch_local_cluster.sh sets it for '
                        'workers on this machine)')
    try:
        config = json.loads(text)
        cluster, task_type = config["cluster"], config["task"]["type"]
        task_index = int(config["task"]["index"])
    except (ValueError, KeyError, TypeError) as error:
        raise UserError("TF_CONFIG is not {\"cluster\": {...}, \"task\": {\"type\": ..., "
                        "\"index\": ...}}: %s (%r)" % (error, text[:200])) from None
    if task_type not in ("chief", "worker"):
        raise UserError("TF_CONFIG task type is %r; training processes are \"chief\" or \"worker\""
                        % task_type)
    if not 0 <= task_index < len(cluster.get(task_type, [])):
        raise UserError("TF_CONFIG task %s %d is not in its cluster %s"
                        % (task_type, task_index, cluster))
    return cluster, task_type, task_index


def is_chief_task():
    """Whether this process writes the logdir, known before the flags are resolved (train.py locks
    the logdir first): with TF_CONFIG, the "chief" task or, in a cluster without one, worker 0 (as
    MultiWorkerMirroredStrategy decides); without TF_CONFIG, always. A TF_CONFIG that make_cluster
    would refuse counts as the chief here."""
    if not os.environ.get("TF_CONFIG"):
        return True
    try:
        cluster, task_type, task_index = read_tf_config()
    except UserError:
        return True
    return task_type == "chief" or ("chief" not in cluster and task_index == 0)


def make_cluster(hp, config):
    """The strategy of hp.distribute and how to open sessions for it. config: the tf1.ConfigProto to
    start from (left unchanged; the Cluster holds a copy with what the strategy needs).

    Call it before building the graph: a multiworker process starts its tf.distribute.Server here.
    """
    config = copy.deepcopy(config)
    if hp.distribute == "none":
        return Cluster(None, True, "", config, "single process", 0, None)
    if hp.distribute == "mirrored":
        devices = parse_devices(hp.devices)
        config.device_count["CPU"] = max(config.device_count["CPU"], cpu_device_count(devices))
        return Cluster(tf.distribute.MirroredStrategy(devices), True, "", config,
                       "mirrored on " + ",".join(devices), 0, None)
    if hp.distribute != "multiworker":
        raise UserError("--distribute must be one of %s, not %r"
                        % (", ".join(DISTRIBUTE_MODES), hp.distribute))
    cluster, task_type, task_index = read_tf_config()
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster), task_type=task_type, task_id=task_index, rpc_layer="grpc")
    strategy = tf1.distribute.experimental.MultiWorkerMirroredStrategy(cluster_resolver=resolver)
    config = strategy.update_config_proto(config)
    server = tf.distribute.Server(resolver.cluster_spec(), job_name=task_type,
                                  task_index=task_index, config=config, start=True)
    process_index = task_index + (len(cluster.get("chief", [])) if task_type == "worker" else 0)
    return Cluster(strategy, strategy.extended.should_checkpoint, server.target, config,
                   "%s %d of %d"
                   % (task_type, task_index, sum(len(tasks) for tasks in cluster.values())),
                   process_index, server)


# ------------------------------------------------------ agreeing on when to stop and where to start
def cluster_mean(cluster, values):
    """values: (k,) float64, one per process. Returns (k,) their mean over the processes of the
    cluster: values itself (the same tensor) when this process is the only one."""
    if cluster.server is None:
        return values
    return cluster.strategy.reduce(tf.distribute.ReduceOp.MEAN, values, axis=None)


def build_votes(cluster):
    """The Votes of this process: a (2,) float64 placeholder each, and its mean over the cluster."""
    votes = [tf1.placeholder(tf.float64, [2]) for _ in Votes._fields]
    return Votes(*(Vote(vote, cluster_mean(cluster, vote)) for vote in votes))


def agree_to_stop(sess, votes, signal, out_of_time):
    """Every process calls this before every step; it returns the same answer in all of them.

    signal: this process's pending stop request (e.g. "SIGINT") or None. out_of_time: its
    --max_minutes passed.
    Returns (any process has a stop request, any process is out of time).
    """
    if votes.stop.mean is votes.stop.mine:  # a single process: nothing to agree on, nothing to run
        return bool(signal), bool(out_of_time)
    votes = sess.run(votes.stop.mean,
                     {votes.stop.mine: [float(bool(signal)), float(bool(out_of_time))]})
    return bool(votes[0] > 0), bool(votes[1] > 0)


def agree_on_total(sess, votes, total, is_chief):
    """Every process calls this at the same step with its own estimate of the learning-rate
    schedule's end step (or of the steps to the next estimate); all of them return the chief's (the
    one process that times the dev evaluations)."""
    if votes.total.mean is votes.total.mine:
        return int(total)
    chief_total, chiefs = sess.run(votes.total.mean,
                                   {votes.total.mine: [total * is_chief, float(is_chief)]})
    return int(round(chief_total / chiefs))


def checkpoint_fingerprint(ckpt):
    """A number naming a checkpoint path by its file name (hosts may mount the logdir elsewhere):
    crc32 of the name modulo 2^24, so that its square is exact in float64;
    None (no checkpoint) -> -1."""
    return -1 if ckpt is None else zlib.crc32(os.path.basename(ckpt).encode("utf-8")) % 2 ** 24


def agree_on_checkpoint(sess, votes, ckpt):
    """Every process calls this before restoring or initializing the variables, with the checkpoint
    it would restore (None to initialize). Raises UserError in every process unless all of them name
    the same checkpoint (a process that can not see the chief's logdir would otherwise wait forever
    for the chief's initial values)."""
    if votes.checkpoint.mean is votes.checkpoint.mine:
        return
    mine = float(checkpoint_fingerprint(ckpt))
    mean, mean_square = sess.run(votes.checkpoint.mean,
                                 {votes.checkpoint.mine: [mine, mine * mine]})
    # the mean of squares exceeds the squared mean unless all agree
    if mean != mine or mean_square != mine * mine:
        raise UserError("the workers disagree on the checkpoint to resume from (this one: %s); "
                        "every worker must see the chief's --logdir (a shared file system)"
                        % (ckpt or "none, start from scratch"))
