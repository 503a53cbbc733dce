"""The project a file lives in, for validating its patch where it really runs.

A caller of the HTTP service sends the project with the file (`ProjectFiles`: a map of relative paths to texts, or
a base64 tar/zip archive); a caller of the MCP server, which runs on the user's machine, names its folder. Both
become a `ProjectSource`, which writes a bounded copy of the project into a scratch folder: validation runs the
changed file there, from the working folder the user would type its command in. Light: no torch, no libcst.
"""

from __future__ import annotations

import base64
import binascii
import io
import os
import stat
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from pydantic import BaseModel, ConfigDict, Field

from xlaport.files import NotInside, read_bytes_inside

from .inputs import check_file_name

MAX_PROJECT_FILES = 5_000  # files of a project copied or unpacked for a validation
MAX_PROJECT_BYTES = 200 * 1024 * 1024  # their total size, unpacked
SKIPPED_FOLDERS = frozenset({".git", ".hg", ".svn", ".venv", "venv", "__pycache__", "node_modules", ".tox"})


class ProjectTooLarge(ValueError):
    """The project is over a bound (files, bytes): HTTP 413, MCP `project_too_large`."""


class ProjectError(ValueError):
    """The project cannot be used as sent (bad path, bad archive): HTTP 422, MCP `bad_project`."""


class ProjectFiles(BaseModel):
    """The project the file belongs to, sent over HTTP: `files` or `archive`, not both."""

    model_config = ConfigDict(strict=True)

    files: dict[str, str] | None = Field(
        None,
        description="Relative path -> text of each file the program needs (its sibling modules, configs, small "
        f"data files). At most {MAX_PROJECT_FILES:,} files and {MAX_PROJECT_BYTES // 2**20} MiB in all.",
    )
    archive: str | None = Field(
        None,
        description="Base64 of a .tar, .tar.gz, .tar.bz2, .tar.xz or .zip of the project (the format is detected). "
        "Regular files and folders only; the same bounds as `files`, unpacked.",
    )


@dataclass(frozen=True)
class ProjectSource:
    """Where a project's files come from: a folder on this machine, or what a client sent."""

    folder: Path | None = None  # a local project (MCP): copied, bounded, skipping .git, venvs and caches
    files: dict[str, bytes] | None = None  # a sent project, already checked

    def write_to(self, destination: Path) -> int:
        """Writes the project's files under `destination` (created); the number of files."""
        destination.mkdir(parents=True, exist_ok=True)
        if self.folder is not None:
            return _copy_folder(self.folder, destination)
        for rel, data in (self.files or {}).items():
            target = destination / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        return len(self.files or {})

    def describe(self) -> str:
        return f"the folder {self.folder}" if self.folder is not None else f"the {len(self.files or {})} file(s) sent"


def local_project(folder: Path) -> ProjectSource:
    """A project folder on this machine; ProjectError when it is not a folder."""
    if not folder.is_dir():
        raise ProjectError(f"not a folder: {folder}")
    return ProjectSource(folder=folder)


def sent_project(project: ProjectFiles) -> ProjectSource:
    """The project a client sent, checked (paths, bounds) before anything is written."""
    if (project.files is None) == (project.archive is None):
        raise ProjectError("send the project as `files` (a map of relative paths to texts) or as `archive`, not both")
    if project.files is not None:
        if len(project.files) > MAX_PROJECT_FILES:
            raise ProjectTooLarge(f"the project has {len(project.files):,} files; at most {MAX_PROJECT_FILES:,}")
        files = {project_path(path): text.encode("utf-8", "surrogatepass") for path, text in project.files.items()}
    else:
        files = _unpack(project.archive or "")
    total = sum(len(data) for data in files.values())
    if total > MAX_PROJECT_BYTES:
        raise ProjectTooLarge(f"the project holds {total:,} bytes; at most {MAX_PROJECT_BYTES:,}")
    folders = {str(PurePosixPath(p).parent) for p in files} - {"."}
    clashes = sorted(p for p in files if p in folders)
    if clashes:
        raise ProjectError(f"{clashes[0]!r} is sent both as a file and as a folder")
    return ProjectSource(files=files)


def project_path(path: str) -> str:
    """A sent path as a clean relative POSIX path; ProjectError for an absolute one, `..`, or an empty one."""
    check_file_name(path)
    pure = PurePosixPath(path.replace("\\", "/"))
    if pure.is_absolute() or ".." in pure.parts or not pure.parts or pure.parts == (".",):
        raise ProjectError(f"project paths must be relative and stay inside the project: {path!r}")
    return str(pure)


