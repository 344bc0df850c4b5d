"""The classroom: what a workshop's room shares and pools, above the core and beside the planner.

    sharing.py      wb.share: a run, a comparison or ledger rows sent to the teacher's room
    room_view.py    the teacher's view of what the room measured, by hardware class
    ledger.py       the prediction ledger: each exercise's prediction against the measurement
    fingerprint.py  what kind of machine a result came from (no name, no host)

Needs the `room` extra (trackio) only to share; everything else reads plain records.
"""
