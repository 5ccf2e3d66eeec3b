"""Storage for claims: a hostPath PersistentVolume per claim, as a cluster's provisioner makes.

For every PersistentVolumeClaim that is Pending, names no volume and asks for no storage
class (the chart's engine cache, the suite's voices claim), it creates a PersistentVolume
pre-bound to the claim (`claimRef`) whose hostPath is a directory of the run,
`<workdir>/claims/<namespace>/<claim>` (mode 0777), with the claim's access modes and size; the
controller manager's PersistentVolume binder binds the two, and the scheduler then places
the claim's pods (it holds back a pod whose claim is unbound). When a claim is deleted its
volume is Released; the provisioner deletes it (reclaim policy Delete, as its annotation
`pv.kubernetes.io/provisioned-by` says) and leaves the directory to the run's cleanup.

It runs as `system:voxfleet-e2e-provisioner`, bound to the bootstrap ClusterRole
`system:persistent-volume-provisioner`. Capacity and access modes are not enforced.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from .kube import ApiError, Informer, Kube

Obj = dict[str, Any]
log = logging.getLogger("cluster.provisioner")
PROVISIONER = "voxfleet.io/e2e-hostpath"
USER = "system:voxfleet-e2e-provisioner"
CLUSTER_ROLE = "system:persistent-volume-provisioner"


def volume_for(claim: Obj, directory: Path) -> Obj:
    meta, spec = claim["metadata"], claim.get("spec") or {}
    size = ((spec.get("resources") or {}).get("requests") or {}).get("storage", "1Gi")
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": f"pvc-{meta['uid']}",
            "annotations": {"pv.kubernetes.io/provisioned-by": PROVISIONER},
        },
        "spec": {
            "capacity": {"storage": size},
            "accessModes": list(spec.get("accessModes") or ["ReadWriteOnce"]),
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": "",
            "hostPath": {"path": str(directory), "type": "DirectoryOrCreate"},
            "claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": meta["namespace"],
                "name": meta["name"],
                "uid": meta["uid"],
            },
        },
    }


class Provisioner:
    def __init__(self, kube: Kube, claims: Informer, volumes: Informer, workdir: Path) -> None:
        self.kube = kube
        self.claims = claims
        self.volumes = volumes
        self.workdir = workdir

    async def sync(self) -> None:
        made = {v["metadata"]["name"] for v in self.volumes.items()}
        for claim in self.claims.items():
            meta, spec = claim["metadata"], claim.get("spec") or {}
            if (
                spec.get("volumeName")
                or spec.get("storageClassName")
                or (claim.get("status") or {}).get("phase") not in (None, "Pending")
                or meta.get("deletionTimestamp")
                or f"pvc-{meta['uid']}" in made
            ):
                continue
            directory = self.workdir / "claims" / meta["namespace"] / meta["name"]
            directory.mkdir(parents=True, exist_ok=True)
            # Writable by the pods' unprivileged users: a hostPath volume is not chowned to
            # the pod's fsGroup, as local provisioners leave it.
            directory.chmod(0o777)
            try:
                await self.kube.create("PersistentVolume", None, volume_for(claim, directory))
            except ApiError as error:
                if error.status != 409:
                    log.warning(
                        "volume for claim %s/%s: %s", meta["namespace"], meta["name"], error
                    )
        for volume in self.volumes.items():
            annotations = volume["metadata"].get("annotations") or {}
            if (
                annotations.get("pv.kubernetes.io/provisioned-by") == PROVISIONER
                and (volume.get("status") or {}).get("phase") == "Released"
                and not volume["metadata"].get("deletionTimestamp")
            ):
                await self.kube.delete("PersistentVolume", None, volume["metadata"]["name"])
