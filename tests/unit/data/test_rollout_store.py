"""Unit tests for hybrid_core.data.rollout_store: atomic stage commits, leftovers, manifest and events.

The same round trip runs on a local folder and on `s3://` served by a real moto server (module-scoped fixture).
"""

import copy
import json
import os
import time

import pyarrow as pa
import pytest

from hybrid_core.data import rollout_store
from hybrid_core.data.rollout_store import SUCCESS, RolloutStore, table_hash
from tests.unit.moto_fixtures import moto_url, s3_options  # noqa: F401  (pytest fixtures)

TABLE = pa.table({"prompt_index": [0, 0, 1], "reward": [1.0, 0.5, 0.0]})


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    if request.param == "local":
        return RolloutStore(str(tmp_path / "run1"))
    options = request.getfixturevalue("s3_options")
    return RolloutStore(f"s3://bucket/prefix/{request.node.name.replace('[', '-').rstrip(']')}/run1", options)


def _put(store: RolloutStore, path: str, data: bytes) -> None:
    store.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)  # local files need their folder; S3 ignores it
    store.fs.pipe_file(path, data)


def _names(store: RolloutStore, path: str) -> list[str]:
    return sorted(p.rsplit("/", 1)[-1] for p in store.fs.ls(path, detail=False))


def test_local_and_s3_are_told_apart(tmp_path, s3_options):
    assert RolloutStore(str(tmp_path)).is_local
    assert not RolloutStore("s3://bucket/prefix/run1", s3_options).is_local


def test_write_commits_parts_and_success_and_reads_back(store):
    import hashlib

    assert not store.is_committed(1, "rollout")
    files = store.write(1, "rollout", TABLE)
    assert store.stage_uri(1, "rollout") == f"{store.run_dir}/steps/1/rollout"
    assert store.is_committed(1, "rollout")
    part = store.fs.cat_file(f"{store.stage_path(1, 'rollout')}/part-00000.parquet")
    assert files == {"part-00000.parquet": hashlib.sha256(part).hexdigest()}  # the bytes as written
    assert _names(store, store.stage_path(1, "rollout")) == [SUCCESS, "part-00000.parquet"]
    assert json.loads(store.fs.cat_file(f"{store.stage_path(1, 'rollout')}/{SUCCESS}"))["rows"] == 3
    assert store.read(1, "rollout").equals(TABLE)
    # the stage folder is the only entry of the step: no temporary folder survives a successful commit
    assert _names(store, f"{store.root}/steps/1") == ["rollout"]


def test_only_string_columns_are_dictionary_encoded_and_a_subset_reads_back(tmp_path):
    import pyarrow.parquet as pq

    store = RolloutStore(str(tmp_path / "run1"))
    table = pa.table({"ids": pa.array([[1, 2], [3]], pa.list_(pa.int32())), "reward": [0.5, 0.25],
                      "label": ["a", "a"]})
    store.write(1, "rollout", table)
    meta = pq.read_metadata(f"{store.stage_path(1, 'rollout')}/part-00000.parquet").row_group(0)
    encodings = {meta.column(i).path_in_schema.split(".")[0]: meta.column(i).encodings for i in range(3)}
    assert "RLE_DICTIONARY" in encodings["label"]
    assert "RLE_DICTIONARY" not in encodings["ids"] and "RLE_DICTIONARY" not in encodings["reward"]
    assert store.read(1, "rollout", ["reward"]).equals(table.select(["reward"]))


def test_large_tables_split_into_ordered_parts(store, monkeypatch):
    monkeypatch.setattr(rollout_store, "ROWS_PER_PART", 2)
    table = pa.table({"x": list(range(5))})
    store.write(2, "reward", table)
    # 5 rows, 2 a part → parts of 2, 2, 1 rows
    assert _names(store, store.stage_path(2, "reward")) == [SUCCESS] + [f"part-0000{i}.parquet" for i in range(3)]
    assert store.read(2, "reward").column("x").to_pylist() == [0, 1, 2, 3, 4]


