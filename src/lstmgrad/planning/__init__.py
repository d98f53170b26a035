"""The planner, above the engines: which plan (:class:`lstmgrad.fused.plan.Plan`) a call runs,
from a cost model of its sizes and measurements taken on the machine in use. The engines execute
the plan they are given and import nothing from here; :mod:`lstmgrad.ops.api` is the one caller
of :func:`lstmgrad.planning.plan.plan_for`."""
