"""Writing files, and who may: a regular file atomically (written beside it, fsynced, renamed
into place), a device, FIFO or open file as it is (output_target); the checks, before any work,
that an output path can be written and is not an input; the staging dirs an output is built in
before it is renamed into place, and the removal of what a killed process left behind; exclusive
locks (one writer at a time) and whether their holder is alive.

Every text file the toolkit writes is UTF-8 with one line per sentence and '\\n' line endings."""
import contextlib
import errno
import fcntl
import glob
import json
import os
import re
import shutil
import socket
import stat
import tempfile
import time
import uuid
from pathlib import Path

from toolkit.base.errors import UserError, writing


def reaches_an_open_file(path):
    """Whether ``path`` is, or its symbolic links lead through, /proc/PID/fd/N (as /dev/stdout and
    /dev/fd/N do): a file this process already has open, which its opener owns."""
    path = os.path.abspath(path)
    for _ in range(40):  # the kernel's own limit on a chain of links
        if os.path.realpath(os.path.dirname(path)).startswith("/proc/"):
            return True
        if not os.path.islink(path):
            return False
        path = os.path.join(os.path.dirname(path), os.readlink(path))
    return False


def output_target(path):
    """How an output at ``path`` is written: (the path to write, whether atomically). Every output
    of the toolkit is written through this decision (atomic_file):
      - a regular file, or a new one: replaced atomically (see atomic_file);
      - a symbolic link: followed, its target replaced atomically and the link kept;
      - a device (/dev/null), a FIFO, a socket, /dev/stdout or /dev/fd/N (a shell's >(...)): written
        directly, never replaced, as the program that reads it expects."""
    try:
        mode = os.stat(path).st_mode  # of the link's target
    # a new file (or a dangling link's new target), or a path that the write will report
    except OSError:
        mode = stat.S_IFREG
    if any(test(mode) for test in STREAMS) or reaches_an_open_file(path):
        return str(path), False
    return os.path.realpath(path), True


#: The kinds of file that an output is written into as they are: devices, FIFOs and sockets.
STREAMS = (stat.S_ISCHR, stat.S_ISBLK, stat.S_ISFIFO, stat.S_ISSOCK)


