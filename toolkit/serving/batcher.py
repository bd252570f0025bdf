"""The worker thread of serve.py that runs the model: the sentences of the requests that arrive
close together are translated together, in batches sorted by length; a full queue or a request past
its time is refused. A new model is swapped in between batches: each request is translated by the
model that served when it was queued, and a model swapped out is closed after its last batch."""
import asyncio
import concurrent.futures
import queue
import threading
import time

from toolkit.translating.sentences import run_sources


class ApiError(Exception):
    """A request the server refuses: its HTTP status and the message of {"error": ...}."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


class Model:
    """A translator the worker runs and its name (LOGDIR@CHECKPOINT, or the CTranslate2 model's
    directory), with the count of queued jobs that it is to run: swapped out (retired), it is
    closed once that count is 0."""

    def __init__(self, translator, name):
        self.translator, self.name = translator, name
        self.jobs, self.retired, self.closed = 0, False, False


class Job:
    """The model inputs of one request, whether it wants their attention, how to decode them
    (settings: a decoding.DecodingSettings, None for the translator's own; n translations per
    source, None for the translator's own), their target prefixes (per source its ids, [] for
    none; None without), and the future of their results."""

    def __init__(self, sources, attention, settings=None, n=None, prefixes=None):
        self.sources, self.attention, self.settings, self.n = sources, attention, settings, n
        self.prefixes = prefixes if prefixes and any(prefixes) else None
        self.future = concurrent.futures.Future()
        self.model = None  # the Model that runs it: the one serving when it was queued

    def kind(self):
        """What the jobs run together share: the attention pass, settings, n, and whether they have
        prefixes (a graph of its own)."""
        return self.model, self.attention, self.settings, self.n, self.prefixes is not None


class Batcher:
    """A worker thread that runs the model on the sentences of every request: it takes the first
    waiting job and those that arrive within `wait` seconds, up to batch_size sentences, and runs
    them together in batches sorted by length (those that want attention apart, with the
    translator's attention pass). At most queue_size requests wait at once; each waits at most
    `timeout` seconds."""

    def __init__(self, translator, batch_size, wait, queue_size, timeout, name=""):
        self.model, self.batch_size, self.wait = Model(translator, name), batch_size, wait
        self.queue_size, self.timeout = queue_size, timeout
        # guards the models' job counts and the swap (the event loop's thread and the worker's)
        self.lock = threading.Lock()
        # requests waiting or being translated; touched by the event loop's thread only
        self.pending = 0
        self.jobs = queue.Queue()
        self.thread = threading.Thread(target=self.work, name="translator", daemon=True)
        self.thread.start()

    @property
    def translator(self):
        """The translator serving now."""
        return self.model.translator

    async def translate(self, sources, attention, settings=None, n=None, prefixes=None):
        """The translator's results of sources, through the worker's queue
        (429 when it is full, 504 past --timeout)."""
        return (await self.translate_named(sources, attention, settings, n, prefixes))[0]

    async def translate_named(self, sources, attention, settings=None, n=None, prefixes=None):
        """(results, name): translate's results and the name of the model that gave them."""
        if not sources:
            return [], self.model.name
        if self.pending >= self.queue_size:
            raise ApiError(429, "Too many requests: %d are waiting (--queue_size); try again "
                                "shortly" % self.pending)
        self.pending += 1
        try:
            job = self.queued(Job(sources, attention, settings, n, prefixes))
            results = await asyncio.wait_for(asyncio.wrap_future(job.future), self.timeout)
            return results, job.model.name
        except asyncio.TimeoutError:
            raise ApiError(504, "the translation took longer than this server's --timeout of %g s: "
                                "send fewer sentences or try again later" % self.timeout) from None
        finally:
            self.pending -= 1

    def submit(self, sources, attention, settings=None, n=None, prefixes=None):
        """Queues one request's model inputs (a Job's fields); returns the concurrent future of
        their translator results."""
        return self.queued(Job(sources, attention, settings, n, prefixes)).future

    def queued(self, job):
        """job, queued for the model serving now."""
        with self.lock:
            job.model = self.model
            job.model.jobs += 1
        self.jobs.put(job)
        return job

    def swap(self, translator, name):
        """Serves translator (named name) from now on: the jobs queued before still run on the
        model they were queued for, which is closed after them."""
        with self.lock:
            old, self.model = self.model, Model(translator, name)
            old.retired = True
        self.release(old, done=0)

    def release(self, model, done=1):
        """Counts `done` jobs of model as run; closes it once retired with no job left."""
        with self.lock:
            model.jobs -= done
            close = model.retired and model.jobs == 0 and not model.closed
            model.closed = model.closed or close
        if close:
            model.translator.close()

    def stop(self):
        """Ends the worker once the jobs queued before are done."""
        self.jobs.put(None)
        self.thread.join()

    def work(self):
        stopping = False
        while not stopping:
            jobs, stopping = self.collect(self.jobs.get())
            # not those timed out
            self.run_jobs([job for job in jobs if job.future.set_running_or_notify_cancel()])
            for job in jobs:
                self.release(job.model)

    def collect(self, job):
        """The jobs to run together, from job (None: stop) on; and whether stop was asked."""
        jobs, deadline = [], time.monotonic() + self.wait
        while job is not None:
            jobs.append(job)
            remaining = deadline - time.monotonic()
            if sum(len(job.sources) for job in jobs) >= self.batch_size or remaining <= 0:
                return jobs, False
            try:
                job = self.jobs.get(timeout=remaining)
            except queue.Empty:
                return jobs, False
        return jobs, True

    def run_jobs(self, jobs):
        """Runs the jobs in groups of the same kind (Job.kind: the same model among them)."""
        for kind in dict.fromkeys(job.kind() for job in jobs):
            self.run_group([job for job in jobs if job.kind() == kind])

    def run_group(self, jobs):
        """Runs the sources of jobs of one kind at once (with the attention pass when they want it,
        under their settings, n and prefixes) and hands each job its results (or the error)."""
        first = jobs[0]
        options = {"with_attention": first.attention, **({} if first.settings is None else {
            "settings": first.settings, "n": first.n})}
        prefixes = None if first.prefixes is None else [
            prefix for job in jobs for prefix in job.prefixes]
        try:
            results = run_sources(first.model.translator, [source for job in jobs for source
                                                    in job.sources], prefixes, **options)
        except Exception as error:  # noqa: BLE001 (each request answers 500 with it)
            for job in jobs:
                job.future.set_exception(error)
            return
        start = 0
        for job in jobs:
            job.future.set_result(results[start:start + len(job.sources)])
            start += len(job.sources)
