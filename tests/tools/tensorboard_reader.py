#!/usr/bin/python3
"""An independent reader of TensorBoard event files, for the tests of mt-train --tensorboard-dir.

The Event, Summary and SessionLog messages are declared here with TensorBoard's field numbers
(tensorboard/compat/proto/event.proto, summary.proto) and decoded by Debian's python3-protobuf;
the TFRecord framing and its masked CRC-32C are checked by this file's own code. Files are read
in name order as TensorBoard reads a directory, and a SessionLog START drops every earlier point
at or after its step (TensorBoard's EventAccumulator for files of version brain.Event:2). A
truncated last record (a writer killed mid-write) is counted, not an error; any other damage is.

  tensorboard_reader.py points DIR        JSON: files, starts, truncated, {tag: [[step, value]]}
  tensorboard_reader.py check DIR JSONL [--tensorboard-log-interval N] [--log-interval N]
      [--timers] [--throughput] [--memory] [--ppl] [--no-loss-scale] [--params-norm] [--num-zeros]
      every scalar equals the JSONL records' value rounded to float32, at Megatron's steps and
      under Megatron's conditions, one point per (tag, step); prints a summary, exit 1 on a mismatch.
      The sums over a window (iteration-time, throughput, <timer>-time: the max over ranks of each
      rank's rank_ms summed since the last log block, / --log-interval, in seconds) are compared
      within a relative 1e-6; --params-norm and --num-zeros: the run logged them, every
      --tensorboard-log-interval step must have them (num-zeros not on a skipped step).
      --other-writer-rank: the records are rank 0's and another rank wrote the events, so
      iteration-time and throughput (the writer's own step time) are checked for steps only.
Used by tests/tools/tensorboard.bats.
"""
import argparse
import json
import math
import os
import struct
import sys

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

F = descriptor_pb2.FieldDescriptorProto


def _message_classes():
    proto = descriptor_pb2.FileDescriptorProto(name="mt_test_tensorboard_event.proto", package="mttest", syntax="proto3")

    def field(message, name, number, kind, type_name=None, repeated=False, oneof=None):
        f = message.field.add(name=name, number=number, type=kind,
                              label=F.LABEL_REPEATED if repeated else F.LABEL_OPTIONAL)
        if type_name:
            f.type_name = type_name
        if oneof is not None:
            f.oneof_index = oneof

    session_log = proto.message_type.add(name="SessionLog")
    status = session_log.enum_type.add(name="SessionStatus")
    for name, number in (("STATUS_UNSPECIFIED", 0), ("START", 1), ("STOP", 2), ("CHECKPOINT", 3)):
        status.value.add(name=name, number=number)
    field(session_log, "status", 1, F.TYPE_ENUM, ".mttest.SessionLog.SessionStatus")
    field(session_log, "checkpoint_path", 2, F.TYPE_STRING)
    field(session_log, "msg", 3, F.TYPE_STRING)

    summary = proto.message_type.add(name="Summary")
    value = summary.nested_type.add(name="Value")
    value.oneof_decl.add(name="value")
    field(value, "tag", 1, F.TYPE_STRING)
    field(value, "node_name", 7, F.TYPE_STRING)
    field(value, "simple_value", 2, F.TYPE_FLOAT, oneof=0)
    field(summary, "value", 1, F.TYPE_MESSAGE, ".mttest.Summary.Value", repeated=True)

    event = proto.message_type.add(name="Event")
    event.oneof_decl.add(name="what")
    field(event, "wall_time", 1, F.TYPE_DOUBLE)
    field(event, "step", 2, F.TYPE_INT64)
    field(event, "file_version", 3, F.TYPE_STRING, oneof=0)
    field(event, "graph_def", 4, F.TYPE_BYTES, oneof=0)
    field(event, "summary", 5, F.TYPE_MESSAGE, ".mttest.Summary", oneof=0)
    field(event, "session_log", 7, F.TYPE_MESSAGE, ".mttest.SessionLog", oneof=0)

    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    descriptor = pool.FindMessageTypeByName("mttest.Event")
    if hasattr(message_factory, "GetMessageClass"):
        return message_factory.GetMessageClass(descriptor)
    return message_factory.MessageFactory(pool).GetPrototype(descriptor)


Event = _message_classes()


def _crc32c_table():
    table = []
    for i in range(256):
        crc = i
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


CRC_TABLE = _crc32c_table()


