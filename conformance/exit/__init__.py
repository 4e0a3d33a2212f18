"""The exit clause: a program that used the loader ends cleanly.

What a training script meets when it ends, judged from outside a fresh
interpreter (the scenario runner: own session, private `TMPDIR`), the way
pytorch#72269's test asserts `stderr == b''`. Reusable in your own tests as
`pytest_workerstart.harness.clean_exit.run_clean_exit` (see [Fixtures](fixtures.md)).
"""
