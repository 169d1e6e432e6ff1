"""specdeploy's benchmarks (`make bench`): speed, memory and scale figures, each a ratio against
a baseline measured in the same run, with a 95 % interval and a verdict.

Modules by concern:
- `confidence`: paired-round ratios, their bootstrap interval, met / missed / inconclusive (pure);
- `record`: the machine, the commit and the load during each part, result files;
- `figures`: the figures of the older parts' result files, judged from their paired rounds;
- `serving_watch`: which revisions serve, moment by moment, from a watch on the pods (P3);
- the benchmarks themselves, one module each, run as `python -m bench.<module>` by the Makefile's
  `bench-*` targets; `bench.report` turns bench/results/*.json into bench/results/report.md and
  the table in docs/benchmarks.md.

How a benchmark plugs in:
1. A module `bench/<name>.py` with `main(argv: list[str] | None = None) -> int`, ending in
   `raise SystemExit(main())` under `if __name__ == "__main__"`. It may use the test bed
   (`bench.bed`, the e2e harness on PYTHONPATH) and the engine harness; anything that starts
   real engines should not overlap with other runs that start engines (each engine is pinned
   to a CPU of its own; two sets on one machine measure each other).
2. It measures paired rounds: each round measures the thing and its baseline back to back
   (alternating which goes first), so a round's ratio is `measured / baseline` under the same
   load. Wrap the rounds in `with record.LoadWatch("<part>") as load:`.
3. It turns the rounds into figures with `confidence.judge_paired(name, measured, baseline,
   target, Direction.AT_LEAST or AT_MOST, load=load.peak, load_bound=record.load_bound())`
   (or `confidence.judge` over ratios it computed), and writes
   `record.write_result("<name>", {"what": ..., "figures": [f.to_json() for f in figures],
   "load": {"<part>": load.summary()}, ...its raw rounds...})`.
4. A Makefile target `bench-<name>: ... ## what it measures` running `$(PY) -m bench.<name>`,
   added to `BENCH_PARTS`. The report lists every figure of every result file's `figures` in
   its summary with its rounds, interval, verdict and load; nothing else is needed. A section of
   its own in the report is optional (`bench.report`).
5. Unit tests of its pure parts in tests/ (tests/test_bench_*.py), as for the product.
"""
