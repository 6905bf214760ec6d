#!/usr/bin/env python3
"""Fixtures for the import/export tests, written with the standard library only.

PyTorch memory snapshots are pickled dicts in the format torch/cuda/memory.py documents (_snapshot)
and torch/cuda/_memory_viz.py reads; Nsight Systems exports are SQLite files in the schema of the
Nsight Systems user guide ("SQLite Schema Reference"). Nothing here needs torch or nsys.

usage: torch_fixtures.py KIND OUT [ARG...]
  snapshot        one device with a full history (the figures tests/db/torch_snapshot_test.cpp expects)
                  and a second device whose history wrapped (blocks and a segment from before it);
                  with UNIX_NS MONO_NS RUN_ID, the clock pair zerotrace's Python hook writes
  snapshot-legacy the segment list alone, blocks with `history` instead of `frames`, no device_traces
  expandable      an expandable segment: mapped, carved, partly unmapped
  evil-reduce     protocol 2 pickle that would call os.system(ARG) (GLOBAL + REDUCE)
  evil-stack      protocol 4 pickle that would call os.system(ARG) (STACK_GLOBAL + REDUCE)
  nsys            an Nsight Systems SQLite export
  sqlite-foreign  an SQLite file with tables of its own
"""
import os
import pickle
import sqlite3
import sys

MiB = 1 << 20
S1 = 0x7F0000000000          # a small-pool segment (2 MiB)
S2 = 0x7F0001000000          # a large-pool segment (20 MiB)
T0 = 1_700_000_000_000_000   # time_us of the first entry (Unix microseconds)
STREAM_B = 140_000_000_000   # a side stream (PyTorch writes the cudaStream_t as an int)


def frame(filename, line, name):
    return {"filename": filename, "line": line, "name": name}


TORCH = "/usr/lib/python3/dist-packages/torch"
# The frames lists, innermost first; one list object per stack, shared as PyTorch shares them.
MAIN = [frame("/home/u/job/train.py", 40, "main"), frame("/home/u/job/train.py", 60, "<module>")]
LEAK = [frame("/home/u/job/train.py", 14, "keep_history"), frame("/home/u/job/train.py", 41, "main"),
        frame("/home/u/job/train.py", 60, "<module>")]
FORWARD = [frame(TORCH + "/nn/modules/linear.py", 125, "forward"),
           frame(TORCH + "/nn/modules/module.py", 1747, "_call_impl"),
           frame("/home/u/job/model.py", 22, "forward"), frame("/home/u/job/train.py", 42, "main")]
ADAM = [frame(TORCH + "/optim/adamw.py", 480, "_multi_tensor_adamw"),
        frame(TORCH + "/optim/optimizer.py", 493, "wrapper"), frame("/home/u/job/train.py", 45, "main")]


def entry(action, addr, size, t, stream=0, frames=None):
    e = {"action": action, "addr": addr, "size": size, "stream": stream, "time_us": T0 + t}
    e["frames"] = frames if frames is not None else []
    return e


