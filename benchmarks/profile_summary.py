"""Summarises a TF profiler trace (xplane.pb) as a table of time per op type.

    python -m benchmarks.profile_summary PROFILE_DIR [--top 15]

Reads the newest `*.xplane.pb` under PROFILE_DIR (written by `tf.profiler.experimental.start/stop`,
e.g. `python -m benchmarks.train_bench --one ... --profile_dir DIR`), takes every event on the host
CPU plane's op lines (TF executor ops; with XLA also the HLO ops of the compiled cluster when the
runtime traces them) and sums wall time by op type (the part of the event name after ':' for TF
ops, the HLO opcode prefix for XLA ops). Self time is approximated by subtracting nested events on
the same line.
"""

import argparse
import collections
import glob
import os
import re
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load(profile_dir):
    from tensorflow.tsl.profiler.protobuf import xplane_pb2
    files = sorted(glob.glob(os.path.join(profile_dir, "**", "*.xplane.pb"), recursive=True),
                   key=os.path.getmtime)
    if not files:
        raise FileNotFoundError(f"no *.xplane.pb under {profile_dir}")
    space = xplane_pb2.XSpace()
    with open(files[-1], "rb") as f:
        space.ParseFromString(f.read())
    return space


def op_type(name):
    if ":" in name:
        return name.rsplit(":", 1)[1]
    return re.sub(r"[._]\d+$", "", name.split("/")[-1])


def summarise(space, line_filter=None):
    by_type = collections.Counter()
    counts = collections.Counter()
    lines_seen = collections.Counter()
    for plane in space.planes:
        if "CPU" not in plane.name and "host" not in plane.name.lower():
            continue
        meta = {k: v.name for k, v in plane.event_metadata.items()}
        for line in plane.lines:
            lines_seen[line.name] += len(line.events)
            if line_filter and not re.search(line_filter, line.name):
                continue
            events = sorted(((e.offset_ps, e.offset_ps + e.duration_ps,
                              meta.get(e.metadata_id, "?")) for e in line.events),
                            key=lambda x: (x[0], -x[1]))
            # self time: subtract direct children on the same line
            stack = []
            self_time = {}
            for idx, (start, end, name) in enumerate(events):
                while stack and events[stack[-1]][1] <= start:
                    stack.pop()
                self_time[idx] = end - start
                if stack:
                    self_time[stack[-1]] -= end - start
                stack.append(idx)
            for idx, (_, _, name) in enumerate(events):
                t = op_type(name)
                by_type[t] += self_time[idx]
                counts[t] += 1
    return by_type, counts, lines_seen


def table(by_type, counts, top=15):
    total = sum(by_type.values()) or 1
    rows = ["| op type | self time (ms) | share | events |", "| --- | ---: | ---: | ---: |"]
    for name, ps in by_type.most_common(top):
        rows.append(f"| {name} | {ps / 1e9:.1f} | {100 * ps / total:.1f}% | {counts[name]} |")
    return "\n".join(rows)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile_dir")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--lines", default=None, help="regex on line names (threads) to keep")
    parser.add_argument("--list_lines", action="store_true")
    args = parser.parse_args(argv)
    space = load(args.profile_dir)
    by_type, counts, lines = summarise(space, args.lines)
    if args.list_lines:
        for name, n in lines.most_common():
            print(f"{n:8d}  {name}")
    print(table(by_type, counts, args.top))


if __name__ == "__main__":
    main()
