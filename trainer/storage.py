"""Where ``--data`` and ``--model-dir`` point: a local path, ``s3://`` (boto3) or
``gs://`` (``tf.io.gfile``).

Remote inputs are downloaded to a local cache before training; a remote model
dir gets the chief's export, written locally first and then uploaded. The
routing and naming are pure; only the ``fetch_*``/``upload_*``/``check_*``
functions touch the network. S3 clients come from ``boto3.session.Session()``
(the standard credential chain) and aim at ``KILN_AWS_ENDPOINT_URL`` when it is
set, like kiln's AWS cluster code. Every failure is a :class:`TrainerError`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from trainer.errors import TrainerError

ENDPOINT_ENV = "KILN_AWS_ENDPOINT_URL"
REMOTE_SCHEMES = ("s3", "gs")
# Uploaded last, so whoever sees it sees a whole SavedModel.
LAST_UPLOADED = "saved_model.pb"


@dataclass(frozen=True)
class Location:
    """``scheme`` is ``s3``, ``gs`` or ``""`` (local; ``key`` is then the path)."""

    scheme: str
    bucket: str
    key: str

    @property
    def remote(self) -> bool:
        return bool(self.scheme)

    def __str__(self) -> str:
        return f"{self.scheme}://{self.bucket}/{self.key}" if self.remote else self.key


def is_remote(text: str) -> bool:
    """Whether ``text`` names an ``s3://`` or ``gs://`` location."""
    return any(text.startswith(f"{scheme}://") for scheme in REMOTE_SCHEMES)


def parse_location(text: str) -> Location:
    """Split ``s3://bucket/key`` / ``gs://bucket/key`` into parts; anything else
    is a local path. Raise TrainerError on a remote name without a bucket or
    with ``.``/``..`` in its key (it would escape the cache)."""
    for scheme in REMOTE_SCHEMES:
        prefix = f"{scheme}://"
        if text.startswith(prefix):
            bucket, _, key = text[len(prefix):].partition("/")
            if not bucket:
                raise TrainerError(f"{text}: no bucket name")
            key = key.strip("/")
            if any(part in (".", "..") for part in key.split("/")):
                raise TrainerError(f"{text}: '.' and '..' are not allowed in the object key")
            return Location(scheme, bucket, key)
    return Location("", "", text)


def default_cache_dir(env: Mapping[str, str]) -> Path:
    """``$XDG_CACHE_HOME/kiln/data``, else ``~/.cache/kiln/data``."""
    base = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base / "kiln" / "data"


def default_state_dir(env: Mapping[str, str]) -> Path:
    """``$XDG_STATE_HOME/kiln/trainer``, else ``~/.local/state/kiln/trainer``."""
    base = Path(env["XDG_STATE_HOME"]) if env.get("XDG_STATE_HOME") else Path.home() / ".local" / "state"
    return base / "kiln" / "trainer"


def cache_path(cache_dir: Path, location: Location) -> Path:
    """Where a remote object is cached: ``<cache-dir>/<scheme>/<bucket>/<key>``."""
    return cache_dir.joinpath(location.scheme, location.bucket, *PurePosixPath(location.key).parts)


def upload_keys(files: list[str], prefix: str) -> list[tuple[str, str]]:
    """``(relative file, object key)`` pairs for uploading a directory under
    ``prefix``, ``saved_model.pb`` last."""
    ordered = sorted(files, key=lambda name: (name == LAST_UPLOADED, name))
    return [(name, f"{prefix}/{name}" if prefix else name) for name in ordered]


# --- S3 (boto3) -----------------------------------------------------------------


def s3_client() -> Any:
    import boto3
    import botocore.config

    retries = {"max_attempts": 3, "mode": "standard"}
    config = botocore.config.Config(connect_timeout=10, read_timeout=60, retries=retries)
    return boto3.session.Session().client("s3", endpoint_url=os.environ.get(ENDPOINT_ENV) or None, config=config)


