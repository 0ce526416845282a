"""The items `kiln run --shard-input` splits among its processes: the lines of a list file, the files of a folder,
or the objects under an S3 prefix, always in the same (sorted) order."""

from __future__ import annotations

import os
from pathlib import Path

from bootstrap.errors import KilnError, UsageError


def list_inputs(source: str, project: Path | None = None) -> list[str]:
    """Every item `source` names. A folder's files are given relative to `project` when they lie inside it
    (the nodes have the synced copy), else as absolute paths (for storage every node mounts)."""
    if source.startswith("s3://"):
        return s3_objects(source)
    path = Path(source)
    if path.is_dir():
        files = sorted(p for p in path.resolve().rglob("*") if p.is_file())
        if project is not None:
            files = [p.relative_to(project) if p.is_relative_to(project) else p for p in files]
        items = [str(p) for p in files]
    elif path.is_file():
        items = [line.strip() for line in path.read_text().splitlines()]
        items = [item for item in items if item and not item.startswith("#")]
    else:
        raise UsageError(f"--shard-input {source}: no such file or folder (or give an s3://bucket/prefix)")
    if not items:
        raise UsageError(f"--shard-input {source}: no items to share out")
    return items


def s3_objects(uri: str) -> list[str]:
    import boto3
    import botocore.config
    import botocore.exceptions

    bucket, _, prefix = uri[len("s3://"):].partition("/")
    if not bucket:
        raise UsageError(f"--shard-input {uri}: give s3://bucket/prefix")
    from bootstrap.providers.aws.cloud import ENDPOINT_ENV

    client = boto3.client("s3", endpoint_url=os.environ.get(ENDPOINT_ENV) or None,
                          config=botocore.config.Config(connect_timeout=10, read_timeout=30,
                                                        retries={"max_attempts": 3}))
    try:
        keys = [item["Key"] for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
                for item in page.get("Contents", []) if not item["Key"].endswith("/")]
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as error:
        raise KilnError(f"--shard-input {uri}: cannot list it: {error}") from None
    if not keys:
        raise UsageError(f"--shard-input {uri}: no objects under it")
    return [f"s3://{bucket}/{key}" for key in sorted(keys)]
