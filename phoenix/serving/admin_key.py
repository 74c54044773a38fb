"""The admin key that guards Triton's model-repository, shared-memory, trace and logging APIs.

`serve` always restricts those APIs. The key comes from `$PHOENIX_ADMIN_KEY` when set;
otherwise `serve` generates one and keeps it in `<build dir>/admin-key` (default
`build/serve/admin-key`), a file only its owner may read (0600). A later start from the same
build directory reuses that file, so tools that read it keep working across restarts and
beside a second server; delete it to get a new key. `find_admin_key()` is how the project's own
tools (supervisor CLI, `clients/build_corpus.py --reload`, benchmarks) find the key: the
environment first, then the file.
"""

from __future__ import annotations

import os
import re
import secrets
import stat
from pathlib import Path

ADMIN_KEY_ENV = "PHOENIX_ADMIN_KEY"
ADMIN_KEY_FILE_ENV = "PHOENIX_ADMIN_KEY_FILE"
ADMIN_HEADER = "phoenix-admin-key"
# Triton prefixes the header names of restricted gRPC calls with this.
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"
REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_KEY_FILE = Path("build/serve/admin-key")
# Triton splits the restriction flag on ',', ':' and '=': keep the key to URL-safe characters.
_VALID_KEY = re.compile(r"^[A-Za-z0-9._~-]{16,}$")
KEY_RULE = "at least 16 characters from A-Z a-z 0-9 . _ ~ -"


class AdminKeyError(RuntimeError):
    """A key that Triton cannot take, or a key file that is not safe to use."""


def is_valid_key(key: str) -> bool:
    return bool(_VALID_KEY.match(key))


def admin_headers(key: str | None, protocol: str = "http") -> dict[str, str] | None:
    """The header (HTTP) or metadata (gRPC) that carries the key; None without a key."""
    if not key:
        return None
    name = ADMIN_HEADER if protocol == "http" else GRPC_HEADER_PREFIX + ADMIN_HEADER
    return {name: key}


def key_file_for(build_dir: Path) -> Path:
    return Path(build_dir) / "admin-key"


def _read_private_key(path: Path) -> str | None:
    """The key in `path` when the file is ours, private (no group/other bits) and valid."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
        raise AdminKeyError(f"{path} is not a regular file of this user: not using it as a key")
    if info.st_mode & 0o077:
        return None  # others may have read it: never reuse it
    key = path.read_text().strip()
    return key if is_valid_key(key) else None


def write_private_key(path: Path, key: str) -> None:
    """Write `key` to `path` with mode 0600, atomically (a reader never sees half a key)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)  # the umask cannot widen it, an old file's mode does not stay
        os.write(fd, (key + "\n").encode())
    finally:
        os.close(fd)
    os.replace(temporary, path)


def generated_key(path: Path) -> str:
    """The key kept in `path`, created (random, 0600) when there is no usable one."""
    key = _read_private_key(path)
    if key is None:
        key = secrets.token_urlsafe(32)
        write_private_key(path, key)
    return key


def server_admin_key(build_dir: Path, env_name: str = ADMIN_KEY_ENV) -> tuple[str, Path | None]:
    """The key a server starts with, and the file it is kept in (None when it came from
    the environment)."""
    key = os.environ.get(env_name)
    if key:
        if not is_valid_key(key):
            raise AdminKeyError(
                f"${env_name} must be {KEY_RULE} "
                "(e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))')"
            )
        return key, None
    path = key_file_for(build_dir)
    return generated_key(path), path


def find_admin_key(
    env_name: str = ADMIN_KEY_ENV, key_file: str | os.PathLike | None = None
) -> str | None:
    """The key for a client of a server started by `serve`: `$env_name`, else the key file
    (`key_file`, `$PHOENIX_ADMIN_KEY_FILE`, or build/serve/admin-key in the working directory
    or the repository); None when there is none."""
    key = os.environ.get(env_name)
    if key:
        return key
    candidates = [key_file or os.environ.get(ADMIN_KEY_FILE_ENV)]
    if not candidates[0]:
        candidates = [DEFAULT_KEY_FILE, REPO_ROOT / DEFAULT_KEY_FILE]
    for candidate in candidates:
        try:
            found = _read_private_key(Path(candidate))
        except AdminKeyError:
            continue
        if found:
            return found
    return None
