"""The admin key that guards Triton's model-repository, shared-memory, trace and logging APIs
(SECURITY.md): `$PHOENIX_ADMIN_KEY`, else one `serve` keeps in `<build dir>/admin-key`."""

from __future__ import annotations

import os
import re
import secrets
import stat
from pathlib import Path

ADMIN_KEY_ENV = "PHOENIX_ADMIN_KEY"
ADMIN_KEY_FILE_ENV = "PHOENIX_ADMIN_KEY_FILE"
ADMIN_HEADER = "phoenix-admin-key"
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"  # Triton's prefix for restricted gRPC calls' headers
DEFAULT_KEY_FILE = Path("build/serve/admin-key")
REPO_ROOT = Path(__file__).resolve().parents[2]
# Triton splits the restriction flag on ',', ':' and '=': keep the key to URL-safe characters.
_VALID_KEY = re.compile(r"^[A-Za-z0-9._~-]{16,}$")


class AdminKeyError(RuntimeError):
    """A key that Triton cannot take, or a key file that is not safe to use."""


def is_valid_key(key: str) -> bool:
    return bool(_VALID_KEY.match(key))


def admin_headers(key: str | None, protocol: str = "http") -> dict[str, str] | None:
    """The header (HTTP) or metadata (gRPC) that carries the key; None without a key."""
    if not key:
        return None
    return {(ADMIN_HEADER if protocol == "http" else GRPC_HEADER_PREFIX + ADMIN_HEADER): key}


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


def server_admin_key(build_dir: Path, env_name: str = ADMIN_KEY_ENV) -> tuple[str, Path | None]:
    """(key, its file): `$env_name` (no file), else BUILD_DIR/admin-key, created when unusable."""
    if key := os.environ.get(env_name):
        if not is_valid_key(key):
            raise AdminKeyError(
                f"${env_name} must be at least 16 characters from A-Z a-z 0-9 . _ ~ - "
                "(e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))')"
            )
        return key, None
    path = Path(build_dir) / "admin-key"
    key = _read_private_key(path)
    if key is None:  # written with mode 0600 whatever the umask, atomically (never half a key)
        key = secrets.token_urlsafe(32)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            os.fchmod(fd, 0o600)  # an old file's wider mode does not stay either
            os.write(fd, (key + "\n").encode())
        finally:
            os.close(fd)
        os.replace(partial, path)
    return key, path


def find_admin_key(
    env_name: str = ADMIN_KEY_ENV, key_file: str | os.PathLike | None = None
) -> str | None:
    """The key of a server `serve` started: `$env_name`, else the file `key_file`,
    `$PHOENIX_ADMIN_KEY_FILE`, or build/serve/admin-key here or in the repository; or None."""
    if os.environ.get(env_name):
        return os.environ[env_name]
    chosen = key_file or os.environ.get(ADMIN_KEY_FILE_ENV)
    for candidate in [chosen] if chosen else [DEFAULT_KEY_FILE, REPO_ROOT / DEFAULT_KEY_FILE]:
        try:
            found = _read_private_key(Path(candidate))
        except AdminKeyError:
            continue
        if found:
            return found
    return None
