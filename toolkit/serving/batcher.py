"""The worker thread of serve.py that runs the model: the sentences of the requests that arrive
close together are translated together, in batches sorted by length; a full queue or a request past
its time is refused."""
import asyncio
import concurrent.futures
import dataclasses
import functools
import queue
import threading
import time

from data_load import run_in_length_batches


class ApiError(Exception):
    """A request the server refuses: its HTTP status and the message of {"error": ...}."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


class Job:
    """The model inputs of one request, whether it wants their attention, its beam size (None: the
    translator's own), and the future of their results."""

    def __init__(self, sources, attention, beam=None):
        self.sources, self.attention, self.beam = sources, attention, beam
        self.future = concurrent.futures.Future()


class Batcher:
    """A worker thread that runs the model on the sentences of every request: it takes the first
    waiting job and those that arrive within `wait` seconds, up to batch_size sentences, and runs
    them together in batches sorted by length (those that want attention apart, with the
    translator's attention pass). At most queue_size requests wait at once; each waits at most
    `timeout` seconds."""

    def __init__(self, translator, batch_size, wait, queue_size, timeout):
        self.translator, self.batch_size, self.wait = translator, batch_size, wait
        self.queue_size, self.timeout = queue_size, timeout
        # requests waiting or being translated; touched by the event loop's thread only
        self.pending = 0
        self.jobs = queue.Queue()
        self.thread = threading.Thread(target=self.work, name="translator", daemon=True)
        self.thread.start()

    async def translate(self, sources, attention, beam=None):
        """The translator's results of sources, through the worker's queue
        (429 when it is full, 504 past --timeout)."""
        if not sources:
            return []
        if self.pending >= self.queue_size:
            raise ApiError(429, "Too many requests: %d are waiting (--queue_size); try again "
                                "shortly" % self.pending)
        self.pending += 1
        try:
            future = asyncio.wrap_future(self.submit(sources, attention, beam))
            return await asyncio.wait_for(future, self.timeout)
        except asyncio.TimeoutError:
            raise ApiError(504, "the translation took longer than this server's --timeout of %g s: "
                                "send fewer sentences or try again later" % self.timeout) from None
        finally:
            self.pending -= 1

    def submit(self, sources, attention, beam=None):
        """Queues one request's model inputs; returns the concurrent future of their
        translator results."""
        job = Job(sources, attention, beam)
        self.jobs.put(job)
        return job.future

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
        """Runs the jobs in groups of the same attention pass and beam size."""
        kinds = dict.fromkeys((job.attention, job.beam) for job in jobs)
        for attention, beam in kinds:
            self.run_group([job for job in jobs if (job.attention, job.beam) == (attention, beam)],
                           attention, beam)

    def run_group(self, jobs, attention, beam):
        """Runs the jobs' sources at once (with the attention pass when attention, under their
        beam) and hands each job its results (or the error)."""
        try:
            wider = {} if beam is None else {"settings": dataclasses.replace(
                self.translator.settings, beam_size=beam), "n": beam}
            results = run_in_length_batches(functools.partial(self.translator.run,
                                                              with_attention=attention, **wider),
                                            [source for job in jobs for source in job.sources],
                                            self.translator.batch_size)
        except Exception as error:  # noqa: BLE001 (each request answers 500 with it)
            for job in jobs:
                job.future.set_exception(error)
            return
        start = 0
        for job in jobs:
            job.future.set_result(results[start:start + len(job.sources)])
            start += len(job.sources)