@contextlib.contextmanager
def atomic_file(path, text=False):
    """Yields a file object (binary, or UTF-8 text with '\\n' line endings) to write the output
    ``path`` with, as output_target decides. A regular file is written on a temporary file beside
    it; when the block ends, the file is fsynced and renamed into place (with the old file's
    permissions), so that a reader (or a kill -9) sees the old file or the new one, never a torn
    one. On any error or interruption (Ctrl-C, SIGTERM: see errors.run_cli) the temporary file is
    removed and the old file (if any) is untouched. A device, FIFO or open file is opened and
    written as it is. A full disk is raised as a DiskFull naming ``path``, another OSError of the
    temporary file as one naming ``path``."""
    target, atomic = output_target(path)
    if not atomic:
        with writing(path), (open(target, "w", encoding="utf-8", newline="\n") if text
                             else open(target, "wb")) as handle:
            yield handle
        return
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(target.parent, f".{target.name}.", ".tmp")
    temp_path = target.with_name(f".{target.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    try:
        with writing(path, temporary=temp_path):
            with (open(temp_path, "x", encoding="utf-8", newline="\n") if text
                  else open(temp_path, "xb")) as handle:
                yield handle
                handle.flush()
                os.fsync(handle.fileno())
            with contextlib.suppress(FileNotFoundError):
                # the replaced file's permissions
                os.chmod(temp_path, stat.S_IMODE(os.stat(target).st_mode))
            os.replace(temp_path, target)
    finally:
        temp_path.unlink(missing_ok=True)


def atomic_write(path, data):
    """Write ``data`` (bytes, or str as UTF-8) to ``path`` at once (see atomic_file)."""
    with atomic_file(path) as handle:
        handle.write(data.encode("utf-8") if isinstance(data, str) else data)


def write_lines(path, lines):
    """Atomically write ``lines`` as UTF-8 text, each followed by '\\n'."""
    atomic_write(path, "".join(line + "\n" for line in lines))


@contextlib.contextmanager
def line_writer(path):
    """Write a new UTF-8 text file line by line: yields write(line), which appends line + '\\n'. The
    file is flushed to disk when the block ends (a build writes such files into a staging directory:
    databuild.py)."""
    with open(path, "w", encoding="utf-8", newline="\n") as handle:
        yield lambda line: handle.write(line + "\n")
        handle.flush()
        os.fsync(handle.fileno())



def write_json(path, value):
    """Atomically write ``value`` as indented JSON."""
    atomic_write(path, json.dumps(value, indent=2, ensure_ascii=False) + "\n")


def nearest_existing(path):
    """``path`` itself or the nearest directory above it that exists."""
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_writable_dir(path, flag):
    """Raises UserError unless ``path`` (given as --flag) is, or can be created as, a directory that
    this process can write files in; creates nothing. Tools call it before any work, so that a bad
    path never costs a run."""
    if not str(path):  # "" would be the working directory to some calls, no path to others
        raise UserError(f"--{flag} is empty: pass a directory")
    existing = nearest_existing(path)
    if not existing.is_dir():
        where = (f"{path} is" if existing == Path(os.path.abspath(path))
                 else f"{existing}, above {path}, is")
        raise UserError(f"--{flag} {path}: {where} a file, not a directory; pass a directory")
    _probe(existing, flag, path)


def check_writable_file(path, flag):
    """Raises UserError unless ``path`` (given as --flag) names a file, not a directory, in an
    existing directory that this process can write files in (a symbolic link: its target), or a
    device, FIFO or open file it may write (see output_target); creates nothing."""
    target, atomic = output_target(path)
    if not atomic:
        if not os.access(target, os.W_OK):
            raise UserError(f"--{flag} {path}: this process may not write to it (permission "
                            f"denied); pass a path "
                            "it may write")
        return
    path = Path(target)
    if path.is_dir():
        raise UserError(f"--{flag} {path} is a directory: name a file")
    if not path.parent.is_dir():
        what = "is a file" if path.parent.exists() else "does not exist"
        raise UserError(f"--{flag} {path}: its directory {path.parent} {what}; create the "
                        f"directory or name a "
                        "file in one that exists")
    _probe(path.parent, flag, path)


def check_not_an_input(output, flag, inputs, dirs=None, said=None):
    """Raises UserError if the output ``output`` (given as --flag; ``said``: how to name it, if not
    so) is one of ``inputs`` ({flag: path or list of paths}) or an existing file of one of ``dirs``
    ({what: path}: a logdir or data dir the tool reads), whatever its spelling (relative, a symbolic
    link, a hard link): a tool never replaces what it reads, only what it writes."""
    said = said or "--%s %s" % (flag, output)
    for input_flag, paths in inputs.items():
        for path in [paths] if isinstance(paths, (str, os.PathLike)) else paths:
            if path and same_file(output, path):
                raise UserError(f"{said} is the file given as --{input_flag} {path}: it would be "
                                f"replaced by the output; pass another --{flag}")
    for what, directory in (dirs or {}).items():
        held = directory and file_of_dir(output, directory)
        if held:
            raise UserError(f"{said} is {held}, a file of the {what} {directory}: it would be "
                            f"replaced by the output; pass another --{flag}")


def check_output_dir(directory, flag, inputs, dirs, written):
    """Raises UserError if the output directory ``directory`` (given as --flag) is one of ``dirs``
    ({what: path}: a logdir or data dir the tool reads), whatever its spelling, or if a file in it
    with a name the tool writes (``written``: a test of a name) is one of ``inputs`` or a file of
    ``dirs`` (check_not_an_input): a tool's outputs never go among, or over, what it reads."""
    for what, read in dirs.items():
        if read and same_file(directory, read):
            raise UserError(f"--{flag} {directory} is the {what} {read}: the outputs would go "
                            f"among the files it reads; pass another --{flag}")
    try:
        entries = [entry for entry in os.scandir(directory) if written(entry.name)]
    except OSError:  # a new directory, or one check_writable_dir reports
        entries = []
    for entry in entries:
        check_not_an_input(entry.path, flag, inputs, dirs,
                           said=f"--{flag} {directory}: its {entry.name}")


#: What a name that becomes part of a path (a language code, a checkpoint's name) may hold: no
#: separator, no '..', nothing a shell or a line of text would mangle.
PATH_NAME = re.compile(r"[A-Za-z0-9_-]+")
#: The longest such name: what is added to it (a step, a checkpoint's suffixes, the temporary
#: names TensorFlow writes first) must still fit in a file name's 255 bytes.
PATH_NAME_MAX = 128


def check_path_name(value, flag, what):
    """Raises UserError unless ``value`` (given as --flag; ``what``: what it names,
    e.g. "a language code") is a name that can be part of a path as it is: ASCII letters, digits,
    '-' and '_' only, so that it never leads out of the directory it is meant for, and at most
    PATH_NAME_MAX of them."""
    if not PATH_NAME.fullmatch(value):
        raise UserError(f"--{flag} {ascii(value)}: {what} may hold only ASCII letters, digits, '-' "
                        f"and '_' (it becomes part of a path); pass another --{flag}")
    if len(value) > PATH_NAME_MAX:
        raise UserError(f"--{flag} {value[:20]}... ({len(value)} characters): {what} may be at "
                        f"most {PATH_NAME_MAX} characters long (it becomes part of a file name); "
                        f"pass another --{flag}")


def publish(staged, target, flag):
    """Moves ``staged``, an output (a file or a directory) finished in a staging dir beside
    ``target`` (given as --flag; a symbolic link: its target), into place, if ``target`` is still
    new (a directory: new or empty). The check and the move are one step of the kernel (a hard link,
    or a rename that refuses a directory that is not empty), so that a file that appeared at
    ``target`` while the output was made is refused, never replaced. Every export publishes so."""
    destination = os.path.realpath(target)
    try:
        if os.path.isdir(staged):
            os.rename(staged, destination)  # replaces only an empty directory
            return
        try:
            os.link(staged, destination)  # never replaces anything
        except OSError as error:  # a file system without hard links: checked, then renamed
            if error.errno in (errno.EEXIST, errno.ENOTDIR, errno.EISDIR) or os.path.lexists(
                    destination):
                raise
            os.rename(staged, destination)
            return
        os.unlink(staged)
    except OSError as error:
        if error.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR):
            raise
        raise UserError(f"--{flag} {target} already exists (it appeared while the export ran, and "
                        f"is left as it was): remove it or choose another") from None


