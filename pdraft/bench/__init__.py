"""Benchmarking and monitoring (the metrics themselves are defined once, in the leaf module pdraft.metrics):
`sweep` sweeps gamma over prompt sets (target alone, n-gram baseline, drafters), `report` and `plots` turn a sweep
into bench.json, tables and figures, `stream` writes and follows the metrics stream, `monitor` judges a sliding
window of it against the healthy ranges and exports it to Prometheus."""
