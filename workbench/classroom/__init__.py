"""The classroom: a workshop's room and what it keeps. `sharing` sends a learner's run to the
room (`wb.share`) in the `record_format` format, `store` is the teacher's server that keeps them,
`room_view` draws the room's runs side by side; `ledger` and `ledger_file` keep a learner's
predictions and what the runs then showed; `fingerprint` names the machine a record came from.
Nothing on a run's path imports it; it never imports the planner (tests/test_layers.py).
"""
