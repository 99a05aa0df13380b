"""The commands behind `python -m labsupport <command>` (the table is in `labsupport.__main__`).

    ledger      the lecture's numbers recomputed for any model and GPU, with errata   (cli/ledger.py)
    simulate    a real trace replayed through the engine on the cost-model clock     (cli/simulate.py)
    doctor      what this machine can run                                            (cli/doctor.py)
    train_tiny  retrain the tiny lecture model: python -m labsupport.cli.train_tiny  (cli/train_tiny.py)

`build` and `grade` live with the rest of the course tooling in `labsupport.course`; `bench` in
`labsupport.bench`.  Every command parses with `labsupport.cli.parser.OneLineParser`: a bad flag is
one line and exit code 2.
"""