def snapshot():
    d0 = [
        entry("segment_alloc", S1, 2 * MiB, 0, frames=MAIN),
        entry("alloc", S1, 1000, 1, frames=MAIN),                  # 1024 B: 512-byte rounding
        entry("alloc", S1 + 1024, 512, 2, stream=STREAM_B, frames=FORWARD),  # 512 B, on a side stream
        entry("segment_alloc", S2, 20 * MiB, 3, frames=LEAK),
        entry("alloc", S2, 3 * MiB, 4, frames=ADAM),                 # 3 MiB, split: 17 MiB remain
        entry("alloc", S2 + 3 * MiB, 16 * MiB + 100, 5, frames=LEAK),  # not split: 1 MiB - 512 left: 17 MiB
        entry("free_requested", S1, 1000, 6, frames=MAIN),
        entry("free_completed", S1, 1000, 7, frames=MAIN),
        entry("alloc", S1, 600, 8, frames=MAIN),                     # the whole free 1024 B block
        entry("free_requested", S2, 3 * MiB, 9, stream=STREAM_B, frames=ADAM),
        entry("free_completed", S2, 3 * MiB, 10, stream=STREAM_B, frames=ADAM),
        {"action": "oom", "size": 30 * MiB, "device_free": MiB, "stream": 0, "time_us": T0 + 11, "frames": MAIN},
        entry("alloc", S2, 2 * MiB + 1, 12, frames=MAIN),            # not split: 3 MiB
        {"action": "snapshot", "addr": 0, "size": 0, "stream": 0, "time_us": T0 + 13, "frames": []},
    ]
    seg1 = {"device": 0, "address": S1, "total_size": 2 * MiB, "allocated_size": 1536, "active_size": 1536,
            "requested_size": 1112, "stream": 0, "segment_type": "small", "segment_pool_id": (0, 0),
            "is_expandable": False, "frames": MAIN,
            "blocks": [
                {"address": S1, "size": 1024, "requested_size": 600, "state": "active_allocated", "frames": MAIN},
                {"address": S1 + 1024, "size": 512, "requested_size": 512, "state": "active_allocated",
                 "frames": FORWARD},
                {"address": S1 + 1536, "size": 2 * MiB - 1536, "requested_size": 0, "state": "inactive",
                 "frames": []},
            ]}
    seg2 = {"device": 0, "address": S2, "total_size": 20 * MiB, "allocated_size": 20 * MiB,
            "active_size": 20 * MiB, "requested_size": 18 * MiB + 101, "stream": 0, "segment_type": "large",
            "segment_pool_id": (0, 0), "is_expandable": False, "frames": LEAK,
            "blocks": [
                {"address": S2, "size": 3 * MiB, "requested_size": 2 * MiB + 1, "state": "active_allocated",
                 "frames": MAIN},
                {"address": S2 + 3 * MiB, "size": 17 * MiB, "requested_size": 16 * MiB + 100,
                 "state": "active_allocated", "frames": LEAK},
            ]}
    # Device 1: its history wrapped (max_entries): a 20 MiB segment and a 4 MiB block were there
    # before its first entry; the block is freed in the history, another is allocated.
    D1 = 0x7F1000000000
    d1 = [
        entry("free_requested", D1, 4 * MiB, 100, frames=MAIN),
        entry("free_completed", D1, 4 * MiB, 101, frames=MAIN),
        entry("alloc", D1, 8 * MiB, 102, frames=LEAK),
    ]
    seg3 = {"device": 1, "address": D1, "total_size": 20 * MiB, "allocated_size": 8 * MiB, "active_size": 8 * MiB,
            "requested_size": 8 * MiB, "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0),
            "is_expandable": False, "frames": [],
            "blocks": [
                {"address": D1, "size": 8 * MiB, "requested_size": 8 * MiB, "state": "active_allocated",
                 "frames": LEAK},
                {"address": D1 + 8 * MiB, "size": 12 * MiB, "requested_size": 0, "state": "inactive",
                 "frames": []},
            ]}
    return {"segments": [seg1, seg2, seg3], "device_traces": [d0, d1],
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": (1 << 64) - 1,
                                   "garbage_collection_threshold": 0.0, "expandable_segments": False,
                                   "roundup_power2_divisions": {str(1 << i): 0 for i in range(16)}}}


def snapshot_legacy():
    return [{"device": 0, "address": S1, "total_size": 2 * MiB, "stream": 0, "segment_type": "small",
             "blocks": [{"size": 4096, "state": "active_allocated",
                         "history": [{"addr": S1, "real_size": 4000, "frames": LEAK}]},
                        {"size": 2 * MiB - 4096, "state": "inactive"}]}]


