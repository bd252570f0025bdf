"""Turning model output into text and scores: ids into detokenized text, a whole dataset's
translations back in line order, and BLEU; and Progress, how the long loops that
produce them report.

BLEU is sacreBLEU on detokenized, cased text (the scoring that published numbers can
be compared with).
"""
import math
import sys
import time

import numpy as np
import sacrebleu
from tqdm import tqdm

from toolkit.base import machine
from toolkit.base.ids import EOS_ID, PAD_ID


def postprocess(ids, sp):
    """ids: (N, T) int array ending in </s> then 0s. Returns N detokenized
    strings (sentencepiece decode)."""
    texts = []
    for row in ids:
        row = list(row)
        row = row[:row.index(EOS_ID)] if EOS_ID in row else row
        texts.append(sp.decode([int(i) for i in row if i != PAD_ID]))
    return texts


def get_hypotheses(sess, init_op, ids_op, x_seqlen_op, num_batches, order, sp, desc="translating",
                   scores_op=None, summary_op=None):
    """Translates a whole dataset, batch by batch.

    init_op initializes the iterator; ids_op gives (N, T) ids, x_seqlen_op the (N,) source lengths
    counting </s>, scores_op (if given) the (N,) scores of the translations. order: (n,) the line
    index of each row the batches give, in turn (data_load.eval_order). An empty source line
    (x_seqlen 1: </s> only) gets an empty hypothesis. summary_op (if given) is fetched with every
    batch, so that one run of the graph serves them all (a fetch of its own would run, and hold in
    memory, a second copy of the decoding graph).
    Returns a list of strings, one per source line, in line order, and the first batch's summary
    (None without summary_op). Raises FloatingPointError when a score is not finite: the model's
    log-probabilities overflowed, although its weights may be finite.
    """
    fetches = {"ids": ids_op, "x_seqlen": x_seqlen_op, "scores": scores_op, "summary": summary_op}
    fetches = {name: op for name, op in fetches.items() if op is not None}
    sess.run(init_op)
    hypotheses, first_summary = [], None
    progress = Progress(num_batches, desc, unit="batches")
    for batch in range(num_batches):
        out = sess.run(fetches)
        if "scores" in out and not np.isfinite(out["scores"]).all():
            progress.close()
            raise FloatingPointError("%s: decoding scores are not finite (batch %d of %d)"
                                     % (desc, batch + 1, num_batches))
        texts = postprocess(out["ids"], sp)
        hypotheses.extend("" if length == 1 else text for length,
                          text in zip(out["x_seqlen"], texts))
        progress.update()
        # the graph's first run in this session optimized it: hand back the memory that freed
        if batch == 0:
            first_summary = out.get("summary")
            machine.release_freed_memory()
    progress.close()
    in_line_order = [""] * len(order)
    for line, hypothesis in zip(order, hypotheses):
        in_line_order[line] = hypothesis
    return in_line_order, first_summary


#: Seconds between two progress lines of a long loop whose standard error is not a
#: terminal (see Progress).
PROGRESS_SECONDS = 60


class Progress:
    """Progress of a long loop: a tqdm bar on standard error when it is a terminal; otherwise (a log
    file, a pipe, nohup, a batch job) a line `DESC: DONE/TOTAL UNIT (P%), S s[, POSTFIX]` on `out`
    every PROGRESS_SECONDS, so that a log shows the run is alive and how far it is."""

    def __init__(self, total, desc, initial=0, unit="steps", out=None):
        self.bar = tqdm(total=total, initial=initial, desc=desc, disable=None, leave=False)
        self.total, self.desc, self.done, self.unit, self.out = total, desc, initial, unit, out
        self.start = self.last_line = time.time()
        self.postfix = ""

    def update(self, units=1, **postfix):
        """units more done; postfix: values to show (e.g. loss="2.31")."""
        self.done += units
        self.bar.update(units)
        if postfix:
            self.bar.set_postfix(**postfix)
            self.postfix = ", ".join("%s %s" % item for item in postfix.items())
        now = time.time()
        if self.bar.disable and now - self.last_line >= PROGRESS_SECONDS:
            self.last_line = now
            print("%s: %d/%d %s (%.0f%%), %.0f s%s" % (
                self.desc, self.done, self.total, self.unit, 100.0 * self.done / max(self.total, 1),
                now - self.start, ", " + self.postfix if self.postfix else ""),
                  file=self.out or sys.stdout,
                flush=True)

    def close(self):
        self.bar.close()


def calc_bleu(references, hypotheses):
    """sacreBLEU over detokenized, cased text. Returns (score, signature string)."""
    if len(references) != len(hypotheses):
        raise ValueError("%d references but %d hypotheses" % (len(references), len(hypotheses)))
    if not references:  # sacreBLEU has no signature before it scores something
        return 0.0, "no sentences"
    bleu = sacrebleu.metrics.BLEU()
    score = bleu.corpus_score(hypotheses, [references]).score
    return (0.0 if math.isnan(score) else score), str(bleu.get_signature())


def calc_chrf(references, hypotheses):
    """sacreBLEU's chrF (character 6-grams, beta 2) over detokenized text, 0-100, as
    calc_bleu takes them."""
    if len(references) != len(hypotheses):
        raise ValueError("%d references but %d hypotheses" % (len(references), len(hypotheses)))
    return sacrebleu.metrics.CHRF().corpus_score(hypotheses,
                                                 [references]).score if references else 0.0
