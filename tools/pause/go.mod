// The pod sandbox's process for the e2e node (e2e/cluster/images.py): no dependencies.

module voxfleet.io/tools/pause

go 1.26.0