def check_not_owned(directory, flag, owners):
    """Raises UserError if the output directory ``directory`` (given as --flag) is one that another
    tool writes, as the file that marks it shows ({file name: what such a directory is}), whatever
    the path's spelling: a prepro.py data dir and a train.py logdir never share a directory."""
    for name, what in owners.items():
        if os.path.isfile(os.path.join(directory, name)):
            raise UserError(f"--{flag} {directory} is {what} (it holds {name}): pass another "
                            f"--{flag}")


def file_of_dir(path, directory):
    """The name of the file of ``directory`` (directly in it) that ``path`` names, through links
    and hard links; None if it names none (or does not exist)."""
    if not os.path.isfile(path):
        return None
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return None
    return next((entry.name for entry in entries if same_file(path, entry.path)), None)


def same_file(first, second):
    """Whether two paths name one existing file (through links, hard links and other names)."""
    try:
        return os.path.samefile(first, second)
    except OSError:
        return False


def _probe(directory, flag, path):
    """Creates and removes a temporary file in ``directory``: the one test of writability that holds
    for root, a read-only mount and full quotas alike."""
    try:
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as error:
        raise UserError(f"--{flag} {path}: cannot write in {directory} ({error.strerror}); pass a "
                        "path where files can be written") from None


def remove_stale(directory, prefix, suffix=""):
    """Removes what a process killed before its cleanup left in ``directory``: the files and
    directories named PREFIX<PID>...SUFFIX (staging_dir's, atomic_file's, a checkpoint reader's
    pins) whose process PID is gone."""
    for path in glob.glob(os.path.join(glob.escape(str(directory)), glob.escape(prefix) + "*"
                                       + suffix)):
        pid = re.match(r"\d+", os.path.basename(path)[len(prefix):])
        if pid and not process_alive(int(pid.group())):
            shutil.rmtree(path, ignore_errors=True) if os.path.isdir(path) else os.remove(path)


@contextlib.contextmanager
def staging_dir(parent, prefix):
    """A new empty directory PARENT/PREFIX<PID>-XXXX to build an output in before it is renamed into
    place (a data dir's build, an export), removed with whatever is left in it when the block ends;
    those of killed runs (remove_stale) are removed first."""
    remove_stale(parent, prefix)
    path = Path(tempfile.mkdtemp(dir=parent, prefix="%s%d-" % (prefix, os.getpid())))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def process_alive(pid):
    """Whether a process of this machine has the id pid (one of another user counts)."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def exclusive_lock(path, holder, busy):
    """Holds an exclusive lock (fcntl.flock) on ``path`` while the block runs, so that two processes
    never write one directory: path is a lock file (created if missing) into which ``holder``, a
    description of this process, is written for others to read, or a directory itself (nothing is
    written). When another process holds it, raises UserError(busy(its description or
    "another process")) at once. The kernel releases the lock when the process ends however it
    ends (SIGKILL too), so nothing left behind ever blocks a later run."""
    directory = os.path.isdir(path)
    with writing(path):
        fd = os.open(path, os.O_RDONLY if directory else os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            other = "" if directory else os.pread(fd, 1000, 0).decode("utf-8", "replace").strip()
            raise UserError(busy(other or "another process")) from None
        if not directory:
            with writing(path):
                os.ftruncate(fd, 0)
                os.pwrite(fd, holder.encode("utf-8") + b"\n", 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def process_description(tool):
    """"TOOL process PID on HOST since TIME", for a lock's holder."""
    return "%s process %d on %s since %s" % (tool, os.getpid(), socket.gethostname(),
                                             time.strftime("%Y-%m-%d %H:%M:%S"))
