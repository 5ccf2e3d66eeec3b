"""A local Kubernetes cluster for the end-to-end suite: the real control plane and one real
node on this machine. Test infrastructure only.

`LocalCluster(workdir)` (cluster.py) starts:
- the control plane (controlplane.py): etcd, kube-apiserver, kube-controller-manager and
  kube-scheduler, built by `make setup` from their Go modules, with certificates made for the
  run (pki.py), RBAC and Node authorization;
- the node (node.py): containerd and runc (Debian's) with the CNI bridge plugins, the kubelet
  and kube-proxy (iptables mode), built from the same Kubernetes release; the images
  `make images` builds are imported into containerd (images.py) and pods run them with
  `imagePullPolicy: IfNotPresent`;
- cluster DNS (dns.py): CoreDNS, built from its Go module, as a Deployment behind `kube-dns`;
- a claims provisioner (provisioner.py): a hostPath PersistentVolume per claim.

Everything a pod meets is Kubernetes' own: images, cgroups (CPU shares and quotas, memory
limits and the OOM killer), users and capabilities, read-only root filesystems, volumes
(Secrets, ConfigMaps, projected tokens, emptyDirs), probes, restarts, `kubectl logs`, `exec`
and `port-forward`, Services through kube-proxy's iptables rules, names through cluster DNS.

What is not a cluster's: one node (the machine's 2 CPUs and its memory, as the kubelet
measures them), no image registry (images are imported, never pulled), storage is hostPath
directories on this machine, pod traffic never leaves it (no masquerade), and no device
plugins (nvidia.com/gpu is not advertised, so a GPU pool's pods stay Pending).
Host changes and their cleanup: leftovers.py.
"""

from .cluster import LocalCluster
from .controlplane import ControlPlane
from .node import Node, NodeError
from .processes import ControlPlaneError

__all__ = ["ControlPlane", "ControlPlaneError", "LocalCluster", "Node", "NodeError"]