def _unpack(encoded: str) -> dict[str, bytes]:
    try:
        data = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise ProjectError("`archive` is not valid base64") from None
    if zipfile.is_zipfile(io.BytesIO(data)):
        return _unpack_zip(data)
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as archive:
            return _unpack_tar(archive)
    except tarfile.TarError:
        raise ProjectError("`archive` is neither a zip nor a (compressed) tar archive") from None


def _unpack_zip(data: bytes) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    total = 0
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        entries = [e for e in archive.infolist() if not e.is_dir()]
        if len(entries) > MAX_PROJECT_FILES:
            raise ProjectTooLarge(f"the archive has {len(entries):,} files; at most {MAX_PROJECT_FILES:,}")
        for entry in entries:
            if stat.S_ISLNK(entry.external_attr >> 16):
                raise ProjectError(f"the archive holds a link, {entry.filename!r}: send regular files only")
            total += entry.file_size  # declared sizes first: a zip bomb is refused before it is inflated
            if total > MAX_PROJECT_BYTES:
                raise ProjectTooLarge(f"the archive unpacks to more than {MAX_PROJECT_BYTES:,} bytes")
        for entry in entries:
            with archive.open(entry) as member:
                content = member.read(entry.file_size + 1)
            if len(content) != entry.file_size:
                raise ProjectError(f"the archive's entry {entry.filename!r} is not the size it declares")
            files[project_path(entry.filename)] = content
    return files


def _unpack_tar(archive: tarfile.TarFile) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    total = 0
    for member in archive:  # one pass: a compressed tar is read as a stream
        if member.isdir():
            continue
        if not member.isfile():
            raise ProjectError(f"the archive holds {member.name!r}, which is not a regular file: send files only")
        if len(files) >= MAX_PROJECT_FILES:
            raise ProjectTooLarge(f"the archive has more than {MAX_PROJECT_FILES:,} files")
        total += member.size
        if total > MAX_PROJECT_BYTES:
            raise ProjectTooLarge(f"the archive unpacks to more than {MAX_PROJECT_BYTES:,} bytes")
        extracted = archive.extractfile(member)
        files[project_path(member.name)] = extracted.read() if extracted else b""
    return files


def _copy_folder(source: Path, destination: Path) -> int:
    """Copies a local project (regular files; links are copied as links, so data folders linked in stay linked),
    within the bounds: ProjectTooLarge beyond them, naming what to do."""
    count, total = 0, 0
    for folder, subfolders, names in os.walk(source):
        subfolders[:] = sorted(d for d in subfolders if d not in SKIPPED_FOLDERS and not d.endswith(".egg-info"))
        here = Path(folder)
        target = destination / here.relative_to(source)
        target.mkdir(exist_ok=True)
        for name in subfolders:
            if (here / name).is_symlink():
                os.symlink(os.readlink(here / name), target / name)
        subfolders[:] = [d for d in subfolders if not (here / d).is_symlink()]
        for name in sorted(names):
            path = here / name
            count += 1
            if count > MAX_PROJECT_FILES:
                raise ProjectTooLarge(
                    f"{source} has more than {MAX_PROJECT_FILES:,} files: give the folder of the program "
                    "(`project_root`), not one above it"
                )
            if path.is_symlink():
                os.symlink(os.readlink(path), target / name)
                continue
            total += path.stat().st_size
            if total > MAX_PROJECT_BYTES:
                raise ProjectTooLarge(
                    f"{source} holds more than {MAX_PROJECT_BYTES:,} bytes: give the folder of the program "
                    "(`project_root`), not one above it, and keep large data outside it"
                )
            try:  # the file itself, as checked: one swapped for a link meanwhile is not followed out of source
                (target / name).write_bytes(read_bytes_inside(path, source))
            except NotInside as exc:
                raise ProjectError(f"{exc} (changed while the project was copied?)") from None
    return count


def write_in_copy(root: Path, rel_path: str, text: str) -> Path:
    """Writes `text` at `rel_path` in `root`, a project's copy: ProjectError for a path that would leave it (absolute,
    `..`, or through a link the project holds, which the copy keeps as a link). The file written."""
    parts = PurePosixPath(project_path(rel_path)).parts
    folder = root
    for part in parts[:-1]:
        folder = folder / part
        if folder.is_symlink():
            raise ProjectError(f"{rel_path!r} goes through a link of the project ({part}): give the file's own path")
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / parts[-1]
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        raise ProjectError(f"{rel_path!r} cannot be written in the project's copy: {exc.strerror}") from None
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    return target
