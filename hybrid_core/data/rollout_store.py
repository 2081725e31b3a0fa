"""The run's Arrow store: `<root>/<run_id>/steps/<k>/<stage>/part-*.parquet` + `_SUCCESS`, manifest and events.

Owns the layout, the atomic commit (temporary name + rename locally, `_SUCCESS` written last on object stores) and the
append-only `events.jsonl`. It knows nothing about what the columns mean or who produces them.
"""
from __future__ import annotations

import hashlib
import json
import time
import uuid

import fsspec
import pyarrow as pa
import pyarrow.dataset as pds
import pyarrow.parquet as pq

SUCCESS = "_SUCCESS"
ROWS_PER_PART = 4096


class RolloutStore:
    """Reads and commits the stage datasets of one run. Safe to construct in any process."""

    def __init__(self, run_dir: str, storage_options: dict | None = None):
        options = dict(storage_options or {})
        if run_dir.startswith(("s3://", "s3a://")):
            # other processes commit into the same prefixes: a cached listing would hide their _SUCCESS markers
            options.setdefault("use_listings_cache", False)
            options.setdefault("skip_instance_cache", True)
        self.fs, self.root = fsspec.core.url_to_fs(run_dir, **options)
        self.run_dir = run_dir.rstrip("/")
        self.is_local = "file" in self.fs.protocol  # protocol is a str or a tuple of aliases

    def stage_path(self, step: int, stage: str) -> str:
        return f"{self.root}/steps/{step}/{stage}"

    def stage_uri(self, step: int, stage: str) -> str:
        return f"{self.run_dir}/steps/{step}/{stage}"

    def is_committed(self, step: int, stage: str) -> bool:
        return self.fs.exists(f"{self.stage_path(step, stage)}/{SUCCESS}")

    def write(self, step: int, stage: str, table: pa.Table) -> str:
        """Commit `table` as the stage's dataset, replacing any uncommitted leftovers; returns its URI."""
        final = self.stage_path(step, stage)
        target = f"{final}.tmp-{uuid.uuid4().hex[:8]}" if self.is_local else final
        self._remove(final if not self.is_local else None)
        self.fs.makedirs(target, exist_ok=True)
        for i, start in enumerate(range(0, max(table.num_rows, 1), ROWS_PER_PART)):
            with self.fs.open(f"{target}/part-{i:05d}.parquet", "wb") as f:
                pq.write_table(table.slice(start, ROWS_PER_PART), f)
        with self.fs.open(f"{target}/{SUCCESS}", "wb") as f:
            f.write(json.dumps({"rows": table.num_rows, "time": time.time()}).encode())
        if self.is_local:
            self._remove(final)
            self.fs.mv(target, final, recursive=True)
        return self.stage_uri(step, stage)

    def read(self, step: int, stage: str) -> pa.Table:
        if not self.is_committed(step, stage):
            raise FileNotFoundError(f"stage {stage!r} of step {step} is not committed under {self.run_dir}")
        path = self.stage_path(step, stage)
        files = sorted(p for p in self.fs.ls(path, detail=False) if p.endswith(".parquet"))
        return pds.dataset(files, format="parquet", filesystem=self.fs).to_table()

    def _remove(self, path: str | None) -> None:
        if path and self.fs.exists(path):
            self.fs.rm(path, recursive=True)

    def clean_leftovers(self, step: int) -> None:
        """Remove temporary folders a crashed writer left behind for `step`."""
        base = f"{self.root}/steps/{step}"
        if self.fs.exists(base):
            for p in self.fs.ls(base, detail=False):
                if ".tmp-" in p.rsplit("/", 1)[-1]:
                    self.fs.rm(p, recursive=True)

    def log_event(self, step: int, stage: str, event: str, **extra) -> None:
        """Append one line to events.jsonl (flushed at once, so outside observers can act on it)."""
        line = json.dumps({"step": step, "stage": stage, "event": event, "time": time.time(), **extra})
        path = f"{self.root}/events.jsonl"
        if self.is_local:
            self.fs.makedirs(self.root, exist_ok=True)
            with open(path, "a") as f:
                f.write(line + "\n")
                f.flush()
        else:  # object stores cannot append: rewrite the (small) file
            old = self.fs.cat_file(path).decode() if self.fs.exists(path) else ""
            self.fs.pipe_file(path, (old + line + "\n").encode())

    def read_json(self, name: str, default=None):
        path = f"{self.root}/{name}"
        return json.loads(self.fs.cat_file(path)) if self.fs.exists(path) else default

    def write_json(self, name: str, value) -> None:
        """Write a small JSON document atomically (rename locally; single PUT on object stores)."""
        path = f"{self.root}/{name}"
        data = json.dumps(value, indent=1, sort_keys=True).encode()
        if self.is_local:
            self.fs.makedirs(self.root, exist_ok=True)
            tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
            self.fs.pipe_file(tmp, data)
            self.fs.mv(tmp, path)
        else:
            self.fs.pipe_file(path, data)

    def record_commit(self, step: int, stage: str, rows: int, policy_version: int, content_hash: str = "") -> None:
        """Add the committed stage to manifest.json (the run's table of contents) and log the commit event."""
        self.update_manifest(step, stage, {"rows": rows, "policy_version": policy_version, "hash": content_hash})
        self.log_event(step, stage, "commit", rows=rows)

    def update_manifest(self, step: int, key: str, value) -> None:
        manifest = self.manifest()
        manifest["steps"].setdefault(str(step), {})[key] = value
        self.write_json("manifest.json", manifest)

    def manifest(self) -> dict:
        return self.read_json("manifest.json", {"steps": {}})

    def commit(self, step: int, stage: str, table: pa.Table, policy_version: int, drop_from_hash=()) -> str:
        """Write the stage atomically, then record it (rows, content hash, policy version) in the manifest."""
        path = self.write(step, stage, table)
        self.record_commit(step, stage, table.num_rows, policy_version, table_hash(table, drop_from_hash))
        return path

    def committed_entry(self, step: int, stage: str) -> dict | None:
        """The manifest entry of a stage whose dataset is committed for the policy that step k uses (k − 1)."""
        entry = self.manifest()["steps"].get(str(step), {}).get(stage)
        if entry is None or entry.get("policy_version") != step - 1 or not self.is_committed(step, stage):
            return None
        return entry


def table_hash(table: pa.Table, drop=()) -> str:
    """sha256 of the table's Arrow IPC bytes (without `drop` columns, e.g. wall-clock timings)."""
    table = table.drop_columns([c for c in drop if c in table.column_names])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return hashlib.sha256(sink.getvalue().to_pybytes()).hexdigest()
