"""The contract's core, below everything else: argument validation into call records, the
parameter layout, error codes, scratch and result memory, variable lengths, dropout masks, and
the facts of the machine (CPUs, thread counts, memory). No policy and no torch."""
