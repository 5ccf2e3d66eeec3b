"""A local Kubernetes cluster for the end-to-end suite: the real control plane, and a node
agent of ours that runs pods as processes on this machine. Test infrastructure only.

`LocalCluster(workdir)` (cluster.py) starts:
- the control plane (controlplane.py): etcd, kube-apiserver, kube-controller-manager and
  kube-scheduler, built by `make setup` from their Go modules, on loopback, with
  certificates made for the run (pki.py), RBAC and Node authorization;
- the node agent (nodeagent.py), in the manner of virtual-kubelet: it registers Node objects
  (`local-node-0`, `local-node-1` by default) with the capacity they are configured to
  advertise, renews their Leases, and runs the pods the scheduler binds to them;
- the Service proxy (services.py), which follows Services and EndpointSlices as kube-proxy;
- a claims provisioner (provisioner.py): a hostPath PersistentVolume per claim.

Real: every API object and its validation, defaulting, admission and RBAC; Deployments,
ReplicaSets, Jobs, garbage collection, the HPA, EndpointSlices, namespaces, service
accounts and their tokens (the controllers of kube-controller-manager); scheduling (the
scheduler, by the nodes' allocatable resources, selectors and taints); Helm's release
Secrets. The node agent itself follows the kubelet's documented behaviour for what it does:
each container runs its `command` + `args` with `$(VAR)` expansion, its `env` (`valueFrom`
Secrets, ConfigMaps, fieldRef, resourceFieldRef; `envFrom`), its `workingDir` and its
volume mounts at the rendered paths; each pod has its own network namespace and IP;
probes, restarts (with back-off), preStop hooks and grace periods follow the kubelet's
semantics; pod status (phase, conditions, podIP, container states) is written to the API;
a deleted pod is stopped and then finished with the final zero-grace delete.

What the node agent does not do that a kubelet does, and every substitution, in one place:
- Images are not pulled nor run: the command comes from this machine, with the project's
  `.venv/bin` first on PATH (`voxfleet`, whose `voxfleet triton` runs the tritonserver of
  the nvidia-pytriton wheel, and `python`); HOME=/root and LANG=C.UTF-8 stand for the
  image's ENV. A container without `command` cannot run (CreateContainerConfigError).
- Root filesystem: the host's, shared by all pods (readOnlyRootFilesystem is ignored). Each
  container gets a private mount namespace (`unshare --mount`) in which its volumes are
  mounted at their paths (launcher.py); a missing mount point such as `/engines` is created
  empty on the host and removed when the cluster stops, unless another local cluster runs
  then. `/dev/shm` is the host's unless a volume is mounted there. The project and its
  Python stand for the image's files: a volume mounted above them (the operator's emptyDir
  at /tmp over a checkout in /tmp) leaves them in place (`image_paths`).
- Volumes (volumes.py): Secret and ConfigMap volumes are written when the pod starts and
  not updated afterwards; projected service-account tokens come from the TokenRequest API
  when the pod starts and are not refreshed; an emptyDir's sizeLimit is enforced only for
  memory-backed ones (tmpfs); claims are hostPath directories (provisioner.py).
- Network: one network namespace per pod (`ip netns`), a veth pair to a bridge per cluster,
  pod IPs 10.213.k.2-254 (k: the cluster's slot), the host at 10.213.k.1 (network.py), the
  nodes all on this one host. Pods reach each other by pod IP, Services by cluster IP
  (10.214.k.0/24, through the Service proxy on the host), and the API server through the
  `kubernetes` Service, whose endpoint is the host's bridge address, forwarded to the API
  server's loopback port. No cluster DNS: each pod's /etc/hosts names the pod and every
  Service, rewritten as Services change; other names fail to resolve at once. No Service
  environment variables other than KUBERNETES_SERVICE_* (enableServiceLinks is ignored).
- Processes: no PID namespace (the container's main process is not PID 1; at its exit the
  rest of its process group is killed), no cgroups: CPU and memory limits are not enforced,
  and no eviction happens under pressure (the node conditions are reported False, not
  measured); CPU requests become a CPU set (cpus.py). Containers run as root: runAsUser,
  runAsGroup, fsGroup, capabilities, seccomp and runAsNonRoot are ignored. Each pod has a
  UTS namespace with its name as hostname. Restart back-off is shortened (container.py).
- Not served: `kubectl logs`, `exec`, `port-forward` and `attach` (the API server cannot
  reach the node agent: read `LocalCluster.logs()` and reach pods by their IP), the
  kubelet's own metrics and the resource metrics API, ephemeral containers, static pods,
  node-pressure eviction, image garbage collection, device plugins (nvidia.com/gpu is not
  advertised, so a GPU pool's pods stay Pending), gRPC probes, and Events.
"""

from .cluster import LocalCluster
from .controlplane import ControlPlane
from .nodeagent import NodeSpec
from .processes import ControlPlaneError

__all__ = ["ControlPlane", "ControlPlaneError", "LocalCluster", "NodeSpec"]
