"""The ``lstmgrad`` command and the work behind it: the demo, benchmarks and workloads, plan
measurements ahead of time, and the check of device results (lstmgrad dumps and msProbe dumps)
against both engines."""
