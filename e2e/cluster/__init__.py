"""A local one-node Kubernetes cluster of real processes, for the end-to-end suite.

`LocalCluster(api_url, workdir)` is the kubelet, the Deployment and Job controllers, the
garbage collector of orphaned pods, and the Services of a cluster whose API server is at
`api_url` (the KMock emulator here; any API server works). It runs what the product renders
as real processes on this machine. Test infrastructure only: never shipped in the product.

What is exact: each container runs its `command` + `args` with `$(VAR)` expansion, its `env`
(`valueFrom` Secrets, ConfigMaps, fieldRef, resourceFieldRef; `envFrom`), its `workingDir`
and its volume mounts at the rendered paths; each pod has its own network namespace and
IP, so container ports are the rendered ones; probes, restarts, preStop hooks, grace periods,
rolling updates, Job back-off limits and deadlines follow the documented semantics (see the
module of each part).

Every substitution, in one place:
- Images are not pulled nor run: the command comes from this machine, with the project's
  `.venv/bin` first on PATH (`voxfleet`, whose `voxfleet triton` runs the tritonserver of
  the nvidia-pytriton wheel, and `python`); HOME=/root and LANG=C.UTF-8 stand for the
  image's ENV. A container without `command` cannot run.
- Root filesystem: the host's, shared by all pods (readOnlyRootFilesystem is ignored). Each
  container gets a private mount namespace (`unshare --mount`) in which its volumes are
  mounted at their paths (launcher.py); a missing mount point such as `/engines` is created
  empty on the host and removed when the cluster stops, unless another local cluster runs
  then (removing it would detach that cluster's mounts). `/dev/shm` is the host's unless a
  volume is mounted there (a memory emptyDir is a tmpfs of its sizeLimit). The project and
  its Python stand for the image's files: a volume mounted above them (the operator's
  emptyDir at /tmp over a checkout in /tmp) leaves them in place (`image_paths`).
- Volumes: a PersistentVolumeClaim is a directory per claim under the workdir, shared by all
  pods that mount it, without a PersistentVolumeClaim object (volumes.py). Secret and
  ConfigMap volumes are written when the pod starts and not updated afterwards; an
  emptyDir's sizeLimit is enforced only for memory-backed ones (tmpfs).
- Network: one network namespace per pod (`ip netns`), a veth pair to a bridge per cluster,
  pod IPs 10.213.k.2-254 (k: the cluster's slot), the host at 10.213.k.1 (network.py). Pods
  reach each other by pod IP, and the API server in-cluster at https://kubernetes.default.svc
  (KUBERNETES_SERVICE_HOST/PORT: 10.213.k.1:443, TLS with a CA of the cluster's own, whose
  ca.crt is in the service account mount; forward.py, pki.py). No cluster DNS: each pod's
  /etc/hosts names the pod, `kubernetes` and every Service (its cluster IP 10.214.k.n on the
  bridge, or a headless Service's ready pods), rewritten as Services and pods change; other
  names fail to resolve at once.
- Services: a TCP proxy per Service port with round-robin per connection, on 127.77.k.n for
  the host (`LocalCluster.resolve()` maps Service names to it) and on the cluster IP
  10.214.k.n for pods (services.py). Headless Services resolve to pod IPs. No Endpoints or
  EndpointSlice objects are written (`LocalCluster.endpoints()` lists them) and
  `spec.clusterIP` is not set on Service objects.
- API access: the service account's token is a fixed string (`LocalCluster(token=...)`);
  authentication and RBAC are whatever the API server does (the emulator checks neither).
- Processes: no PID namespace (the container's main process is not PID 1; at its exit the
  rest of its process group is killed), no cgroups: CPU and memory limits are not enforced;
  CPU requests become a CPU set (cpus.py). Containers run as root: runAsUser, runAsGroup,
  fsGroup, capabilities, seccomp and runAsNonRoot are ignored. Each pod has a UTS namespace
  with its name as hostname.
- Scheduling: one node, no scheduler: nodeSelector, tolerations, affinity and extended
  resources (nvidia.com/gpu) are ignored and `spec.nodeName` stays empty.
- Deletion: the kubelet puts the finalizer `e2e.voxfleet.io/local-kubelet` on pods it runs,
  so that the emulator keeps a deleted pod (with deletionTimestamp) until its containers are
  stopped, as a real API server does without a finalizer.
- Controllers: no ReplicaSets (a Deployment owns its pods), restart and Job back-offs are
  shortened (container.py, jobs.py); minReadySeconds, progressDeadlineSeconds, Indexed Jobs,
  pod failure policies, DaemonSets, StatefulSets, HPAs and PodDisruptionBudgets are not
  emulated.
"""

from .cluster import LocalCluster
from .network import PodNetwork
from .services import ServiceProxies

__all__ = ["LocalCluster", "PodNetwork", "ServiceProxies"]
