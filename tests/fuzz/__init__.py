"""Hostile-input fuzzing for hpc-bridge (issue #24): no value ever becomes a command or a directive, no input
crashes or exhausts hpc-bridge.

* ``generator``: a seeded, deterministic catalogue of hostile and malformed inputs (``generate``) — every field
  that reaches an artifact × shell/sbatch payloads, YAML bombs, wrong types, huge numbers, binary files, batch
  scripts with broken, smuggled and privileged directives, hostile cluster configs;
* ``oracles``: runs each input through every CLI command (a forked in-process ``bridge.cli.main`` or the real
  ``python -m bridge``, both under RLIMIT_AS/RLIMIT_CPU) and judges the result: exit code, traceback, one-line
  error, the bound, rendered scripts executed under ``bash -x`` against stubs, the ``#SBATCH`` block against
  what the renderer meant, and Kubernetes objects against the real API server (dry-run).

Used by ``tests/integration/test_fuzz_hostile_input.py`` (a fast deterministic subset) and
``bench/fuzz_hostile.py`` (the full run, with counts).
"""
