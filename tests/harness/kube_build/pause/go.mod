// The pod sandbox ("pause") image's only program, for the real-node test cluster: no image can be pulled here.

module hpcbridge.test/kube-build/pause

go 1.26.0