def _s3_failure(flag: str, location: Location, exc: Exception, *, what: str) -> TrainerError:
    import botocore.exceptions as errors

    if isinstance(exc, errors.NoCredentialsError | errors.PartialCredentialsError):
        return TrainerError(
            f"{flag} {location}: no AWS credentials (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
            "AWS_PROFILE, or an instance role)"
        )
    if isinstance(exc, errors.ClientError):
        code = str(exc.response.get("Error", {}).get("Code", ""))
        if code in ("404", "NoSuchBucket", "NoSuchKey", "NotFound"):
            return TrainerError(f"{flag} {location}: {what} does not exist")
        if code in ("403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
            return TrainerError(f"{flag} {location}: access denied ({code})")
        return TrainerError(f"{flag} {location}: S3 answered {code or exc}")
    if isinstance(exc, errors.BotoCoreError):
        return TrainerError(f"{flag} {location}: {exc}")
    raise exc


def _head_bucket(client: Any, flag: str, location: Location) -> None:
    import botocore.exceptions

    try:
        client.head_bucket(Bucket=location.bucket)
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
        raise _s3_failure(flag, location, exc, what=f"bucket {location.bucket!r}") from None


def check_s3_destination(flag: str, location: Location) -> None:
    """Fail unless the bucket exists and our credentials can see it. Writes nothing."""
    _head_bucket(s3_client(), flag, location)


def fetch_s3(flag: str, location: Location, dest: Path) -> Path:
    """Download ``location`` to ``dest`` (atomically: a partial file then a
    rename); keep a cached copy whose ETag still matches."""
    import botocore.exceptions

    client = s3_client()
    _head_bucket(client, flag, location)
    try:
        head = client.head_object(Bucket=location.bucket, Key=location.key)
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
        raise _s3_failure(flag, location, exc, what="the object") from None
    etag = str(head.get("ETag", ""))
    stamp = dest.with_name(f"{dest.name}.etag")
    if dest.is_file() and stamp.is_file() and etag and stamp.read_text() == etag:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(f".{dest.name}.{os.getpid()}.partial")
    try:
        client.download_file(location.bucket, location.key, str(partial))
        os.replace(partial, dest)
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
        raise _s3_failure(flag, location, exc, what="the object") from None
    finally:
        partial.unlink(missing_ok=True)
    stamp.write_text(etag)
    return dest


def upload_s3(local: Path, location: Location) -> None:
    client = s3_client()
    files = [path.relative_to(local).as_posix() for path in local.rglob("*") if path.is_file()]
    for name, key in upload_keys(files, location.key):
        client.upload_file(str(local / name), location.bucket, key)


# --- GCS (tf.io.gfile) ----------------------------------------------------------


def fetch_gs(flag: str, location: Location, dest: Path) -> Path:
    import tensorflow as tf

    if not tf.io.gfile.exists(str(location)):
        raise TrainerError(f"{flag} {location}: does not exist (or is not readable)")
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(f".{dest.name}.{os.getpid()}.partial")
    try:
        tf.io.gfile.copy(str(location), str(partial), overwrite=True)
        os.replace(partial, dest)
    finally:
        partial.unlink(missing_ok=True)
    return dest


def check_gs_destination(flag: str, location: Location) -> None:
    import tensorflow as tf

    if not tf.io.gfile.exists(f"gs://{location.bucket}/"):
        raise TrainerError(f"{flag} {location}: bucket {location.bucket!r} does not exist (or is not readable)")


def upload_gs(local: Path, location: Location) -> None:
    import tensorflow as tf

    files = [path.relative_to(local).as_posix() for path in local.rglob("*") if path.is_file()]
    for name, key in upload_keys(files, location.key):
        target = f"gs://{location.bucket}/{key}"
        tf.io.gfile.makedirs(target.rsplit("/", 1)[0])
        tf.io.gfile.copy(str(local / name), target, overwrite=True)


@dataclass(frozen=True)
class Store:
    """One remote scheme's edges: fetch an object, check a destination's bucket, upload a folder."""

    fetch: Callable[[str, Location, Path], Path]
    check_destination: Callable[[str, Location], None]
    upload: Callable[[Path, Location], None]


STORES = {"s3": Store(fetch_s3, check_s3_destination, upload_s3),
          "gs": Store(fetch_gs, check_gs_destination, upload_gs)}


# --- the edges __main__ and run call ----------------------------------------------


def fetch(flag: str, text: str, cache_dir: Path) -> Path:
    """The local path of ``text``: itself when local, else its cached download."""
    location = parse_location(text)
    if not location.remote:
        return Path(text)
    if not location.key:
        raise TrainerError(f"{flag} {text}: names a bucket, not an object")
    return STORES[location.scheme].fetch(flag, location, cache_path(cache_dir, location))


def check_destination(flag: str, text: str) -> None:
    """Fail early unless a remote destination's bucket exists and is visible."""
    location = parse_location(text)
    if location.remote:
        STORES[location.scheme].check_destination(flag, location)


def upload(local: Path, text: str) -> None:
    """Copy the files under ``local`` to the remote prefix ``text``."""
    location = parse_location(text)
    if location.remote:
        STORES[location.scheme].upload(local, location)