def test_rewrite_replaces_the_whole_stage(store, monkeypatch):
    monkeypatch.setattr(rollout_store, "ROWS_PER_PART", 2)
    store.write(1, "rollout", TABLE)  # 3 rows → 2 parts
    store.write(1, "rollout", pa.table({"prompt_index": [7], "reward": [0.25]}))  # 1 row → 1 part
    assert _names(store, store.stage_path(1, "rollout")) == [SUCCESS, "part-00000.parquet"]
    assert store.read(1, "rollout").to_pydict() == {"prompt_index": [7], "reward": [0.25]}


def test_empty_table_commits_and_reads_back_empty(store):
    store.write(3, "advantage", TABLE.slice(0, 0))
    assert store.is_committed(3, "advantage")
    got = store.read(3, "advantage")
    assert got.num_rows == 0 and got.schema == TABLE.schema


def test_reading_an_uncommitted_stage_fails_naming_it(store):
    # an object-store writer that died before `_SUCCESS`: parts present, no marker
    _put(store, f"{store.stage_path(4, 'reward')}/part-00000.parquet", b"half written")
    assert not store.is_committed(4, "reward")
    with pytest.raises(FileNotFoundError, match=r"stage 'reward' of step 4 is not committed"):
        store.read(4, "reward")


def test_local_crash_leftover_is_invisible_then_cleaned(tmp_path):
    store = RolloutStore(str(tmp_path / "run1"))
    store.write(1, "rollout", TABLE)
    crashed = tmp_path / "run1" / "steps" / "1" / "reward.tmp-x"  # a writer died before its rename
    crashed.mkdir()
    (crashed / "part-00000.parquet").write_bytes(b"partial")
    (crashed / SUCCESS).write_text("{}")  # even a complete temp folder is not the stage
    assert not store.is_committed(1, "reward")
    with pytest.raises(FileNotFoundError):
        store.read(1, "reward")
    store.clean_leftovers(1)
    assert sorted(os.listdir(tmp_path / "run1" / "steps" / "1")) == ["rollout"]
    assert store.read(1, "rollout").equals(TABLE)
    store.clean_leftovers(99)  # a step that never started: nothing to do, no error


def test_write_replaces_an_uncommitted_leftover_at_the_final_path(store):
    _put(store, f"{store.stage_path(5, 'rollout')}/part-00009.parquet", b"stale")
    store.write(5, "rollout", TABLE)
    assert _names(store, store.stage_path(5, "rollout")) == [SUCCESS, "part-00000.parquet"]


def test_record_builds_the_manifest_and_logs_events(store):
    assert store.read_json("manifest.json") is None
    assert store.manifest() == {"steps": {}}
    store.record(1, "rollout", {"rows": 4, "policy_version": 0, "hash": "h1"})
    store.record(1, "reward", {"rows": 4, "policy_version": 0})
    store.record(2, "train", {"seconds": 1.5})
    assert store.read_json("manifest.json") == {"steps": {
        "1": {"rollout": {"rows": 4, "policy_version": 0, "hash": "h1"}, "reward": {"rows": 4, "policy_version": 0}},
        "2": {"train": {"seconds": 1.5}},
    }}
    store.update_manifest(1, {"reward": None})  # None removes an entry
    assert set(store.manifest()["steps"]["1"]) == {"rollout"}
    store.log_event(2, "train", "start", attempt=1)
    lines = store.fs.cat_file(f"{store.root}/events.jsonl").decode().splitlines()
    events = [json.loads(line) for line in lines]
    assert [(e["step"], e["stage"], e["event"]) for e in events] == [
        (1, "rollout", "commit"), (1, "reward", "commit"), (2, "train", "commit"), (2, "train", "start")]
    assert [e.get("rows") for e in events] == [4, 4, None, None]
    assert events[3]["attempt"] == 1
    times = [e["time"] for e in events]
    assert all(isinstance(t, float) for t in times) and times == sorted(times)
    assert abs(times[-1] - time.time()) < 60