def masked_crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc = (crc >> 8) ^ CRC_TABLE[(crc ^ byte) & 0xFF]
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def records(path):
    """The file's complete records, and whether a truncated one ends it."""
    data = open(path, "rb").read()
    out, offset = [], 0
    while offset < len(data):
        if len(data) - offset < 12:
            return out, True
        header = data[offset:offset + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", data[offset + 8:offset + 12])
        if length_crc != masked_crc32c(header):
            raise SystemExit(f"{path}: length CRC mismatch at byte {offset}")
        if len(data) - offset - 12 < length + 4:
            return out, True
        payload = data[offset + 12:offset + 12 + length]
        (data_crc,) = struct.unpack("<I", data[offset + 12 + length:offset + 16 + length])
        if data_crc != masked_crc32c(payload):
            raise SystemExit(f"{path}: data CRC mismatch at byte {offset}")
        out.append(payload)
        offset += 16 + length
    return out, False


def read_directory(directory):
    """What TensorBoard shows of a directory: {tag: [(step, value)]} after START purges."""
    files = sorted(name for name in os.listdir(directory) if "tfevents" in name)
    points, starts, truncated = {}, [], 0
    for name in files:
        payloads, cut = records(os.path.join(directory, name))
        truncated += cut
        for index, payload in enumerate(payloads):
            event = Event()
            event.ParseFromString(payload)
            kind = event.WhichOneof("what")
            if index == 0 and (kind != "file_version" or event.file_version != "brain.Event:2"):
                raise SystemExit(f"{name}: does not start with the file version brain.Event:2")
            if kind == "session_log" and event.session_log.status == 1:
                starts.append(event.step)
                for tag in points:
                    points[tag] = [p for p in points[tag] if p[0] < event.step]
            elif kind == "summary":
                for value in event.summary.value:
                    if value.WhichOneof("value") != "simple_value":
                        raise SystemExit(f"{name}: {value.tag} is not a simple_value")
                    points.setdefault(value.tag, []).append((event.step, value.simple_value))
    return {"files": len(files), "starts": starts, "truncated": truncated, "points": points}


def f32(value):
    return struct.unpack("<f", struct.pack("<f", value))[0]


def required(record, key):
    if key not in record:
        raise SystemExit(f"step record of iteration {record['iteration']} has no {key}")
    return record[key]


def expected_points(jsonl, o):
    """Megatron's scalars (training_log, evaluate_and_print_results, timers.write) from the records."""
    steps, evals = [], []
    for line in open(jsonl):
        record = json.loads(line)
        if record.get("record") == "step":
            steps.append(record)
        elif record.get("record") == "eval":
            evals.append(record)
    expected = {}

    def put(tag, step, value):
        expected.setdefault(tag, []).append((step, f32(value)))

    samples_at, skipped_before = {}, None
    window = []  # (step_ms, tflops_per_device) since the last log-block write
    rank_sums = {}  # timer -> [ms summed over the same window, per world rank]
    for index, s in enumerate(steps):
        it, samples = s["iteration"], s["consumed_samples"]
        samples_at[it] = samples
        skipped = skipped_before is not None and s["skipped_iters"] > skipped_before
        if index == 0:
            skipped = s["skipped_iters"] > 0
        skipped_before = s["skipped_iters"]
        if it % o.tensorboard_log_interval == 0:
            pairs = [("learning-rate", s["lr"]), ("batch-size", s["global_batch_size"]), ("lm loss", s["lm_loss"])]
            if not o.no_loss_scale:
                pairs.append(("loss-scale", s["loss_scale"]))
            if not skipped:
                pairs.append(("grad-norm", s["grad_norm"]))
            # training_log(): num-zeros and params-norm when not None (the optimizer returns no
            # zero count on a skipped step; the params norm is taken every step).
            if o.num_zeros and not skipped:
                pairs.append(("num-zeros", required(s, "num_zeros")))
            if o.params_norm:
                pairs.append(("params-norm", required(s, "params_norm")))
            for tag, value in pairs:
                put(tag, it, value)
                put(tag + " vs samples", samples, value)
        window.append((s["step_ms"], s["tflops_per_device"]))
        for name, timer in s.get("timers", {}).items():  # each rank's milliseconds summed
            sums = rank_sums.setdefault(name, [0.0] * len(timer["rank_ms"]))
            for rank, ms in enumerate(timer["rank_ms"]):
                sums[rank] += ms
        first = index == 0
        if o.timers and (it % o.log_interval == 0 or first):
            seconds = sum(ms for ms, _ in window) / 1e3
            if not first:
                put("iteration-time", it, seconds / len(window))
            if o.throughput:
                put("throughput", it, sum(t * ms / 1e3 for ms, t in window) / seconds)
            # Timers.write(normalizer=log_interval, reset=False): per timer, the max over ranks of
            # each rank's elapsed time since the last reset (the log block), in seconds; a timer no
            # rank ran is left out.
            for name, sums in rank_sums.items():
                if max(sums) > 0:
                    put(name + "-time", it, max(sums) / 1e3 / o.log_interval)
        if (it % o.log_interval == 0 or first) and not first:
            window, rank_sums = [], {}
    for e in evals:
        samples = samples_at[e["iteration"]]
        put("lm loss validation", e["iteration"], e["lm_loss"])
        put("lm loss validation vs samples", samples, e["lm_loss"])
        if o.ppl:
            put("lm loss validation ppl", e["iteration"], e["ppl"])
            put("lm loss validation ppl vs samples", samples, e["ppl"])
    return expected, steps


def check(o):
    seen = read_directory(o.directory)
    points = seen["points"]
    expected, steps = expected_points(o.jsonl, o)
    failures = []
    for tag, values in points.items():
        pairs = [step for step, _ in values]
        if len(pairs) != len(set(pairs)):
            failures.append(f"{tag}: more than one point at a step: {sorted(pairs)}")
    memory_tags = ["mem-reserved-bytes", "mem-allocated-bytes", "mem-max-allocated-bytes", "mem-allocated-count"]
    for tag in memory_tags:
        if not o.memory:
            if tag in points:
                failures.append(f"{tag}: written without --log-memory-to-tensorboard")
            continue
        want = [s["iteration"] for s in steps if s["iteration"] % o.tensorboard_log_interval == 0]
        got = points.get(tag, [])
        if [step for step, _ in got] != want or not all(v > 0 for _, v in got):
            failures.append(f"{tag}: {got} (want positive values at {want})")
    if o.memory and points.get("mem-max-allocated-bytes"):
        peak = max(v for _, v in points["mem-max-allocated-bytes"])
        if any(v > peak for _, v in points["mem-allocated-bytes"]):
            failures.append("mem-allocated-bytes above mem-max-allocated-bytes")
    timer_tags = [tag for tag in points if tag.endswith("-time") and tag != "iteration-time"]
    if timer_tags and not o.timers:
        failures.append(f"timers written without --log-timers-to-tensorboard: {timer_tags}")
    for tag in sorted(set(expected) | set(points)):
        if tag in memory_tags:
            continue
        got = sorted(points.get(tag, []))
        want = sorted(expected.get(tag, []))
        if o.other_writer_rank and tag in ("iteration-time", "throughput"):
            # The writer's own step time (Megatron: the last rank's interval-time), not the records'.
            if [g[0] for g in got] != [w[0] for w in want] or not all(g[1] > 0 for g in got):
                failures.append(f"{tag}: {got} (want positive values at {[w[0] for w in want]})")
        elif tag.endswith("-time") or tag == "throughput":  # sums over a window: float32 of a double sum
            close = len(got) == len(want) and all(
                g[0] == w[0] and math.isclose(g[1], w[1], rel_tol=1e-6) for g, w in zip(got, want))
            if not close:
                failures.append(f"{tag}: {got} != {want}")
        elif got != want:
            failures.append(f"{tag}: {got[:6]}... != {want[:6]}... ({len(got)} vs {len(want)} points)")
    count = sum(len(values) for values in points.values())
    print(json.dumps({"files": seen["files"], "starts": seen["starts"], "truncated": seen["truncated"],
                      "tags": len(points), "points": count, "failures": failures}))
    return 1 if failures else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    points = sub.add_parser("points")
    points.add_argument("directory")
    checker = sub.add_parser("check")
    checker.add_argument("directory")
    checker.add_argument("jsonl")
    checker.add_argument("--tensorboard-log-interval", type=int, default=1)
    checker.add_argument("--log-interval", type=int, default=100)
    checker.add_argument("--timers", action="store_true")
    checker.add_argument("--throughput", action="store_true")
    checker.add_argument("--memory", action="store_true")
    checker.add_argument("--ppl", action="store_true")
    checker.add_argument("--no-loss-scale", action="store_true")
    checker.add_argument("--params-norm", action="store_true")
    checker.add_argument("--num-zeros", action="store_true")
    checker.add_argument("--other-writer-rank", action="store_true")
    o = parser.parse_args()
    if o.command == "points":
        seen = read_directory(o.directory)
        seen["points"] = {tag: [[step, value] for step, value in values] for tag, values in seen["points"].items()}
        print(json.dumps(seen))
        return 0
    return check(o)


if __name__ == "__main__":
    sys.exit(main())