def expandable():
    E = 0x7F2000000000
    d0 = [
        entry("segment_map", E, 20 * MiB, 0, frames=MAIN),
        entry("alloc", E, 5 * MiB, 1, frames=LEAK),          # split (expandable: any remainder >= 512 B)
        entry("alloc", E + 5 * MiB, 4 * MiB, 2, frames=MAIN),
        entry("free_requested", E + 5 * MiB, 4 * MiB, 3, frames=MAIN),
        entry("free_completed", E + 5 * MiB, 4 * MiB, 4, frames=MAIN),
        entry("segment_unmap", E + 10 * MiB, 10 * MiB, 5, frames=MAIN),
    ]
    seg = {"device": 0, "address": E, "total_size": 10 * MiB, "stream": 0, "segment_type": "large",
           "is_expandable": True, "frames": [],
           "blocks": [{"address": E, "size": 5 * MiB, "requested_size": 5 * MiB, "state": "active_allocated",
                       "frames": LEAK},
                      {"address": E + 5 * MiB, "size": 5 * MiB, "requested_size": 0, "state": "inactive"}]}
    return {"segments": [seg], "device_traces": [d0]}


class Evil:
    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def nsys(path):
    db = sqlite3.connect(path)
    c = db.cursor()
    c.executescript("""
CREATE TABLE StringIds (id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE TARGET_INFO_SESSION_START_TIME (utcEpochNs INTEGER, utcTime TEXT, localTime TEXT);
CREATE TABLE ANALYSIS_DETAILS (globalVid INTEGER NOT NULL, duration INTEGER NOT NULL, startTime INTEGER NOT NULL,
  stopTime INTEGER NOT NULL);
CREATE TABLE TARGET_INFO_GPU (vmId INTEGER NOT NULL, id INTEGER NOT NULL, name TEXT, busLocation TEXT,
  isDiscrete INTEGER, l2CacheSize INTEGER, totalMemory INTEGER, cuDevice INTEGER);
CREATE TABLE ENUM_CUDA_MEMCPY_OPER (id INTEGER NOT NULL PRIMARY KEY, name TEXT, label TEXT);
CREATE TABLE ENUM_CUDA_MEM_KIND (id INTEGER NOT NULL PRIMARY KEY, name TEXT, label TEXT);
CREATE TABLE ENUM_CUDA_DEV_MEM_EVENT_OPER (id INTEGER NOT NULL PRIMARY KEY, name TEXT, label TEXT);
CREATE TABLE ENUM_NSYS_EVENT_TYPE (id INTEGER NOT NULL PRIMARY KEY, name TEXT, label TEXT);
CREATE TABLE CUDA_GPU_MEMORY_USAGE_EVENTS (start INTEGER NOT NULL, globalPid INTEGER NOT NULL,
  deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, address INTEGER NOT NULL, pc INTEGER NOT NULL,
  bytes INTEGER NOT NULL, memKind INTEGER NOT NULL, memoryOperationType INTEGER NOT NULL, name TEXT,
  correlationId INTEGER, localMemoryPoolAddress INTEGER, localMemoryPoolReleaseThreshold INTEGER,
  localMemoryPoolSize INTEGER, localMemoryPoolUtilizedSize INTEGER, importedMemoryPoolAddress INTEGER,
  importedMemoryPoolProcessId INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL,
  contextId INTEGER NOT NULL, streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER,
  bytes INTEGER NOT NULL, copyKind INTEGER NOT NULL, deprecatedSrcId INTEGER, srcKind INTEGER, dstKind INTEGER,
  srcDeviceId INTEGER, srcContextId INTEGER, dstDeviceId INTEGER, dstContextId INTEGER, migrationCause INTEGER,
  graphNodeId INTEGER, virtualAddress INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMSET (start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL,
  contextId INTEGER NOT NULL, streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER,
  value INTEGER NOT NULL, bytes INTEGER NOT NULL, graphNodeId INTEGER, memKind INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL,
  contextId INTEGER NOT NULL, streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER,
  demangledName INTEGER NOT NULL, shortName INTEGER NOT NULL, mangledName INTEGER, launchType INTEGER,
  cacheConfig INTEGER, registersPerThread INTEGER NOT NULL, gridX INTEGER NOT NULL, gridY INTEGER NOT NULL,
  gridZ INTEGER NOT NULL, blockX INTEGER NOT NULL, blockY INTEGER NOT NULL, blockZ INTEGER NOT NULL,
  staticSharedMemory INTEGER NOT NULL, dynamicSharedMemory INTEGER NOT NULL, localMemoryPerThread INTEGER NOT NULL,
  localMemoryTotal INTEGER NOT NULL, gridId INTEGER NOT NULL, sharedMemoryExecuted INTEGER, graphNodeId INTEGER,
  sharedMemoryLimitConfig INTEGER);
CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL, rangeId INTEGER,
  category INTEGER, color INTEGER, text TEXT, globalTid INTEGER, endGlobalTid INTEGER, textId INTEGER,
  domainId INTEGER, uint64Value INTEGER, int64Value INTEGER, doubleValue REAL, uint32Value INTEGER,
  int32Value INTEGER, floatValue REAL, jsonTextId INTEGER, jsonText TEXT);
""")
    copy_kinds = ["UNKNOWN", "HTOD", "DTOH", "HTOA", "ATOH", "ATOA", "ATOD", "DTOA", "DTOD", "HTOH", "PTOP",
                  "UVM_HTOD", "UVM_DTOH", "UVM_DTOD"]
    c.executemany("INSERT INTO ENUM_CUDA_MEMCPY_OPER VALUES (?,?,?)",
                  [(i, "CUDA_MEMCPY_KIND_" + k, k) for i, k in enumerate(copy_kinds)])
    mem_kinds = ["PAGEABLE", "PINNED", "DEVICE", "ARRAY", "MANAGED", "DEVICE_STATIC", "MANAGED_STATIC", "UNKNOWN"]
    c.executemany("INSERT INTO ENUM_CUDA_MEM_KIND VALUES (?,?,?)",
                  [(i, "CUDA_MEMOPR_MEMORY_KIND_" + k, k.title()) for i, k in enumerate(mem_kinds)])
    c.executemany("INSERT INTO ENUM_CUDA_DEV_MEM_EVENT_OPER VALUES (?,?,?)",
                  [(0, "CUDA_DEV_MEM_EVENT_OPR_ALLOCATION", "Allocation"),
                   (1, "CUDA_DEV_MEM_EVENT_OPR_DEALLOCATION", "Deallocation")])
    c.executemany("INSERT INTO ENUM_NSYS_EVENT_TYPE VALUES (?,?,?)",
                  [(34, "NvtxMark", "NvtxMark"), (59, "NvtxPushPopRange", "NvtxPushPopRange"),
                   (60, "NvtxStartEndRange", "NvtxStartEndRange"), (75, "NvtxDomainCreate", "NvtxDomainCreate")])
    c.executemany("INSERT INTO StringIds VALUES (?,?)",
                  [(1, "void gemm_kernel<float>(float*, int)"), (2, "gemm_kernel"), (3, "epoch 1"),
                   (4, "my_domain")])
    c.execute("INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (1700000000000000000, '', '')")
    c.execute("INSERT INTO ANALYSIS_DETAILS VALUES (0, 1000000, 0, 1000000)")
    c.execute("INSERT INTO TARGET_INFO_GPU (vmId, id, name, totalMemory, cuDevice) VALUES "
              "(0, 0, 'NVIDIA H200', 150754820096, 0)")
    pid_a, pid_b = 4242, 4343
    gpa, gpb = pid_a << 24, pid_b << 24          # globalPid: the PID sits at bits 24..47
    gta = gpa | 4242                             # globalTid of pid_a's main thread
    mem = [  # start, globalPid, deviceId, address, bytes, memKind, oper, name, localMemoryPoolAddress
        (100, gpa, 0, 0xA000, 64 * MiB, 2, 0, None, None),      # device, freed at 900
        (110, gpa, 0, 0xB000, 2 * MiB, 1, 0, None, None),       # pinned host, never freed
        (120, gpa, 0, 0xC000, 1 * MiB, 0, 0, None, None),       # pageable host
        (130, gpa, 0, 0xD000, 1 * MiB, 2, 0, None, 0xD000),     # from a stream-ordered pool: a block
        (140, gpa, 0, 0xE000, 8, 5, 0, "my_global", None),      # a __device__ variable
        (150, gpb, 0, 0xF000, 4 * MiB, 2, 0, None, None),       # another process
        (160, gpa, 0, 0x1000, 4096, 2, 1, None, None),          # a free whose allocation is not in the capture
        (900, gpa, 0, 0xA000, 64 * MiB, 2, 1, None, None),
    ]
    for m in mem:
        c.execute("INSERT INTO CUDA_GPU_MEMORY_USAGE_EVENTS (start, globalPid, deviceId, contextId, address, pc, "
                  "bytes, memKind, memoryOperationType, name, correlationId, localMemoryPoolAddress) "
                  "VALUES (?,?,?,1,?,0,?,?,?,?,7,?)", m)
    copies = [  # start, end, globalPid, bytes, copyKind, srcKind, dstKind, srcDeviceId, dstDeviceId
        (200, 210, gpa, 1 * MiB, 1, 1, 2, None, None),   # H2D from pinned
        (220, 240, gpa, 2 * MiB, 2, 2, 0, None, None),   # D2H to pageable
        (250, 260, gpa, 4 * MiB, 8, 2, 2, None, None),   # D2D
        (270, 280, gpa, 8 * MiB, 10, 2, 2, 0, 1),        # P2P to GPU 1
    ]
    for cp in copies:
        c.execute("INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY (start, end, deviceId, contextId, streamId, correlationId, "
                  "globalPid, bytes, copyKind, srcKind, dstKind, srcDeviceId, dstDeviceId) "
                  "VALUES (?,?,0,1,7,11,?,?,?,?,?,?,?)", cp)
    c.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, end, deviceId, contextId, streamId, correlationId, "
              "globalPid, demangledName, shortName, registersPerThread, gridX, gridY, gridZ, blockX, blockY, blockZ, "
              "staticSharedMemory, dynamicSharedMemory, localMemoryPerThread, localMemoryTotal, gridId) "
              "VALUES (300, 350, 0, 1, 7, 12, ?, 1, 2, 32, 128, 1, 1, 256, 1, 1, 0, 0, 0, 0, 1)", (gpa,))
    c.execute("INSERT INTO CUPTI_ACTIVITY_KIND_MEMSET (start, end, deviceId, contextId, streamId, correlationId, "
              "globalPid, value, bytes) VALUES (360, 370, 0, 1, 7, 13, ?, 0, 4096)", (gpa,))
    nvtx = [  # start, end, eventType, text, globalTid, textId, int64Value
        (50, 950, 59, None, gta, 3, None),        # "epoch 1" through StringIds
        (400, 500, 60, "step 0", gta, None, 7),   # start/end range with a payload
        (600, None, 34, "checkpoint", gta, None, None),
        (10, None, 75, None, gta, 4, None),       # a domain's creation: not a range
    ]
    for n in nvtx:
        c.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, textId, int64Value) "
                  "VALUES (?,?,?,?,?,?,?)", n)
    db.commit()
    db.close()