def test_the_manifest_is_parsed_again_only_after_the_file_changed(store, monkeypatch):
    parses = []
    parse = RolloutStore._parse_manifest
    monkeypatch.setattr(RolloutStore, "_parse_manifest", lambda self, data: parses.append(data) or parse(self, data))
    other = copy.copy(store)  # another worker's store of the same run (its own cache)
    entry = {"rows": 4, "policy_version": 0}
    store.record(1, "rollout", entry)
    entry["rows"] = 5  # the caller's dict is not the manifest's
    first = store.manifest()
    assert store.manifest() is first and parses == []  # the bytes it wrote are the bytes it reads: no parse
    assert first["steps"]["1"]["rollout"]["rows"] == 4
    before = len(parses)
    other.record(1, "reward", {"rows": 4, "policy_version": 0})  # the file changed under the first store
    assert set(store.manifest()["steps"]["1"]) == {"rollout", "reward"} and len(parses) > before
    assert set(first["steps"]["1"]) == {"rollout"}  # what a caller holds is never changed behind it

    def failing_write(name, data):
        raise OSError("disk full")
    monkeypatch.setattr(store, "_write_bytes", failing_write)
    with pytest.raises(OSError, match="disk full"):
        store.update_manifest(1, {"advantage": {"rows": 4}})
    assert set(store.manifest()["steps"]["1"]) == {"rollout", "reward"}  # the failed update left no trace
    assert set(other.manifest()["steps"]["1"]) == {"rollout", "reward"}


def test_updates_write_what_the_json_encoder_writes_byte_for_byte(store):
    other = copy.copy(store)
    store.write_json("manifest.json", {"steps": {}, "run_id": "r1", "config": {"b": [1, 2.5], "a": None}})
    for k in (1, 2, 10, 9):  # step keys sort as strings: "1" < "10" < "2" < "9"
        store.record(k, "rollout", {"rows": k, "policy_version": k - 1, "hash": f"h{k}", "files": {"p": "x"}})
        other.record(k, "train", {"seconds": 0.1 * k, "metrics": {"kl": -0.0, "lr": 1e-06, "loss": float("nan")}})
        store.update_manifest(k, {"rollout": None} if k == 2 else {"reward": {"rows": 2, "label": "é"}})
    written = store.fs.cat_file(f"{store.root}/manifest.json")
    parsed = json.loads(written)
    assert written == json.dumps(parsed, sort_keys=True, separators=(",", ":")).encode()
    assert list(parsed["steps"]) == ["1", "10", "2", "9"] and set(parsed["steps"]["2"]) == {"train"}
    assert parsed["config"] == {"a": None, "b": [1, 2.5]} and parsed["steps"]["9"]["reward"]["label"] == "é"


def test_write_json_round_trip_sorted_and_overwrites(store):
    store.write_json("state.json", {"b": 1, "a": [1, 2]})
    raw = store.fs.cat_file(f"{store.root}/state.json").decode()
    assert raw == '{"a":[1,2],"b":1}'  # sorted keys, compact (the manifest is rewritten at every commit)
    store.write_json("state.json", {"c": None})
    assert store.read_json("state.json") == {"c": None}
    assert _names(store, store.root) == ["state.json"]  # no `.tmp-*` left behind


def test_local_write_json_keeps_the_old_document_if_the_rename_fails(tmp_path, monkeypatch):
    store = RolloutStore(str(tmp_path / "run1"))
    store.write_json("manifest.json", {"steps": {"1": {}}})

    def crash(*args, **kwargs):
        raise OSError("killed before the rename")

    monkeypatch.setattr(store.fs, "mv", crash)
    with pytest.raises(OSError):
        store.write_json("manifest.json", {"steps": {}})
    assert store.read_json("manifest.json") == {"steps": {"1": {}}}  # readers still see a complete document


