"""The commands behind `python -m labsupport <command>` (the table is in `labsupport.__main__`).

    ledger      the lecture's numbers recomputed for any model and GPU, with errata   (cli/ledger.py)
    simulate    a real trace replayed through the engine on the cost-model clock     (cli/simulate.py)
    doctor      what this machine can run                                            (cli/doctor.py)
    generate    SmolLM2-135M's reply streamed through the Engine and PagedKVCache    (cli/generate.py)
    traces      fetch the real public traces into data/, sha256-verified; --list     (cli/traces.py)
    train_tiny  retrain the tiny lecture model: python -m labsupport.cli.train_tiny  (cli/train_tiny.py)

`build` and `grade` live with the rest of the course tooling in `labsupport.course`; `bench` in
`labsupport.bench`.  Every command parses with `labsupport.cli.parser.OneLineParser` and its ranged
flag types, and runs under `run_command`: bad input is one line naming the flag (or file:line) and
the value, exit code 2; `--json` is strict JSON, an undefined number null with a note saying why.
"""
