"""The pod policy of a kubernetes BridgeCluster (``spec.kubernetes.podPolicy``), checked on a plan before its
JobSet is rendered or created. Pure: no client imported here.

What is checked is what the TrainJob and its runtime give: the merged pod templates of every replicated job
(initializers, an MPI launcher, init containers included), the trainer's env and the initializers' Secrets
and ``pvc://`` claims. What hpc-bridge adds itself (the MPI SSH Secret, the hostfile ConfigMap, the volume of
a ``pvc://`` claim, which its URI stands for) is not the tenant's and is added after this check.
"""

from __future__ import annotations

from typing import Any

from bridge.api.cluster import PodPolicy
from bridge.errors import InvalidSpec
from bridge.plan import LaunchPlan

#: volume kinds any pod may use: nothing of the node's or the namespace's
_ALWAYS = frozenset({"emptyDir", "downwardAPI"})
#: volume kinds that name an object of the namespace the pod runs in
_NAMESPACED = frozenset({"secret", "configMap", "persistentVolumeClaim", "projected"})


def check_pod_policy(plan: LaunchPlan, namespace: str, policy: PodPolicy | None) -> None:
    """InvalidSpec naming the first field of *plan*'s pods that *policy* forbids when its JobSet runs in
    *namespace*; None: PodPolicy's defaults."""
    _Check(plan, namespace, policy or PodPolicy()).run()