def test_commit_records_hashes_and_replayable_checks_the_version(store):
    import hashlib

    table = pa.table({"a": [1, 2, 3]})
    store.commit(2, "rollout", table, policy_version=1, record={"seconds": 0.5})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    expected = hashlib.sha256(sink.getvalue().to_pybytes()).hexdigest()  # independent of table_hash
    part = store.fs.cat_file(f"{store.stage_path(2, 'rollout')}/part-00000.parquet")
    assert store.replayable(2, "rollout", policy_version=1) == {
        "rows": 3, "policy_version": 1, "hash": expected, "seconds": 0.5,
        "files": {"part-00000.parquet": hashlib.sha256(part).hexdigest()}}
    assert store.replayable(2, "rollout", policy_version=2) is None  # produced by another policy: generate again
    assert store.replayable(3, "rollout", policy_version=2) is None  # nothing committed
    timed = pa.table({"a": [1], "timing_s/x": [0.5]})
    assert table_hash(timed, drop=["timing_s/x"]) == table_hash(pa.table({"a": [1]}))


def test_a_crash_between_write_and_record_is_not_replayed(store):
    def crash():
        raise RuntimeError("killed after the write")

    with pytest.raises(RuntimeError):
        store.commit(1, "reward", TABLE, policy_version=0, on_written=crash)
    assert store.is_committed(1, "reward")  # the files and the marker are there…
    assert store.replayable(1, "reward", policy_version=0) is None  # …but the manifest never recorded them


def test_an_altered_file_is_refused_naming_step_stage_and_file(store):
    from hybrid_core.data.rollout_store import CommittedDataError
    from hybrid_core.types import PermanentError

    store.commit(3, "advantage", TABLE, policy_version=2)
    path = f"{store.stage_path(3, 'advantage')}/part-00000.parquet"
    original = store.fs.cat_file(path)
    middle = len(original) // 2
    store.fs.pipe_file(path, original[:middle] + bytes([original[middle] ^ 0xFF]) + original[middle + 1:])
    with pytest.raises(CommittedDataError, match=r"step 3 stage advantage: .*/steps/3/advantage/part-00000\.parquet "
                                                 r"does not match the sha256 recorded at its commit") as err:
        store.replayable(3, "advantage", policy_version=2)
    assert isinstance(err.value, PermanentError)  # a retry cannot fix it
    store.fs.rm(path)
    with pytest.raises(CommittedDataError, match=r"part-00000\.parquet is missing"):
        store.replayable(3, "advantage", policy_version=2)
    store.fs.pipe_file(path, original)
    store.fs.pipe_file(f"{store.stage_path(3, 'advantage')}/part-00001.parquet", original)
    with pytest.raises(CommittedDataError, match=r"part-00001\.parquet is not in the manifest"):
        store.replayable(3, "advantage", policy_version=2)


def test_regenerating_a_stage_invalidates_the_later_ones_of_its_step(store):
    for stage in ("rollout", "reward", "advantage", "metrics"):
        store.commit(4, stage, TABLE, policy_version=3)
    store.record(4, "train", {"seconds": 1.0})
    store.record(4, "sync", {"policy_version": 4})
    store.commit(5, "reward", TABLE, policy_version=4)  # another step: untouched
    assert store.invalidate_after(4, "reward") == ["advantage", "train", "sync", "metrics"]
    assert set(store.manifest()["steps"]["4"]) == {"rollout", "reward"}
    assert not store.is_committed(4, "advantage") and not store.is_committed(4, "metrics")
    assert store.committed_markers() == {(4, "rollout"), (4, "reward"), (5, "reward")}
    assert store.invalidate_after(4, "reward") == []  # nothing left to drop


@pytest.mark.parametrize("text", [b'{"steps": {"1": {"rollo', b"", b"[1, 2]", b'{"config": {}}', b"\xff\xfe"])
def test_a_damaged_manifest_is_a_clear_error(store, text):
    from hybrid_core.data.rollout_store import ManifestError

    _put(store, f"{store.root}/manifest.json", text)
    with pytest.raises(ManifestError, match=r"manifest .*/run1/manifest\.json is damaged: .* restore it from a copy, "
                                             r"or start a new --run_id"):
        store.manifest()