def main():
    kind, out = sys.argv[1], sys.argv[2]
    if kind in ("snapshot", "snapshot-legacy", "expandable"):
        data = {"snapshot": snapshot, "snapshot-legacy": snapshot_legacy, "expandable": expandable}[kind]()
        if len(sys.argv) > 5:  # the clock pair and run the probe's Python hook adds
            data["zerotrace"] = {"unix_ns": int(sys.argv[3]), "monotonic_ns": int(sys.argv[4]),
                                 "run_id": sys.argv[5], "pid": 4242, "reason": "exit"}
        with open(out, "wb") as f:
            pickle.dump(data, f)  # the default protocol, as torch.cuda.memory._dump_snapshot
    elif kind in ("evil-reduce", "evil-stack"):
        with open(out, "wb") as f:
            f.write(pickle.dumps({"segments": [], "device_traces": [], "payload": Evil(sys.argv[3])},
                                 protocol=2 if kind == "evil-reduce" else 4))
    elif kind == "nsys":
        if os.path.exists(out):
            os.unlink(out)
        nsys(out)
    elif kind == "sqlite-foreign":
        db = sqlite3.connect(out)
        db.execute("CREATE TABLE recipes (name TEXT, minutes INTEGER)")
        db.execute("INSERT INTO recipes VALUES ('bread', 240)")
        db.commit()
        db.close()
    else:
        sys.exit("unknown fixture " + kind)


if __name__ == "__main__":
    main()
