"""A Fabric executor that runs kiln's cluster tasks once over the whole host list.

Fabric runs a task once per `-H` host; a cluster task needs all hosts at once (to mesh them, to place roles).
The `kiln` command sets it in code (bootstrap.main); `fab` from the repository reads it from fabric.yaml.
"""

import shlex

from fabric.executor import Executor
from invoke.tasks import Call


def is_cluster_task(call) -> bool:
    return getattr(call.task if isinstance(call, Call) else call, "kiln_cluster", False)


class ClusterExecutor(Executor):
    def expand_calls(self, calls, apply_hosts=True):
        if self.core.remainder and any(is_cluster_task(call) for call in calls):
            # `fab ... cluster.train -- CMD`: the command is the task's, not one for Fabric to run on every host.
            # (invoke joined its words with spaces; `kiln` keeps the argv as given.)
            if "kiln_command" not in self.config:
                self.config["kiln_command"] = shlex.split(self.core.remainder)
            self.core.remainder = ""
        expanded = []
        for call in calls:
            if is_cluster_task(call):
                expanded.append(call if isinstance(call, Call) else Call(call))
            else:
                expanded.extend(super().expand_calls([call], apply_hosts=apply_hosts))
        return expanded

    def execute(self, *tasks):
        self.config["kiln_hosts"] = self.core[0].args.hosts.value or ""
        return super().execute(*tasks)
