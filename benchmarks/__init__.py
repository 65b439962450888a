"""Side-by-side benchmarks: the journal's storage against SQLite, LMDB and JSONL baselines.

Benchmarks are hard. Every row here runs in one process, on the same machine, in one run,
on the same deterministic 580-byte JSON events, and is reported as a ratio to baselines
measured in that same run, so the numbers compare like with like. Absolute events/s depend
on the disk (what one `fdatasync` costs) far more than on the code; read the ratios.

Run with `python -m benchmarks --help`. Modules:

- `events`: the event data (deterministic JSON-RPC documents of exactly 580 bytes);
- `timing`: per-batch timing and what a measurement holds;
- `baselines`: SQLite (WAL, synchronous=FULL), raw py-lmdb and a JSONL file;
- `project`: the journal's own storage (the segment log);
- `workloads`: the rows, their order and which baseline each is compared with;
- `report`: ratios, the printed table and the JSON results.
"""