class _Check:
    def __init__(self, plan: LaunchPlan, namespace: str, policy: PodPolicy) -> None:
        self.plan, self.namespace, self.policy = plan, namespace, policy
        #: the namespace is not the TrainJob's own: other tenants' Secrets, ConfigMaps and claims may be there.
        #: The CLI's user (no tenant) names the namespace its jobs go to: that one is its own
        self.shared = plan.tenant is not None and namespace != plan.namespace

    def refuse(self, where: str, value: Any, what: str, knob: str) -> None:
        raise InvalidSpec(where, value, f"{what}: not allowed by the pod policy of cluster {self.plan.cluster!r} "
                                        f"(spec.kubernetes.podPolicy.{knob})")

    def run(self) -> None:
        source = f"runtime {self.plan.runtime_name} with spec.runtimePatches"
        for job in (self.plan.on_kubernetes().jobset_template or {}).get("replicatedJobs") or []:
            pod = (((job.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec") or {}
            self.pod(pod, f"{source}: replicatedJobs[{job.get('name')}].template.spec.template.spec")
        for entry in self.plan.env:
            self.value_from(entry.value_from or {}, f"spec.trainer.env[{entry.name}].valueFrom")
        for initializer in self.plan.staging.sources if self.plan.staging else ():
            where = f"spec.initializer.{initializer.role}"
            if initializer.secret:
                self.namespaced("secret", f"{where}.secretRef.name", initializer.secret, "a Secret")
            if initializer.uri.lower().startswith("pvc://"):
                self.namespaced("persistentVolumeClaim", f"{where}.storageUri", initializer.uri,
                                "a PersistentVolumeClaim")

    def namespaced(self, kind: str, where: str, value: Any, what: str) -> None:
        """A reference to an object of the namespace the pods run in: the TrainJob's own namespace's are its
        own; another namespace's only where the policy lists the kind."""
        if self.shared and kind not in self.policy.volumes:
            self.refuse(where, value, f"{what} of namespace {self.namespace}, where the JobSet runs for namespace "
                                      f"{self.plan.namespace} (a namespace other tenants' jobs share)", "volumes")

    def pod(self, pod: dict[str, Any], where: str) -> None:
        policy = self.policy
        for field in ("serviceAccountName", "serviceAccount"):
            account = pod.get(field)
            if account not in (None, "", "default") and account not in policy.service_account_names \
                    and "*" not in policy.service_account_names:
                self.refuse(f"{where}.{field}", account, "a ServiceAccount other than the namespace's default",
                            "serviceAccountNames")
        for field, allowed, knob in (("hostNetwork", policy.host_network, "hostNetwork"),
                                     ("hostPID", policy.host_pid, "hostPID"), ("hostIPC", policy.host_ipc, "hostIPC")):
            if pod.get(field) is True and not allowed:
                self.refuse(f"{where}.{field}", True, "the node's namespace", knob)
        self.security(pod.get("securityContext") or {}, f"{where}.securityContext", container=False)
        for volume in pod.get("volumes") or []:
            self.volume(volume, f"{where}.volumes[{volume.get('name')}]")
        for secret in pod.get("imagePullSecrets") or []:
            self.namespaced("secret", f"{where}.imagePullSecrets[{secret.get('name')}]", secret.get("name"),
                            "a Secret")
        for kind in ("initContainers", "containers"):
            for container in pod.get(kind) or []:
                self.container(container, f"{where}.{kind}[{container.get('name')}]")

    def volume(self, volume: dict[str, Any], where: str) -> None:
        kinds = [key for key in volume if key != "name"]
        for kind in kinds:  # one, as the API server admits; each checked where a template says more
            if kind in _ALWAYS:
                continue
            if kind in _NAMESPACED:
                self.namespaced(kind, f"{where}.{kind}", volume[kind], f"a {kind} volume")
            elif kind == "hostPath":
                if "hostPath" not in self.policy.volumes:
                    self.refuse(f"{where}.hostPath", volume[kind], "a directory of the node", "volumes")
            elif "other" not in self.policy.volumes:
                self.refuse(f"{where}.{kind}", volume[kind], f"a {kind} volume", "volumes")

    def container(self, container: dict[str, Any], where: str) -> None:
        policy = self.policy
        security = container.get("securityContext") or {}
        self.security(security, f"{where}.securityContext", container=True)
        added = ((security.get("capabilities") or {}).get("add")) or []
        allowed = {name.upper().removeprefix("CAP_") for name in policy.capabilities}
        for capability in added:
            if "*" not in allowed and str(capability).upper().removeprefix("CAP_") not in allowed:
                self.refuse(f"{where}.securityContext.capabilities.add", capability, "an added capability",
                            "capabilities")
        for port in container.get("ports") or []:
            if port.get("hostPort") and not policy.host_network:
                self.refuse(f"{where}.ports[{port.get('containerPort')}].hostPort", port["hostPort"],
                            "a port of the node", "hostNetwork")
        for entry in container.get("env") or []:
            self.value_from(entry.get("valueFrom") or {}, f"{where}.env[{entry.get('name')}].valueFrom")
        for index, source in enumerate(container.get("envFrom") or []):
            for key, kind, what in (("secretRef", "secret", "a Secret"), ("configMapRef", "configMap", "a ConfigMap")):
                ref = source.get(key) if isinstance(source, dict) else None
                if ref is not None:
                    self.namespaced(kind, f"{where}.envFrom[{index}].{key}.name",
                                    ref.get("name") if isinstance(ref, dict) else ref, what)

    def value_from(self, value_from: Any, where: str) -> None:
        for key, kind, what in (("secretKeyRef", "secret", "a Secret"), ("configMapKeyRef", "configMap", "a ConfigMap")):
            ref = value_from.get(key) if isinstance(value_from, dict) else None
            if ref is not None:
                self.namespaced(kind, f"{where}.{key}.name", ref.get("name") if isinstance(ref, dict) else ref, what)

    def security(self, context: dict[str, Any], where: str, container: bool) -> None:
        policy = self.policy
        if not policy.run_as_root:
            if context.get("runAsUser") == 0:
                self.refuse(f"{where}.runAsUser", 0, "root", "runAsRoot")
            if context.get("runAsNonRoot") is False:
                self.refuse(f"{where}.runAsNonRoot", False, "root allowed", "runAsRoot")
        if not policy.privileged:
            if container and context.get("privileged") is True:
                self.refuse(f"{where}.privileged", True, "a privileged container", "privileged")
            if container and context.get("procMount") not in (None, "Default"):
                self.refuse(f"{where}.procMount", context["procMount"], "an unmasked /proc", "privileged")
            if (context.get("windowsOptions") or {}).get("hostProcess") is True:
                self.refuse(f"{where}.windowsOptions.hostProcess", True, "a Windows host process", "privileged")
        if container and context.get("allowPrivilegeEscalation") is True and not policy.allow_privilege_escalation:
            self.refuse(f"{where}.allowPrivilegeEscalation", True, "privilege escalation", "allowPrivilegeEscalation")
