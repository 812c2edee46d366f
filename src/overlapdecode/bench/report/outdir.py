"""The output directory of `overlapdecode bench` and `profile` (`--out`): which directories they may write into,
and how every file gets there, so that nothing a user owns is ever replaced.

A directory is a command's own when it holds MANIFEST, `overlapdecode-files.json`, which names the command that
wrote it and every file that command made there; the manifest is written before any of them. `--out` is taken
when it is new, empty, or a directory of the same command whose every file the manifest lists; anything else (a
model directory, a directory with a file of the user's, a file) is refused before any work. A bench directory
with no manifest that holds results.json alone is taken with `--append` (a results file copied or made by hand).

Every file is written under a temporary name in the same directory (TMP_PREFIX, so that it is known as ours),
then renamed into place: a crash never leaves one cut short. An existing file is replaced only when the manifest
lists it; in a directory without a manifest (a bench directory made before the manifest, or a results.json
assembled by hand, which `overlapdecode report` rebuilds) a markdown file is replaced only when its first line
is the title the command gives it. The streams written while a run goes (a worker's log and rows) are new files
of a directory already checked; they are listed before they start.

A leaf of the bench: it imports nothing of the package.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading

MANIFEST = "overlapdecode-files.json"
TMP_PREFIX = ".overlapdecode-tmp-"
# the first line of the markdown files the commands write (report.py, profile.py)
TITLES = {"report.md": "# overlapdecode benchmark report", "summary.md": "# Profile: "}

_lock = threading.Lock()  # the runner's units list and unlist their files from threads


class OutDirError(ValueError):
    """A directory (or a file in it) the command may not write: one line, naming the flag or the file."""


def read_manifest(out_dir: str) -> dict | None:
    """The manifest of `out_dir`, or None where there is none (or it is not one of ours)."""
    try:
        with open(os.path.join(out_dir, MANIFEST)) as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        return None
    if (
        not isinstance(manifest, dict)
        or not isinstance(manifest.get("written_by"), str)
        or not isinstance(manifest.get("files"), list)
        or not all(isinstance(n, str) for n in manifest["files"])
    ):
        return None
    return manifest


def _listing(out_dir: str) -> list[str]:
    """The entries of `out_dir` other than the manifest and our own temporary files (a run killed mid-write)."""
    return sorted(n for n in os.listdir(out_dir) if n != MANIFEST and not n.startswith(TMP_PREFIX))


def _shown(names: list[str], most: int = 4) -> str:
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def check(out_dir: str, command: str, append: bool = False, flag: str = "--out") -> None:
    """`out_dir` may take a run of `overlapdecode COMMAND` (bench or profile), or an OutDirError naming `flag`.
    Touches nothing but a probe file (a check of permission bits alone, which root ignores, is not enough)."""
    made_by = f"overlapdecode {command}"
    if os.path.lexists(out_dir) and not os.path.isdir(out_dir):
        raise OutDirError(f"{flag} {out_dir}: is a file, not a directory")
    if not os.path.exists(out_dir):
        if append:
            raise OutDirError(f"--append: {os.path.join(out_dir, 'results.json')} not found (nothing to add to)")
        return
    try:
        names = _listing(out_dir)
    except OSError as err:
        raise OutDirError(f"{flag} {out_dir}: cannot be read ({err.strerror or err})") from None
    if command == "bench" and any(n.startswith("rows") and n.endswith(".jsonl") for n in names):
        raise OutDirError(
            f"{flag} {out_dir} holds the rows of an interrupted run: keep them with `overlapdecode "
            f"report {out_dir} --interrupted 'THE BENCH COMMAND'`, or choose another {flag}"
        )
    manifest = read_manifest(out_dir)
    if manifest is not None and manifest["written_by"] != made_by:
        raise OutDirError(
            f"{flag} {out_dir}: was written by {manifest['written_by']}, not {made_by}; give a new or empty directory"
        )
    if manifest is not None:
        unlisted = [n for n in names if n not in manifest["files"]]
    elif command == "bench" and names == ["results.json"]:
        unlisted = []  # a results file alone, copied or made by hand: --append adds to it (below)
    else:
        unlisted = names
    if unlisted:
        raise OutDirError(
            f"{flag} {out_dir}: holds files {made_by} did not write ({_shown(unlisted)}); give a new or empty "
            f"directory, or one an earlier {made_by} wrote (its {MANIFEST} lists its files)"
        )
    results = os.path.join(out_dir, "results.json")
    if command == "bench" and append and not os.path.exists(results):
        raise OutDirError(f"--append: {results} not found (nothing to add to)")
    if command == "bench" and not append and os.path.exists(results):
        raise OutDirError(
            f"{flag} {out_dir} already holds results.json: add to it with --append, or choose another "
            f"{flag} (an earlier run's results are never overwritten)"
        )
    if command == "profile" and os.path.exists(os.path.join(out_dir, "summary.json")):
        raise OutDirError(
            f"{flag} {out_dir} already holds a profile (summary.json): choose another {flag} (an earlier "
            f"profile's traces and summary are never overwritten)"
        )
    try:
        with tempfile.TemporaryFile(dir=out_dir, prefix=TMP_PREFIX):
            pass
    except OSError as err:
        raise OutDirError(f"{flag} {out_dir}: not a writable directory ({err.strerror or err})") from None


def prepare(out_dir: str, command: str, append: bool = False, flag: str = "--out", files=()) -> None:
    """check(), then make `out_dir` and its manifest, listing `files` (and the results.json an --append run
    adds to) before any of them is written."""
    check(out_dir, command, append, flag)
    try:
        os.makedirs(out_dir, exist_ok=True)
        with tempfile.TemporaryFile(dir=out_dir, prefix=TMP_PREFIX):
            pass
    except OSError as err:
        raise OutDirError(f"{flag} {out_dir}: not a writable directory ({err.strerror or err})") from None
    own = ["results.json"] if append and os.path.exists(os.path.join(out_dir, "results.json")) else []
    claim(out_dir, command, own + list(files), create=True)


def claim(out_dir: str, command: str, names, create: bool = False) -> None:
    """List `names` in the manifest of `out_dir` (made if `create`; else only where there is one)."""
    with _lock:
        manifest = read_manifest(out_dir)
        if manifest is None:
            if not create:
                return
            manifest = dict(written_by=f"overlapdecode {command}", files=[])
        new = [n for n in names if n not in manifest["files"]]
        if not new and os.path.exists(os.path.join(out_dir, MANIFEST)):
            return
        manifest["files"] = sorted(set(manifest["files"]) | set(new))
        replace(out_dir, MANIFEST, lambda tmp: _dump(tmp, manifest))


def _dump(path: str, obj) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")


def _replaceable(out_dir: str, name: str, manifest: dict | None) -> bool:
    """Whether an existing `out_dir/name` is ours to replace (see the module docstring)."""
    if manifest is not None:
        return name in manifest["files"]
    if not name.endswith(".md"):
        return True
    try:
        with open(os.path.join(out_dir, name), errors="replace") as f:
            return name in TITLES and f.readline().startswith(TITLES[name])
    except OSError:
        return False


def replace(out_dir: str, name: str, write):
    """`write(tmp)` to a temporary name beside `out_dir/name`, then renamed onto it; returns what write returned."""
    tmp = os.path.join(out_dir, f"{TMP_PREFIX}{os.getpid()}-{threading.get_ident()}-{name}")  # keeps the suffix
    try:
        result = write(tmp)
        os.replace(tmp, os.path.join(out_dir, name))
    finally:
        if os.path.lexists(tmp):
            os.remove(tmp)
    return result


def may_write(out_dir: str, name: str, command: str) -> None:
    """An OutDirError naming `out_dir/name` if it exists and is not ours to replace (see the module docstring)."""
    path = os.path.join(out_dir, name)
    if os.path.lexists(path) and not _replaceable(out_dir, name, read_manifest(out_dir)):
        raise OutDirError(
            f"{path}: not written by overlapdecode {command}, so it is left as it is; move it away to write "
            f"the {command} files here"
        )


def write_file(out_dir: str, name: str, write, command: str):
    """Write `out_dir/name` by `write(path)` (any writer that takes a path: json, savefig, a trace export) to a
    temporary name, then rename it into place; listed in the manifest first where there is one. An existing file
    that is not ours is refused with an OutDirError naming it. Returns what `write` returned."""
    may_write(out_dir, name, command)
    claim(out_dir, command, [name])
    return replace(out_dir, name, write)


def write_text(out_dir: str, name: str, text: str, command: str) -> str:
    """write_file for text; returns the file's path."""

    def put(tmp):
        with open(tmp, "w") as f:
            f.write(text)

    write_file(out_dir, name, put, command)
    return os.path.join(out_dir, name)


def write_json(out_dir: str, name: str, obj, command: str) -> str:
    """write_file for a JSON object (indented); returns the file's path."""
    write_file(out_dir, name, lambda tmp: _dump(tmp, obj), command)
    return os.path.join(out_dir, name)


def remove(out_dir: str, name: str) -> None:
    """Remove a file of ours from `out_dir` and from its manifest."""
    os.remove(os.path.join(out_dir, name))
    with _lock:
        manifest = read_manifest(out_dir)
        if manifest is not None and name in manifest["files"]:
            manifest["files"] = [n for n in manifest["files"] if n != name]
            replace(out_dir, MANIFEST, lambda tmp: _dump(tmp, manifest))
