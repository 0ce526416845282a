"""A Fabric executor that runs `cluster.*` tasks once over the whole host list.

Fabric runs a task once per `-H` host; a cluster task needs all hosts at once
(to mesh them, to place roles). Selected in fabric.yaml (`tasks.executor_class`).
"""

from fabric.executor import Executor
from invoke.tasks import Call


class ClusterExecutor(Executor):
    def expand_calls(self, calls, apply_hosts=True):
        expanded = []
        for call in calls:
            task = call.task if isinstance(call, Call) else call
            if getattr(task, "kiln_cluster", False):
                expanded.append(call if isinstance(call, Call) else Call(task))
            else:
                expanded.extend(super().expand_calls([call], apply_hosts=apply_hosts))
        return expanded

    def execute(self, *tasks):
        self.config["kiln_hosts"] = self.core[0].args.hosts.value or ""
        return super().execute(*tasks)
